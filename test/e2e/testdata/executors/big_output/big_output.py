import json, sys

args = json.loads(sys.stdin.read() or "{}")
n = args.get("bytes", 5 << 20)
print(json.dumps({"ok": True, "entries": ["x" * 1000] * (n // 1000)}))
