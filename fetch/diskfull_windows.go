package fetch

import (
	"errors"

	"golang.org/x/sys/windows"
)

// diskFull reports whether err is a write refused for want of space.
func diskFull(err error) bool {
	return errors.Is(err, windows.ERROR_DISK_FULL) || errors.Is(err, windows.ERROR_HANDLE_DISK_FULL)
}
