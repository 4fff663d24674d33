"""list_folder: the entries of one folder.

args:   {"path": "/abs/dir", "pattern": "*"}   (pattern optional, fnmatch)
result: {"ok": true, "path": ..., "ok_count": N,
         "entries": [{"name", "path", "kind": "file"|"dir"|"other", "size"}]}
"""

import fnmatch
import os

import executor_helpers as h


def kind_of(entry):
    """file, dir or other (symlinks are followed, broken ones are other)."""
    try:
        if entry.is_dir():
            return "dir"
        if entry.is_file():
            return "file"
    except OSError:
        pass
    return "other"


def main(args):
    path = h.abs_path(args.get("path"), "path")
    pattern = args.get("pattern", "*")
    if not isinstance(pattern, str) or not pattern:
        raise h.ArgError("pattern must be a non-empty string")
    if not os.path.exists(path):
        return {"ok": False, "error": "no such folder: %s" % path,
                "error_class": "not_found", "path": path}
    if not os.path.isdir(path):
        return {"ok": False, "error": "not a folder: %s" % path,
                "error_class": "not_a_folder", "path": path}

    entries = []
    with os.scandir(path) as it:
        for e in it:
            if not fnmatch.fnmatch(e.name, pattern):
                continue
            kind = kind_of(e)
            size = 0
            if kind == "file":
                try:
                    size = e.stat().st_size
                except OSError:
                    pass
            entries.append({"name": e.name, "path": e.path, "kind": kind, "size": size})
    entries.sort(key=lambda r: r["name"])
    return {"ok": True, "path": path, "entries": entries, "ok_count": len(entries)}


if __name__ == "__main__":
    h.run_stdio(main)
