//go:build unix

package undo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// openNoFollow opens p for reading: not through a symbolic link in its
// last component, and without blocking on a FIFO.
func openNoFollow(p string) (*os.File, error) {
	return os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
}

func isCrossDevice(err error) bool { return errors.Is(err, syscall.EXDEV) }

// freeBytes is the space free to this user on p's file system.
func freeBytes(p string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// openPlace opens the folder rel of root (through the root, so no link
// leads out of it) for the steps on name in it.
func openPlace(root *os.Root, rel, name, path string) (place, error) {
	d, err := root.Open(rel)
	if err != nil {
		return place{}, fmt.Errorf("opening the folder of %s: %w", path, err)
	}
	if fi, err := d.Stat(); err != nil || !fi.IsDir() {
		d.Close()
		return place{}, fmt.Errorf("the folder of %s is not a folder: not touched", path)
	}
	return place{dir: d, name: name, path: path}, nil
}

func (p place) fd() int { return int(p.dir.Fd()) }

// lstatAt is what the journal compares of the entry, not following a
// link.
func lstatAt(p place) (*Stat, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(p.fd(), p.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: p.path, Err: err}
	}
	s := &Stat{Kind: "other", Size: st.Size, MtimeNS: time.Unix(int64(st.Mtim.Sec), int64(st.Mtim.Nsec)).UnixNano()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		s.Kind = "file"
	case unix.S_IFDIR:
		return &Stat{Kind: "dir"}, nil
	case unix.S_IFLNK:
		s.Kind = "link"
	}
	return s, nil
}

// renameNoReplace moves from to to in one step that fails, rather than
// replace, when to exists. Where the file system cannot do that, a file
// is hard-linked then unlinked (a crash between leaves two names of one
// file, which the next run finishes).
func renameNoReplace(from, to place) error {
	err := renameExcl(from.fd(), from.name, to.fd(), to.name)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY):
		return fmt.Errorf("%s is taken by another file: not replaced", to.path)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%s and %s are on different file systems: not moved back here", from.path, to.path)
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.ENOTSUP):
		if st, serr := lstatAt(from); serr != nil || st.Kind == "dir" {
			return fmt.Errorf("moving %s back: this file system cannot move a folder without the risk of replacing one: %w", from.path, err)
		}
		if err := unix.Linkat(from.fd(), from.name, to.fd(), to.name, 0); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("%s is taken by another file: not replaced", to.path)
			}
			return fmt.Errorf("moving %s back: %w", from.path, err)
		}
		return unlinkAt(from, false)
	}
	return fmt.Errorf("moving %s back to %s: %w", from.path, to.path, err)
}

// unlinkAt removes the entry (an empty folder when dir is set).
func unlinkAt(p place, dir bool) error {
	flags := 0
	if dir {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(p.fd(), p.name, flags); err != nil {
		return &os.PathError{Op: "remove", Path: p.path, Err: err}
	}
	return nil
}

// createAt creates a new file (never an existing one, never through a
// link) for writing.
func createAt(p place) (*os.File, error) {
	fd, err := unix.Openat(p.fd(), p.name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: p.path, Err: err}
	}
	return os.NewFile(uintptr(fd), p.path), nil
}

// chtimesAt sets the entry's access and modification times.
func chtimesAt(p place, atime, mtime time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(p.fd(), p.name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "chtimes", Path: p.path, Err: err}
	}
	return nil
}

// sameFileAt reports whether a and b name one file (a move by link and
// unlink cut between the two).
func sameFileAt(a, b place) bool {
	var sa, sb unix.Stat_t
	if unix.Fstatat(a.fd(), a.name, &sa, unix.AT_SYMLINK_NOFOLLOW) != nil || unix.Fstatat(b.fd(), b.name, &sb, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// renameReplace moves from over to in one step (a restore over the file
// an executor overwrote, checked just before).
func renameReplace(from, to place) error {
	if err := unix.Renameat(from.fd(), from.name, to.fd(), to.name); err != nil {
		return fmt.Errorf("putting back %s: %w", to.path, &os.LinkError{Op: "rename", Old: from.path, New: to.path, Err: err})
	}
	return nil
}

// openUnder opens the file rel of the folder dir for reading with no
// symbolic link in any component, dir's own last one included: each is
// opened by the one before it with O_NOFOLLOW. It does not block on a
// FIFO. p names the file in errors.
func openUnder(dir, rel, p string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	for k, name := range parts {
		flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if k < len(parts)-1 {
			flags |= unix.O_DIRECTORY
		} else {
			flags |= unix.O_NONBLOCK
		}
		next, err := unix.Openat(fd, name, flags, 0)
		unix.Close(fd)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: filepath.Join(append([]string{dir}, parts[:k+1]...)...), Err: err}
		}
		fd = next
	}
	return os.NewFile(uintptr(fd), p), nil
}
