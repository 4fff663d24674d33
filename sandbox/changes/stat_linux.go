package changes

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// lstat reads the entry at the absolute path p without following a
// symbolic link anywhere in it (a link on the way is an error: the
// roots are canonical, and nothing beneath a link is walked), and
// without changing its access time where this process owns the file.
func lstat(p string) (Entry, error) {
	e, _, err := lstatRaw(p)
	return e, err
}

// lstatRaw is lstat with the raw stat, for what the Entry does not
// hold (a whiteout's device number).
func lstatRaw(p string) (Entry, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return Entry{}, st, &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return Entry{}, st, &os.PathError{Op: "fstat", Path: p, Err: err}
	}
	e := Entry{Dev: st.Dev, Ino: st.Ino, Nlink: uint64(st.Nlink)}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Kind = File
	case unix.S_IFDIR:
		e.Kind = Dir
	case unix.S_IFLNK:
		e.Kind = Symlink
	default:
		e.Kind = Other
	}
	if e.Kind != Symlink {
		e.State.Mode = fmt.Sprintf("%04o", st.Mode&0o7777)
	}
	switch e.Kind {
	case Symlink:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return Entry{}, st, &os.PathError{Op: "readlink", Path: p, Err: err}
		}
		e.State.Target = string(buf[:n])
	case File:
		size := st.Size
		e.State.Size = &size
		e.State.SHA256 = hashFD(fd)
	}
	return e, st, nil
}

// hashFD is the SHA-256 of the file the O_PATH descriptor fd names,
// read through a descriptor of its own (without changing its access
// time where this process may); "" when it cannot be read.
func hashFD(fd int) string {
	proc := "/proc/self/fd/" + strconv.Itoa(fd)
	r, err := unix.Open(proc, unix.O_RDONLY|unix.O_NOATIME|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EPERM) {
		// O_NOATIME is for the file's owner (or CAP_FOWNER).
		r, err = unix.Open(proc, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return ""
	}
	f := os.NewFile(uintptr(r), proc)
	defer f.Close()
	sum, err := hashFile(f)
	if err != nil {
		return ""
	}
	return sum
}
