"""organize_photos: sort the JPEGs of one folder into YYYY/MM subfolders.

args:   {"folder": "/abs/dir"}
For every *.jpg / *.jpeg directly in folder (any letter case) the date is
EXIF DateTimeOriginal (0x9003), else EXIF DateTime (0x0132), else the first
YYYYMMDD in the file name, else the file's mtime (local time). The photo
moves to <folder>/YYYY/MM/<name>. If that destination is taken:
  * same bytes: the source is removed and the destination left alone;
  * different bytes: the destination is replaced (os.replace);
in both cases a backup blob of the destination is kept first, so the undo
(swap_src_dst, then restore_blob_backup) brings back both files.

result: {"ok": no failures, "ok_count", "fail_count", "replaced", "duplicates",
         "results": [{"src", "dst", "date", "date_source": "exif"|"name"|"mtime",
                      + for a taken destination: "path": dst, "replaced" or
                      "duplicate": true, blob_path, blob_sha256, mode,
                      mtime_ns, atime_ns, size}],
         "failed": [{"src", "error"}],
         "dirs_created": [...shallowest first]}
"""

import datetime
import os
import re
import struct

import executor_helpers as h

EXTENSIONS = (".jpg", ".jpeg")
TAG_DATETIME = 0x0132
TAG_EXIF_IFD = 0x8769
TAG_DATETIME_ORIGINAL = 0x9003
TYPE_ASCII = 2


# ---------------------------------------------------------------------------
# EXIF: a minimal JPEG/TIFF reader, just enough for the two date tags.


def exif_block(path):
    """The TIFF bytes of the first APP1 "Exif\\0\\0" segment, or None."""
    with open(path, "rb") as f:
        if f.read(2) != b"\xff\xd8":  # SOI
            return None
        while True:
            b = f.read(1)
            if not b:
                return None
            if b != b"\xff":
                return None  # lost sync: not a JPEG we understand
            marker = f.read(1)
            while marker == b"\xff":  # fill bytes
                marker = f.read(1)
            if not marker:
                return None
            m = marker[0]
            if m in (0xD9, 0xDA):  # EOI, SOS: no metadata after this
                return None
            if m == 0x01 or 0xD0 <= m <= 0xD7:  # markers without a length
                continue
            raw = f.read(2)
            if len(raw) != 2:
                return None
            length = struct.unpack(">H", raw)[0]
            if length < 2:
                return None
            if m == 0xE1:
                data = f.read(length - 2)
                if data.startswith(b"Exif\x00\x00"):
                    return data[6:]
            else:
                f.seek(length - 2, 1)


def _ifd(tiff, order, offset):
    """The entries of the IFD at offset: {tag: (type, count, value_field_offset)}."""
    if offset < 8 or offset + 2 > len(tiff):
        return {}
    (count,) = struct.unpack_from(order + "H", tiff, offset)
    tags = {}
    for i in range(count):
        at = offset + 2 + 12 * i
        if at + 12 > len(tiff):
            break
        tag, typ, n = struct.unpack_from(order + "HHI", tiff, at)
        tags[tag] = (typ, n, at + 8)
    return tags


def _ascii(tiff, order, entry):
    """The string value of an ASCII entry, or None."""
    typ, n, field = entry
    if typ != TYPE_ASCII or n == 0:
        return None
    if n <= 4:
        start = field
    else:
        (start,) = struct.unpack_from(order + "I", tiff, field)
    raw = tiff[start:start + n]
    if len(raw) != n:
        return None
    return raw.split(b"\x00", 1)[0].decode("ascii", "replace")


def _parse_exif_time(s):
    """ "YYYY:MM:DD HH:MM:SS" to a datetime, None if absent or invalid."""
    if not s:
        return None
    try:
        return datetime.datetime.strptime(s.strip()[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None


def exif_datetime(path):
    """DateTimeOriginal, else DateTime, from the file's EXIF; None if neither
    (or if the file is not a JPEG this reader understands)."""
    try:
        return _exif_datetime(path)
    except (OSError, struct.error, ValueError):
        return None


def _exif_datetime(path):
    tiff = exif_block(path)
    if not tiff or len(tiff) < 8:
        return None
    if tiff[:2] == b"II":
        order = "<"
    elif tiff[:2] == b"MM":
        order = ">"
    else:
        return None
    magic, ifd0 = struct.unpack_from(order + "HI", tiff, 2)
    if magic != 42:
        return None
    tags = _ifd(tiff, order, ifd0)
    candidates = []
    sub = tags.get(TAG_EXIF_IFD)
    if sub is not None and sub[1] == 1:
        (sub_offset,) = struct.unpack_from(order + "I", tiff, sub[2])
        exif_tags = _ifd(tiff, order, sub_offset)
        if TAG_DATETIME_ORIGINAL in exif_tags:
            candidates.append(exif_tags[TAG_DATETIME_ORIGINAL])
    if TAG_DATETIME in tags:
        candidates.append(tags[TAG_DATETIME])
    for entry in candidates:
        when = _parse_exif_time(_ascii(tiff, order, entry))
        if when is not None:
            return when
    return None


# ---------------------------------------------------------------------------
# Other date sources


DIGITS = re.compile(r"\d{8,}")


def name_date(name):
    """The first run of 8+ digits in name that starts with a valid YYYYMMDD."""
    for m in DIGITS.finditer(name):
        s = m.group(0)
        try:
            d = datetime.datetime(int(s[0:4]), int(s[4:6]), int(s[6:8]))
        except ValueError:
            continue
        if 1900 <= d.year <= 2100:
            return d
    return None


def photo_date(path):
    """(datetime, source) for one photo."""
    when = exif_datetime(path)
    if when is not None:
        return when, "exif"
    when = name_date(os.path.basename(path))
    if when is not None:
        return when, "name"
    return datetime.datetime.fromtimestamp(os.stat(path).st_mtime), "mtime"


# ---------------------------------------------------------------------------


def organize_one(folder, name, dirs_created):
    """Move one photo; return its result row."""
    src = os.path.join(folder, name)
    when, source = photo_date(src)
    target_dir = os.path.join(folder, "%04d" % when.year, "%02d" % when.month)
    dst = os.path.join(target_dir, name)
    row = {"src": src, "dst": dst, "date": when.isoformat(), "date_source": source}

    dirs_created.extend(h.make_dirs(target_dir))
    if not os.path.lexists(dst):
        h.move_path(src, dst)
        return row
    if os.path.islink(dst) or not os.path.isfile(dst):
        raise FileExistsError("destination exists and is not a file: %s" % dst)

    # A taken destination: back it up FIRST, then change anything.
    row["path"] = dst
    row.update(h.backup_blob(dst))
    if h.same_bytes(src, dst):
        os.unlink(src)
        h.fsync_dir(folder)
        row["duplicate"] = True
    else:
        h.move_path(src, dst, overwrite=True)
        row["replaced"] = True
    return row


def main(args):
    folder = h.abs_path(args.get("folder"), "folder")
    if not os.path.isdir(folder):
        return {"ok": False, "error": "no such folder: %s" % folder, "error_class": "not_found"}

    names = sorted(
        e.name for e in os.scandir(folder)
        if e.is_file(follow_symlinks=False) and e.name.lower().endswith(EXTENSIONS)
    )
    results, failed, dirs_created = [], [], []
    for name in names:
        try:
            results.append(organize_one(folder, name, dirs_created))
        except Exception as exc:  # one photo failing never stops the others
            failed.append({"src": os.path.join(folder, name),
                           "error": "%s: %s" % (type(exc).__name__, exc)})

    return {
        "ok": not failed,
        "ok_count": len(results),
        "fail_count": len(failed),
        "replaced": sum(1 for r in results if r.get("replaced")),
        "duplicates": sum(1 for r in results if r.get("duplicate")),
        "results": results,
        "failed": failed,
        "dirs_created": dirs_created,
    }


if __name__ == "__main__":
    h.run_stdio(main)
