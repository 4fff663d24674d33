//go:build unix

package lockfile

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// heldElsewhere reports whether a lock error means another holder.
func heldElsewhere(err error) bool { return errors.Is(err, unix.EWOULDBLOCK) }

func lockFile(f *os.File, wait bool) error {
	how := unix.LOCK_EX | unix.LOCK_NB
	if wait {
		how = unix.LOCK_EX
	}
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}
