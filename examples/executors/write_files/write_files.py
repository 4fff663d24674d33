"""write_files: write files, keeping the old bytes of a file written over.

args:
  files     [{"path", "content", "encoding"?, "mode"?}, ...]
  encoding  default for the files: "utf-8" (content is text) or "binary"
            (content is base64)
  mode      default for the files: "overwrite" (the default), "append",
            "skip_if_exists" (an existing file is left as it is) or
            "fail_if_exists"
  client    "local" (the only one this executor serves)

result: {"ok": no failures, "ok_count", "fail_count", "created_count",
         "skipped_count", "failed": [{"index", "path", "error"}],
         "results": [one row per file written or skipped:
             new file:      {"path", "created": true, ...}
             written over:  {"path", "created": false, "prev_blob_path", ...}
             skipped:       {"path", "created": false, "skipped": true, ...}],
         "dirs_created": [parent folders made, shallowest first, as upstream]}
The rows are those of the upstream Metnos write_files: its reverse
patterns (restore_blob_backup, delete_created_paths) put a file written
over back from its blob and remove the files and folders it made.
"""

import base64
import binascii
import os

import executor_helpers as h

MODES = ("overwrite", "append", "skip_if_exists", "fail_if_exists")


def write_one(path, content, encoding, mode, dirs_created):
    """Write one file; return its result row."""
    if mode not in MODES:
        raise h.ArgError("mode must be one of %s, not %r" % (", ".join(MODES), mode))
    if encoding == "binary":
        try:
            data = base64.b64decode(content, validate=True)
        except (TypeError, binascii.Error) as exc:
            raise h.ArgError("content is not base64: %s" % exc)
    else:
        if not isinstance(content, str):
            raise h.ArgError("content must be a string")
        data = content.encode(encoding)
    existed = os.path.lexists(path)
    if existed and (os.path.islink(path) or not os.path.isfile(path)):
        raise FileExistsError("not a regular file, not written: %s" % path)
    if existed and mode == "fail_if_exists":
        raise FileExistsError("exists: %s" % path)
    if existed and mode == "skip_if_exists":
        return {"path": path, "created": False, "skipped": True, "bytes_written": 0, "encoding": encoding, "mode": mode}
    prev_blob_path = h.backup_file_for_undo(path) if existed else None  # before anything changes
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        dirs_created.extend(h.make_dirs(parent))
    with open(path, "ab" if mode == "append" else "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    h.fsync_dir(parent)
    row = {"path": path, "created": not existed, "bytes_written": len(data), "encoding": encoding, "mode": mode}
    if prev_blob_path:
        row["prev_blob_path"] = prev_blob_path
    return row


def main(args):
    files = args.get("files")
    if not isinstance(files, list):
        raise h.ArgError("files must be a list of {path, content} objects")
    client = args.get("client", "local")
    if client != "local":
        raise h.ArgError("only client \"local\" is served here, not %r" % (client,))
    encoding = args.get("encoding", "utf-8")
    mode = args.get("mode", "overwrite")

    results, failed, dirs_created = [], [], []
    for i, f in enumerate(files):
        path = f.get("path") if isinstance(f, dict) else None
        try:
            if not isinstance(f, dict):
                raise h.ArgError("entry is not an object")
            path = h.abs_path(path, "path")
            results.append(write_one(path, f.get("content", ""), f.get("encoding", encoding), f.get("mode", mode), dirs_created))
        except Exception as exc:  # one file failing never stops the others
            failed.append({"index": i, "path": path, "error": "%s: %s" % (type(exc).__name__, exc)})

    return {
        "ok": not failed,
        "ok_count": len(results),
        "fail_count": len(failed),
        "created_count": sum(1 for r in results if r.get("created")),
        "skipped_count": sum(1 for r in results if r.get("skipped")),
        "results": results,
        "failed": failed,
        "dirs_created": dirs_created,
    }


if __name__ == "__main__":
    h.run_stdio(main)
