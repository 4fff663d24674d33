// Package platform holds what differs by operating system around the
// agent's process rather than its sandbox: the single-instance lock and
// the rotated log file.
package platform

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
)

// ErrLocked is returned by [Lock] when another process holds the lock.
var ErrLocked = errors.New("platform: already locked by another process")

// InstanceLock is a held single-instance lock.
type InstanceLock struct{ f *os.File }

// Lock takes an exclusive, non-blocking advisory lock on path (flock
// on Unix, LockFileEx on Windows) for as long as the process lives or
// until Release, and writes the process id into the file for humans.
// When another process holds it, the error wraps [ErrLocked] and names
// that process when the file says which.
func Lock(path string) (*InstanceLock, error) { return lock(path, false) }

// LockWait is [Lock] that waits for another holder to let go instead of
// failing, and does not write the process id; for short critical
// sections shared by several processes, such as appending to a journal.
func LockWait(path string) (*InstanceLock, error) { return lock(path, true) }

func lock(path string, wait bool) (*InstanceLock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("platform: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("platform: opening the lock %s: %w", path, err)
	}
	if err := lockFile(f, wait); err != nil {
		b, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if !heldElsewhere(err) {
			return nil, fmt.Errorf("platform: locking %s: %w", path, err)
		}
		if pid, perr := strconv.Atoi(string(b)); perr == nil {
			return nil, fmt.Errorf("%w: %s is held by process %d", ErrLocked, path, pid)
		}
		return nil, fmt.Errorf("%w: %s (%v)", ErrLocked, path, err)
	}
	if !wait {
		// For humans, and for the error of the next Lock; the short
		// sections LockWait guards skip the two writes.
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	}
	return &InstanceLock{f: f}, nil
}

// Release gives the lock up.
func (l *InstanceLock) Release() error { return l.f.Close() }

// MaxLogBytes is the size above which the log is rotated at start.
const MaxLogBytes = 5 << 20

// OpenLog opens path for appending, first renaming it to path.1 when it
// is over [MaxLogBytes] (one old log is kept, as the Rust client does).
func OpenLog(path string) (*os.File, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > MaxLogBytes {
		if err := os.Rename(path, path+".1"); err != nil {
			return nil, fmt.Errorf("platform: rotating the log %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("platform: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("platform: opening the log: %w", err)
	}
	return f, nil
}

// Logger logs to the file as JSON lines and to stderr as text, both at
// level and above.
func Logger(file io.Writer, stderr io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	return slog.New(slog.NewMultiHandler(slog.NewJSONHandler(file, opts), slog.NewTextHandler(stderr, opts)))
}
