"""Record the result rows of the upstream Metnos file executors.

Run from a checkout of github.com/brunialti/metnos (the files it needs:
runtime/ and executors/), as

    python3 record.py <metnos checkout> <this folder>

Each scenario lays out a folder, runs one upstream executor on it with
the environment the Metnos runtime gives executors (METNOS_HISTORY_DIR,
METNOS_TURN_ID), and writes <scenario>.json: the manifest's reverse
patterns, the files before and after (content, mode, mtime), the backup
blobs, and the executor's output, every path under the scratch folder
written as @ROOT@. The Go tests lay out "after" and "blobs", journal
"result" and undo it locally: the folder must be "before" again.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

T0 = 1_600_000_000_000_000_000  # the files' mtime before the run, in ns

SCENARIOS = {
    "write_files": ("write_files", {
        "d/old.txt": ("the old text\n", 0o640),
        "d/same.txt": ("kept\n", 0o644),
    }, lambda r: {"files": [
        {"path": r + "/d/old.txt", "content": "new text\n"},
        {"path": r + "/d/new/deeper/made.txt", "content": "made\n"},
        {"path": r + "/d/same.txt", "content": "not written", "mode": "skip_if_exists"},
    ]}),
    "move_files": ("move_files", {
        "d/a.jpg": ("photo a\n", 0o644),
        "d/b.jpg": ("photo b\n", 0o600),
        "d/sorted/b.jpg": ("an older b\n", 0o640),
    }, lambda r: {"entries": [{"src": r + "/d/a.jpg"}], "dst_template": r + "/d/2024/05/{name}", "parents": True}),
    "move_files_overwrite": ("move_files", {
        "d/b.jpg": ("photo b\n", 0o600),
        "d/sorted/b.jpg": ("an older b\n", 0o640),
    }, lambda r: {"entries": [{"src": r + "/d/b.jpg"}], "dst_template": r + "/d/sorted/{name}", "overwrite": True}),
    "create_dirs": ("create_dirs", {
        "d/keep.txt": ("keep\n", 0o644),
    }, lambda r: {"paths": [r + "/d/2024", r + "/d/2025", r + "/d/2025/01"]}),
    "delete_files": ("delete_files", {
        "d/gone.txt": ("about to go\n", 0o604),
        "d/also.bin": ("\x00\x01binary\xff", 0o640),
    }, lambda r: {"paths": [r + "/d/gone.txt", r + "/d/also.bin"]}),
    "delete_dirs": ("delete_dirs", {
        "d/keep.txt": ("keep\n", 0o644),
    }, lambda r: {"paths": [r + "/d/empty"]}),
}


def snapshot(root, under):
    out = {}
    base = os.path.join(root, under)
    for dirpath, dirs, files in os.walk(base):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if os.path.isdir(p):
                out[rel] = {"dir": True, "mode": st.st_mode & 0o7777}
            else:
                with open(p, "rb") as f:
                    out[rel] = {"b64": base64.b64encode(f.read()).decode(), "mode": st.st_mode & 0o7777,
                                "mtime_ns": st.st_mtime_ns}
    return out


def main(metnos, out_dir):
    for scenario, (executor, files, args) in SCENARIOS.items():
        root = tempfile.mkdtemp(prefix="metnos-record-")
        os.makedirs(os.path.join(root, "d", "empty"))
        for rel, (content, mode) in files.items():
            p = os.path.join(root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(content.encode("latin-1"))
            os.chmod(p, mode)
            os.utime(p, ns=(T0, T0))
        before = snapshot(root, "d")
        env = dict(os.environ, METNOS_HISTORY_DIR=os.path.join(root, "hist"), METNOS_TURN_ID="turn-rec", HOME=root)
        run = subprocess.run([sys.executable, os.path.join(metnos, "executors", executor, executor + ".py")],
                             input=json.dumps(args(root)).encode(), capture_output=True, env=env, check=True)
        result = json.loads(run.stdout)
        reverse = []
        with open(os.path.join(metnos, "executors", executor, "manifest.toml"), "rb") as f:
            if tomllib:
                reverse = tomllib.load(f).get("reverse_pattern", [])
        if isinstance(reverse, str):
            reverse = [reverse]
        rec = {"executor": executor, "reverse_patterns": reverse, "args": args(root), "before": before,
               "after": snapshot(root, "d"), "blobs": snapshot(root, "hist") if os.path.isdir(os.path.join(root, "hist")) else {},
               "result": result}
        text = json.dumps(rec, indent=1, sort_keys=True).replace(root, "@ROOT@")
        with open(os.path.join(out_dir, scenario + ".json"), "w") as f:
            f.write(text + "\n")
        shutil.rmtree(root)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
