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
                an occupied destination is a failure for that entry)
  client        "local" (the only one this executor serves)

result: {"ok": no failures, "ok_count", "fail_count",
         "results": [{"src", "dst"}], "failed": [{"index", "src", "error"}],
         "dirs_created": [...shallowest first]}
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
            if copy:
                if os.path.isdir(src):
                    raise IsADirectoryError("copy of a folder is not supported: %s" % src)
                h.copy_file(src, dst, overwrite)
            else:
                h.move_path(src, dst, overwrite)
            results.append({"src": src, "dst": dst})
        except Exception as exc:  # one entry failing never stops the others
            failed.append({"index": i, "src": src, "error": "%s: %s" % (type(exc).__name__, exc)})

    return {
        "ok": not failed,
        "ok_count": len(results),
        "fail_count": len(failed),
        "results": results,
        "failed": failed,
        "dirs_created": dirs_created,
    }


if __name__ == "__main__":
    h.run_stdio(main)
