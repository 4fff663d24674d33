// Package lockfile takes exclusive advisory locks on files, to keep a
// second agent from serving the same data directory and to let several
// processes take turns on a shared file (a journal, a cache entry).
//
// What it guarantees: at most one holder at a time among the processes
// that lock the same path through this package (flock on Unix,
// LockFileEx on the file's first byte on Windows), two opens of the
// path in one process included; the lock is let go by [Held.Release] or
// when the process ends, however it ends, so a crash never leaves a
// stale lock. [Lock] writes the holder's process id into the file, for
// humans and for the next [Lock]'s error.
//
// What it does not: the lock is advisory, so a process that does not
// take it can still read, write or remove the file; on a network file
// system it is only as good as the server's locking. The process id in
// the file is a hint: it may name a process that has since ended, and
// on Windows, where the locked byte cannot be read by another process,
// errors and [LockHolder] may not name it at all. The file is never
// removed. [LockHolder]'s answer may be out of date by the time it is
// read.
package lockfile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrLocked is wrapped by the error of [Lock] when another process holds
// the lock.
var ErrLocked = errors.New("lockfile: already locked by another process")

// LockedError is the error of [Lock] when another process holds the
// lock; it is an [ErrLocked].
type LockedError struct {
	Path string
	PID  int // 0: the file does not say
}

func (e *LockedError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("%s is held by process %d", e.Path, e.PID)
	}
	return fmt.Sprintf("%s is held by another process", e.Path)
}

// Is makes a LockedError an ErrLocked.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// openError is the error of a lock file that could not be opened,
// naming it once, and for a permission error, what to do.
func openError(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("the lock %s cannot be opened by this user (%w): fix the owner or mode of %s", path, err, filepath.Dir(path))
	}
	return fmt.Errorf("opening the lock %s: %w", path, err)
}

// Held is a lock taken by [Lock], [LockContext] or [LockWait].
type Held struct{ f *os.File }

// Lock takes an exclusive, non-blocking advisory lock on path (flock
// on Unix, LockFileEx on Windows), creating it and its folder when
// needed, for as long as the process lives or until [Held.Release], and
// writes the process id into the file for humans. When another process
// holds it, the error wraps [ErrLocked] and names that process when the
// file says which.
func Lock(path string) (*Held, error) { return lock(path, false) }

// LockWait is [Lock] that waits for another holder to let go instead of
// failing, and does not write the process id; for short critical
// sections shared by several processes, such as appending to a journal.
func LockWait(path string) (*Held, error) { return lock(path, true) }

// LockContext is [Lock] that, while another process holds the lock,
// tries again every poll until it gets it or ctx ends; the error is then
// ctx's cause, wrapped. Like Lock it writes the process id into the
// file; unlike [LockWait] it can be given up. It polls rather than
// blocks because a blocked flock or LockFileEx cannot be called off.
func LockContext(ctx context.Context, path string, poll time.Duration) (*Held, error) {
	for {
		l, err := Lock(path)
		if !errors.Is(err, ErrLocked) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the lock %s: %w", path, context.Cause(ctx))
		case <-time.After(poll):
		}
	}
}

func lock(path string, wait bool) (*Held, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("making the folder of a lock: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, openError(path, err)
	}
	if err := lockFile(f, wait); err != nil {
		b, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if !heldElsewhere(err) {
			return nil, fmt.Errorf("lockfile: locking %s: %w", path, err)
		}
		pid, _ := strconv.Atoi(string(b))
		return nil, &LockedError{Path: path, PID: pid}
	}
	if !wait {
		// For humans, and for the error of the next Lock; the short
		// sections LockWait guards skip the two writes.
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	}
	return &Held{f: f}, nil
}

// Release gives the lock up.
func (l *Held) Release() error { return l.f.Close() }

// LockHolder reports whether another process holds the lock at path
// (as taken by [Lock]) and, when the file names it, that process's id.
// Unlike [Lock] it never creates the file nor writes to it, so a status
// check leaves the holder's process id in place. It opens the file
// read-only; when no one holds the lock it takes it for an instant to
// find out, so a [Lock] at that very instant may fail.
func LockHolder(path string) (pid int, held bool, err error) {
	f, err := os.Open(path) // read-only: a probe writes nothing
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, openError(path, err)
	}
	defer f.Close() // releases the lock if we took it
	err = lockFile(f, false)
	if err == nil {
		return 0, false, nil
	}
	if !heldElsewhere(err) {
		return 0, false, fmt.Errorf("lockfile: testing the lock %s: %w", path, err)
	}
	b, _ := io.ReadAll(io.LimitReader(f, 32))
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, true, nil
}
