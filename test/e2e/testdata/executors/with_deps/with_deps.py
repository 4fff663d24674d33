import json, os, sys, time

args = json.loads(sys.stdin.read() or "{}")
folder = args["folder"]
with open(os.path.join(folder, "ran.log"), "a") as f:
    f.write(args.get("tag", "?") + "\n")
    f.flush()
    os.fsync(f.fileno())
# Tell the test the effect happened, then linger so it can kill the agent.
open(os.path.join(folder, "started-" + args.get("tag", "x")), "w").close()
time.sleep(args.get("sleep_ms", 0) / 1000)
print(json.dumps({"ok": True, "entries": [{"tag": args.get("tag")}], "ok_count": 1}))
