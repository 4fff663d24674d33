//go:build !windows

package fetch

import (
	"errors"
	"syscall"
)

// diskFull reports whether err is a write refused for want of space:
// the file system is full, or the user's quota is.
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
