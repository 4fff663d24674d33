"""A capability probe (the project's own code, not upstream's): it notes
in its user data folder that it ran, then runs the programs the
arguments name and reports what they printed."""

import json
import os
import shutil
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
print(json.dumps({"ok": True, "entries": runs, "path": os.environ.get("PATH", "")}))
