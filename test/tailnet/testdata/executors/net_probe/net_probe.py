import json, os, socket, sys

# Each address is tried as the executor's network allows: through the
# agent's egress proxy (a CONNECT) when the run has one, else directly.
args = json.loads(sys.stdin.read() or "{}")
proxy = os.environ.get("HTTPS_PROXY", "")
out = {}
for addr in args.get("addrs", []):
    host, port = addr.rsplit(":", 1)
    try:
        if proxy:
            ph, pp = proxy.split("//", 1)[-1].rstrip("/").rsplit(":", 1)
            s = socket.create_connection((ph, int(pp)), timeout=5)
            s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (addr, addr)).encode())
            status = s.recv(200).split(b"\r\n", 1)[0].decode()
            s.close()
            out[addr] = "reached" if " 200 " in status + " " else "refused: " + status
        else:
            socket.create_connection((host, int(port)), timeout=3).close()
            out[addr] = "reached"
    except OSError as e:
        out[addr] = "error: %s" % e
print(json.dumps({"ok": True, "probes": out}))
