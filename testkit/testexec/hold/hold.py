import hashlib, json, os, sys, time

args = json.loads(sys.stdin.read() or "{}")
folder, tag = args["folder"], args.get("tag", "x")
saw = sorted(os.listdir(folder))
open(os.path.join(folder, "started-" + tag), "w").close()
wait_for = args.get("wait_for")
if wait_for:
    # Waits for the test, never for a clock: the deadline ends it else.
    # With burn, it hashes while it waits: CPU-bound, as a hash of a
    # disk for duplicates.
    h, block = hashlib.sha256(), os.urandom(1 << 20)
    while not os.path.exists(os.path.join(folder, wait_for)):
        if args.get("burn"):
            for _ in range(16):
                h.update(block)
        else:
            time.sleep(0.02)
open(os.path.join(folder, "done-" + tag), "w").close()
print(json.dumps({"ok": True, "entries": [{"tag": tag, "saw": saw}]}))
