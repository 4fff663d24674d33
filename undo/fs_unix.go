//go:build unix

package undo

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// openNoFollow opens p for reading, refusing a symbolic link.
func openNoFollow(p string) (*os.File, error) {
	return os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
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
