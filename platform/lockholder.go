package platform

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// LockHolder reports whether another process holds the lock at path
// (as taken by [Lock]) and, when the file names it, that process's id.
// Unlike [Lock] it never creates the file nor writes to it, so a status
// check leaves the holder's process id in place.
func LockHolder(path string) (pid int, held bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("platform: opening the lock %s: %w", path, err)
	}
	defer f.Close() // releases the lock if we took it
	err = lockFile(f, false)
	if err == nil {
		return 0, false, nil
	}
	if !heldElsewhere(err) {
		return 0, false, fmt.Errorf("platform: testing the lock %s: %w", path, err)
	}
	b, _ := io.ReadAll(io.LimitReader(f, 32))
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, true, nil
}
