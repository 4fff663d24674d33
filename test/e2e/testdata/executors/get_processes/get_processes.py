"""A capability probe (the project's own code, not upstream's): it notes
in its user data folder that it ran, runs the programs the arguments
name and reports what they printed; with "find" it looks a process up
by its argv in `ps -eo pid,args` and tries to read its environment and
stop it; with "ifaces" it lists the network interfaces."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

args = json.loads(sys.stdin.read() or "{}")
data = os.environ.get("METNOS_USER_DATA", "")
try:
    # The cache folder is NAME-<sha16>.
    name = os.path.basename(os.path.dirname(os.path.abspath(__file__))).rsplit("-", 1)[0]
    with open(os.path.join(data, "ran-" + name), "w") as f:
        f.write("ran")
except OSError:
    pass
runs = []
for argv in args.get("run", []):
    where = shutil.which(argv[0])
    if where is None:
        runs.append({"argv": argv, "error": "not on PATH " + os.environ.get("PATH", "")})
        continue
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    runs.append({"argv": argv, "which": where, "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr})
out = {"ok": True, "entries": runs, "path": os.environ.get("PATH", "")}

# "find": an argv to look for in `ps -eo pid,args`, as get_processes
# does; then what a process list must not give: that process's
# environment, and a signal to it.
want = " ".join(args.get("find", []))
if want:
    p = subprocess.run(["ps", "-eo", "pid,args"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    out["ps"] = {"rc": p.returncode, "lines": len(p.stdout.splitlines()), "stderr": p.stderr}
    pids = [int(l.split(None, 1)[0]) for l in p.stdout.splitlines()[1:] if l.split(None, 1)[1:] == [want]]
    out["found"] = pids
    for pid in pids:
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                out["environ"] = f.read().decode("utf-8", "replace")
        except OSError as e:
            out["environ_error"] = "%s: %s" % (type(e).__name__, e)
        try:
            os.kill(pid, signal.SIGSTOP)
            out["stop"] = "sent"
        except OSError as e:
            out["stop_error"] = "%s: %s" % (type(e).__name__, e)
if args.get("ifaces"):
    try:
        out["ifaces"] = [[i, n] for i, n in socket.if_nameindex()]
    except OSError as e:
        out["ifaces_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
