//go:build windows

package undo

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/windows"
)

// openNoFollow opens p for reading, refusing a symbolic link (reparse
// point).
func openNoFollow(p string) (*os.File, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&os.ModeSymlink != 0 || fi.Mode()&os.ModeIrregular != 0 {
		return nil, fmt.Errorf("%s is a link: not followed", p)
	}
	return os.Open(p)
}

func isCrossDevice(err error) bool { return errors.Is(err, windows.ERROR_NOT_SAME_DEVICE) }

// freeBytes is the space free to this user on p's volume.
func freeBytes(p string) (int64, error) {
	u, err := windows.UTF16PtrFromString(p)
	if err != nil {
		return 0, err
	}
	var free, total, totalFree uint64
	if err := windows.GetDiskFreeSpaceEx(u, &free, &total, &totalFree); err != nil {
		return 0, err
	}
	return int64(free), nil
}
