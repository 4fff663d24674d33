import json, subprocess, sys

args = json.loads(sys.stdin.read() or "{}")
grab = "b = b'x' * (%d << 20)" % args.get("mib", 1024)
if args.get("in_child", True):
    # A child allocates; the limit kills it, and the executor goes on.
    child = subprocess.run([sys.executable, "-c", grab]).returncode
else:
    exec(grab)
    child = 0
rows = [{"path": "/work/row-%d" % i, "created": True} for i in range(args.get("rows", 36))]
print(json.dumps({"ok": True, "entries": rows, "child_exit": child}))
