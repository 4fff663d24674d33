import json, sys, time

args = json.loads(sys.stdin.read() or "{}")
time.sleep(float(args.get("seconds", 1)))
print(json.dumps({"ok": True, "entries": [{"slept": args.get("seconds", 1)}]}))
