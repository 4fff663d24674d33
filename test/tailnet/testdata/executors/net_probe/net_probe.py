import json, socket, sys

args = json.loads(sys.stdin.read() or "{}")
out = {}
for addr in args.get("addrs", []):
    host, port = addr.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        out[addr] = "reached"
    except OSError as e:
        out[addr] = "error: %s" % e
print(json.dumps({"ok": True, "probes": out}))
