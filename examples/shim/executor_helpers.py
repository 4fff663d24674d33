"""executor_helpers: the small shim Metnos executors import on a device.

Standard library only, Python 3.8 or newer. An executor is run as
``<python> <entry.py>`` with its arguments as one JSON object on stdin and
must print exactly one JSON object on stdout (protocol section 6.4). The
usual entry point is::

    import executor_helpers as h

    def main(args):
        return {"ok": True, "entries": [], "ok_count": 0}

    if __name__ == "__main__":
        h.run_stdio(main)

Besides run_stdio the shim has the environment look-ups every executor
needs (user_data_dir, history_dir, turn_id), backup_blob and
backup_file_for_undo, which keep the bytes of a file about to be
destroyed so that the server's undo can put them back (section 6.7),
and a few durable file helpers.
"""

import errno
import hashlib
import json
import os
import shutil
import stat
import sys
import traceback

_CHUNK = 1 << 20


class ArgError(ValueError):
    """Raised for arguments an executor cannot work with.

    run_stdio reports it with error_class "bad_args" instead of
    "executor_error".
    """


# ---------------------------------------------------------------------------
# stdin / stdout


def _error(exc, error_class):
    """The error object printed instead of a result."""
    return {
        "ok": False,
        "error": "%s: %s" % (type(exc).__name__, exc),
        "error_class": error_class,
    }


def _read_args(allow_empty):
    """Read stdin whole and return the one JSON object it holds."""
    raw = sys.stdin.buffer.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ArgError("stdin is not UTF-8: %s" % exc)
    if not text.strip():
        if allow_empty:
            return {}
        raise ArgError("no arguments on stdin: expected one JSON object")
    try:
        args = json.loads(text)
    except ValueError as exc:
        raise ArgError("stdin is not JSON: %s" % exc)
    if not isinstance(args, dict):
        raise ArgError("arguments must be a JSON object, not %s" % type(args).__name__)
    return args


def _dump(obj):
    """One JSON line, UTF-8, non-ASCII kept as is when it can be encoded."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. from undecodable file names): escape them.
        return (json.dumps(obj, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")


def run_stdio(fn, allow_empty=False):
    """Run fn(args) with the JSON object on stdin; print its dict on stdout.

    Empty stdin is an error unless allow_empty (then args is {}). Any
    exception, a result that is not a dict or not JSON-serialisable, becomes
    {"ok": false, "error": "<type>: <msg>", "error_class": ...}; the
    traceback goes to stderr. While fn runs, sys.stdout points at stderr,
    so a stray print cannot corrupt the one JSON object the agent reads.
    """
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        try:
            args = _read_args(allow_empty)
            result = fn(args)
            if not isinstance(result, dict):
                raise TypeError("executor returned %s, not a dict" % type(result).__name__)
            data = _dump(result)
        except ArgError as exc:
            data = _dump(_error(exc, "bad_args"))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - report, never crash
            traceback.print_exc(file=sys.stderr)
            data = _dump(_error(exc, "executor_error"))
    finally:
        sys.stdout = out
    binary = getattr(out, "buffer", None)
    if binary is not None:
        binary.write(data)
    else:  # a text-only stream (e.g. replaced by a test harness)
        out.write(data.decode("utf-8"))
    out.flush()


# ---------------------------------------------------------------------------
# Environment


def user_data_dir():
    """$METNOS_USER_DATA, the executor's own writable folder."""
    d = os.environ.get("METNOS_USER_DATA", "")
    if not d:
        raise RuntimeError("METNOS_USER_DATA is not set")
    return d


def history_dir():
    """$METNOS_HISTORY_DIR, else <METNOS_USER_DATA>/_history."""
    d = os.environ.get("METNOS_HISTORY_DIR", "")
    return d if d else os.path.join(user_data_dir(), "_history")


def turn_id():
    """$METNOS_TURN_ID, else "no_turn"; made safe to use as one folder name."""
    t = os.environ.get("METNOS_TURN_ID", "") or "no_turn"
    for sep in ("/", "\\", os.sep):
        t = t.replace(sep, "_")
    return "no_turn" if t in (".", "..") else t


# ---------------------------------------------------------------------------
# Paths


def expand(p):
    """Expand a leading ~ (the user's home) in p."""
    return os.path.expanduser(str(p))


def abs_path(p, what="path"):
    """expand(p), normalised; ArgError unless it is a non-empty absolute path."""
    if not isinstance(p, str) or not p:
        raise ArgError("%s must be a non-empty string" % what)
    q = expand(p)
    if not os.path.isabs(q):
        raise ArgError("%s must be an absolute path: %r" % (what, p))
    return os.path.normpath(q)


def path_list(args, key):
    """args[key] as a list of absolute paths (ArgError otherwise)."""
    items = args.get(key)
    if not isinstance(items, list):
        raise ArgError("%s must be a list of paths" % key)
    return [abs_path(p, "%s[%d]" % (key, i)) for i, p in enumerate(items)]


def make_dirs(path):
    """Create path and its missing parents; return the created ones, shallowest first."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    created = []
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
            continue
        created.append(d)
    return created


# ---------------------------------------------------------------------------
# Durable files


def fsync_dir(path):
    """fsync a directory so a rename in it survives a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_file(path):
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def same_bytes(a, b):
    """True if the two files hold identical bytes."""
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(_CHUNK), fb.read(_CHUNK)
            if ca != cb:
                return False
            if not ca:
                return True


def _temp_in(d, prefix, suffix, mode=0o600):
    """An open (fd, name) new file in folder d, created with mode (less the
    umask): the mode is set at creation because the sandbox may refuse a
    later chmod."""
    for _ in range(100):
        name = os.path.join(d, prefix + os.urandom(6).hex() + suffix)
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", d)


def _temp_beside(path, mode=0o600):
    """An open (fd, name) temporary file in path's directory."""
    d, base = os.path.split(path)
    return _temp_in(d, "." + base + ".", ".metnos-tmp", mode)


def _best_effort(fn, *args, **kwargs):
    """Change a file's mode or times where the sandbox allows it. Without
    a mount namespace the agent's sandbox refuses every mode and time
    change (Landlock does not confine them), so they are kept only where
    they can be; the data always is."""
    try:
        fn(*args, **kwargs)
        return True
    except PermissionError as e:
        print("metnos shim: %s not applied: %s" % (fn.__name__, e), file=sys.stderr)
        return False


def _stat_to_fd(fd, path, st, extra=0):
    """Give the open file fd (named path) the permission bits (plus
    extra) and times of st. Through the descriptor where the platform
    allows it: without a mount namespace the sandbox refuses mode and
    time changes by path, but not on a file it let the executor open for
    writing. Elsewhere (Windows), by path."""
    mode = stat.S_IMODE(st.st_mode) | extra
    if hasattr(os, "fchmod"):
        _best_effort(os.fchmod, fd, mode)
    else:
        _best_effort(os.chmod, path, mode)
    times = (st.st_atime_ns, st.st_mtime_ns)
    if os.utime in os.supports_fd:
        _best_effort(os.utime, fd, ns=times)
    else:
        _best_effort(os.utime, path, ns=times)


def copy_stat(src, dst):
    """Copy mode and times from src to dst, as far as the sandbox allows."""
    st = os.stat(src)
    try:
        fd = os.open(dst, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        _best_effort(os.chmod, dst, stat.S_IMODE(st.st_mode))
        _best_effort(os.utime, dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        return
    try:
        _stat_to_fd(fd, dst, st)
    finally:
        os.close(fd)


def copy_file(src, dst, overwrite=False):
    """Copy src to dst durably: data and metadata to a temporary file beside
    dst (shutil.copyfile, then mode and times where the sandbox allows),
    fsync, then rename over dst and fsync the folder.
    src is never modified. FileExistsError if dst exists and not overwrite."""
    if not overwrite and os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "destination exists", dst)
    fd, tmp = _temp_beside(dst, stat.S_IMODE(os.stat(src).st_mode) | stat.S_IRUSR | stat.S_IWUSR)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        copy_stat(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if not overwrite and os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "destination exists", dst)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(dst))


def move_path(src, dst, overwrite=False):
    """Move a file or folder: os.rename/os.replace, or copy then delete when
    src and dst are on different devices. FileExistsError if dst exists and
    not overwrite; a folder is never overwritten."""
    if os.path.lexists(dst):
        if not overwrite:
            raise FileExistsError(errno.EEXIST, "destination exists", dst)
        if os.path.isdir(dst) and not os.path.islink(dst):
            raise IsADirectoryError(errno.EISDIR, "destination is a folder", dst)
    try:
        if overwrite:
            os.replace(src, dst)
        else:
            os.rename(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True)
            shutil.rmtree(src)
        else:
            copy_file(src, dst, overwrite)
            os.unlink(src)
    fsync_dir(os.path.dirname(dst))
    fsync_dir(os.path.dirname(src))


# ---------------------------------------------------------------------------
# Backup blobs (undo)


def backup_blob(path):
    """Keep a copy of path's bytes before a destructive change.

    The copy goes to <history_dir>/<turn_id>/blob/<sha256>.bin (temporary
    file in the same folder, fsync, os.replace, fsync of the folder); if a
    blob with that name and the right hash is already there, nothing is
    written. The blob takes the file's permission bits (plus owner
    read/write) and times, so restoring it with shutil.copy2 brings them
    back too. Returns the fields a result row carries for the server's
    restore_blob_backup: blob_path, blob_sha256, mode, mtime_ns, atime_ns,
    size.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file: %s" % path)
    blob_dir = os.path.join(history_dir(), turn_id(), "blob")
    os.makedirs(blob_dir, exist_ok=True)

    digest = sha256_file(path)
    blob = os.path.join(blob_dir, digest + ".bin")
    if not (os.path.isfile(blob) and sha256_file(blob) == digest):
        fd, tmp = _temp_in(blob_dir, ".blob.", ".tmp", stat.S_IMODE(st.st_mode) | stat.S_IRUSR | stat.S_IWUSR)
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, open(path, "rb") as f:
                for chunk in iter(lambda: f.read(_CHUNK), b""):
                    h.update(chunk)
                    out.write(chunk)
                out.flush()
                _stat_to_fd(out.fileno(), tmp, st, stat.S_IRUSR | stat.S_IWUSR)
                os.fsync(out.fileno())
            if h.hexdigest() != digest:
                # The file changed while we read it: keep what we copied.
                digest = h.hexdigest()
                blob = os.path.join(blob_dir, digest + ".bin")
            os.replace(tmp, blob)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        fsync_dir(blob_dir)
    return {
        "blob_path": blob,
        "blob_sha256": digest,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime_ns": st.st_mtime_ns,
        "atime_ns": st.st_atime_ns,
        "size": st.st_size,
    }


def backup_file_for_undo(path):
    """Keep a copy of path's bytes before it is overwritten; return the
    blob's path.

    The same content-addressed store as backup_blob
    (<history_dir>/<turn_id>/blob/<sha256>.bin, the file's mode and times
    copied), under the name the upstream Metnos shim gives it: result
    rows carry it as prev_blob_path (write_files over an existing file,
    move_files over one), which the server's restore_blob_backup, and a
    device's local undo, read.
    """
    return backup_blob(path)["blob_path"]


def deepest_first(dirs):
    """dirs without repeats, deepest first (as dirs_created is reported)."""
    seen = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return sorted(seen, key=lambda d: d.replace("\\", "/").rstrip("/").count("/"), reverse=True)
