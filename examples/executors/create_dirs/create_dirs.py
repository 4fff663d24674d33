"""create_dirs: create folders.

args:   {"paths": ["/abs/dir", ...], "parents": true, "exist_ok": true}
result: {"ok": no failures, "ok_count", "fail_count",
         "results": [{"path", "created": true|false, "mode_octal"}],
         "failed": [{"index", "path", "error"}]}
        created is false for a folder that was already there. With
        parents (the default), the missing parents are made too, and
        only the folder named is reported, as the upstream Metnos
        create_dirs does: its reverse pattern, delete_created_paths,
        removes each created folder when it is empty.
"""

import os
import stat

import executor_helpers as h


def main(args):
    paths = h.path_list(args, "paths")
    parents = bool(args.get("parents", True))
    exist_ok = bool(args.get("exist_ok", True))

    results, failed = [], []
    for i, p in enumerate(paths):
        try:
            existed = os.path.lexists(p)
            if existed and (os.path.islink(p) or not os.path.isdir(p)):
                raise FileExistsError("exists and is not a folder: %s" % p)
            if existed and not exist_ok:
                raise FileExistsError("exists: %s" % p)
            if not existed:
                if parents:
                    h.make_dirs(p)
                else:
                    os.mkdir(p)
                h.fsync_dir(os.path.dirname(p))
            row = {"path": p, "created": not existed}
            row["mode_octal"] = oct(stat.S_IMODE(os.stat(p).st_mode))
            results.append(row)
        except Exception as exc:
            failed.append({"index": i, "path": p, "error": "%s: %s" % (type(exc).__name__, exc)})

    return {
        "ok": not failed,
        "ok_count": len(results),
        "fail_count": len(failed),
        "results": results,
        "failed": failed,
    }


if __name__ == "__main__":
    h.run_stdio(main)
