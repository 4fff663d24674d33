import json, os, subprocess, sys, time

args = json.loads(sys.stdin.read() or "{}")
folder = args["folder"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
grand = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(3600)"], start_new_session=True)
with open(os.path.join(folder, "pids"), "w") as f:
    f.write("%d %d %d\n" % (os.getpid(), child.pid, grand.pid))
time.sleep(3600)
