"""delete_dirs: remove empty folders.

args:   {"paths": ["/abs/dir", ...]}
        Folders are removed deepest first (a stable sort by depth), so a
        parent listed before its child still goes once the child is gone.
result: {"ok": no failures, "ok_count", "fail_count", "skipped",
         "results": [{"path", "removed": true}],
         "failed": [{"index", "path", "error"}]}
        A missing folder is skipped (counted in "skipped"); one that is not
        empty, or not a folder, is a failure. Nothing but rmdir is used, so
        no file is ever deleted.
"""

import os

import executor_helpers as h


def depth(p):
    return len([part for part in p.replace("\\", "/").split("/") if part])


def main(args):
    paths = h.path_list(args, "paths")
    order = sorted(range(len(paths)), key=lambda i: -depth(paths[i]))

    results, failed, skipped = [], [], 0
    for i in order:
        p = paths[i]
        try:
            if not os.path.lexists(p):
                skipped += 1
                continue
            if os.path.islink(p) or not os.path.isdir(p):
                raise NotADirectoryError("not a folder: %s" % p)
            os.rmdir(p)  # fails unless empty
            h.fsync_dir(os.path.dirname(p))
            results.append({"path": p, "removed": True})
        except OSError as exc:
            msg = "%s: %s" % (type(exc).__name__, exc)
            if os.path.isdir(p) and os.listdir(p):
                msg = "not empty: %s" % p
            failed.append({"index": i, "path": p, "error": msg})

    return {
        "ok": not failed,
        "ok_count": len(results),
        "fail_count": len(failed),
        "skipped": skipped,
        "results": results,
        "failed": failed,
    }


if __name__ == "__main__":
    h.run_stdio(main)
