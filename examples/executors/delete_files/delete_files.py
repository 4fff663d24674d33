"""delete_files: delete files, a backup blob of each kept first.

args:   {"paths": ["/abs/file", ...]}
result: {"ok": no failures, "ok_count", "fail_count",
         "results": [{"path", "removed": true, "blob_path", "blob_sha256",
                      "restore_mode": "create", "mode", "mtime_ns",
                      "atime_ns", "size"}],
         "failed": [{"index", "path", "error"}]}
The undo (restore_blob_backup) copies each blob_path back to its path.
Only regular files are deleted: folders and symbolic links are failures.
"""

import os

import executor_helpers as h


def main(args):
    paths = h.path_list(args, "paths")
    results, failed = [], []
    for i, p in enumerate(paths):
        try:
            if os.path.islink(p):
                raise ValueError("symbolic link, not deleted: %s" % p)
            if not os.path.lexists(p):
                raise FileNotFoundError("no such file: %s" % p)
            if not os.path.isfile(p):
                raise IsADirectoryError("not a file: %s" % p)
            row = {"path": p, "removed": True, "restore_mode": "create"}
            row.update(h.backup_blob(p))  # the bytes are safe before the unlink
            os.unlink(p)
            h.fsync_dir(os.path.dirname(p))
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
