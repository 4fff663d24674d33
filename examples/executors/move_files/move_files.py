"""move_files: move (or copy) files, one destination per entry.

args:
  entries       [{"src": path, "dst": path (optional)}, ...]
  dst_template  destination for each entry, default "{dst}":
                "{name}" becomes the base name of src, "{dst}" the entry's
                dst; a template without placeholders is a literal path
  parents       create missing parent folders (recorded in dirs_created)
  copy          copy (data, then mode and times where allowed, fsync) instead of moving; the source,
                e.g. a backup blob, stays where it is
  overwrite     replace an existing file at the destination (default false:
                an occupied destination is a failure for that entry); the
                file replaced is kept first as a backup blob
  client        "local" (the only one this executor serves)

result: {"ok": no failures, "ok_count", "fail_count",
         "results": [{"src", "dst"}, or, over a file, {"src", "dst",
                      "path": dst, "prev_blob_path"}],
         "failed": [{"index", "src", "error"}],
         "dirs_created": [...deepest first]}
The rows are those of the upstream Metnos move_files: its reverse
patterns (swap_src_dst, restore_blob_backup, delete_created_dirs) move
each file back, restore a replaced file from its blob, and remove the
folders made.
"""

import os

import executor_helpers as h


def destination(template, entry, src):
    """The entry's destination path from the template."""
    dst = template
    if "{dst}" in dst:
        if not isinstance(entry.get("dst"), str) or not entry["dst"]:
            raise h.ArgError("dst_template uses {dst} but the entry has no dst")
        dst = dst.replace("{dst}", entry["dst"])
    dst = dst.replace("{name}", os.path.basename(src))
    return h.abs_path(dst, "destination")


def main(args):
    entries = args.get("entries")
    if not isinstance(entries, list):
        raise h.ArgError("entries must be a list of {src, dst?} objects")
    template = args.get("dst_template", "{dst}")
    if not isinstance(template, str) or not template:
        raise h.ArgError("dst_template must be a non-empty string")
    client = args.get("client", "local")
    if client != "local":
        raise h.ArgError("only client \"local\" is served here, not %r" % (client,))
    parents = bool(args.get("parents", False))
    copy = bool(args.get("copy", False))
    overwrite = bool(args.get("overwrite", False))

    results, failed, dirs_created = [], [], []
    for i, entry in enumerate(entries):
        src = entry.get("src") if isinstance(entry, dict) else None
        try:
            if not isinstance(entry, dict):
                raise h.ArgError("entry is not an object")
            src = h.abs_path(src, "src")
            dst = destination(template, entry, src)
            if dst == src:
                raise ValueError("source and destination are the same path")
            if not os.path.lexists(src):
                raise FileNotFoundError("no such file: %s" % src)
            if os.path.lexists(dst) and not overwrite:
                raise FileExistsError("destination exists: %s" % dst)
            parent = os.path.dirname(dst)
            if not os.path.isdir(parent):
                if not parents:
                    raise FileNotFoundError("destination folder missing: %s" % parent)
                dirs_created.extend(h.make_dirs(parent))
            if copy and os.path.isdir(src):
                raise IsADirectoryError("copy of a folder is not supported: %s" % src)
            prev_blob_path = None
            if overwrite and os.path.lexists(dst):
                if os.path.islink(dst) or not os.path.isfile(dst):
                    raise FileExistsError("overwrite of a destination that is not a file is not reversible: %s" % dst)
                prev_blob_path = h.backup_file_for_undo(dst)  # before anything changes
            if copy:
                h.copy_file(src, dst, overwrite)
            else:
                h.move_path(src, dst, overwrite)
            row = {"src": src, "dst": dst}
            if prev_blob_path:
                row["path"] = dst
                row["prev_blob_path"] = prev_blob_path
            results.append(row)
        except Exception as exc:  # one entry failing never stops the others
            failed.append({"index": i, "src": src, "error": "%s: %s" % (type(exc).__name__, exc)})

    return {
        "ok": not failed,
        "ok_count": len(results),
        "fail_count": len(failed),
        "results": results,
        "failed": failed,
        "dirs_created": h.deepest_first(dirs_created),
    }


if __name__ == "__main__":
    h.run_stdio(main)
