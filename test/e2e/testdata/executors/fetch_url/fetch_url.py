import json, socket, sys, urllib.error, urllib.parse, urllib.request

args = json.loads(sys.stdin.read() or "{}")
entries = []
for url in args.get("urls", []):
    e = {"url": url}
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            e["status"] = r.status
            e["body"] = r.read(200).decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        e["status"] = err.code
        e["error"] = err.read(300).decode("utf-8", "replace")
    except OSError as err:
        e["error"] = str(err)
    if args.get("direct"):
        u = urllib.parse.urlsplit(url)
        try:
            socket.create_connection((u.hostname, u.port or 80), timeout=5).close()
            e["direct"] = "connected"
        except OSError as err:
            e["direct"] = "error: %s" % err
    entries.append(e)
print(json.dumps({"ok": True, "entries": entries}))
