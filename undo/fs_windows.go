//go:build windows

package undo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

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

// openPlace names the entry by its full path: Windows has no *at calls
// here, so the confinement is the check before the step, not the step.
func openPlace(root *os.Root, rel, name, path string) (place, error) {
	return place{name: name, path: filepath.Join(root.Name(), rel, name)}, nil
}

func lstatAt(p place) (*Stat, error) {
	fi, err := os.Lstat(p.path)
	if err != nil {
		return nil, err
	}
	return stat(fi), nil
}

// renameNoReplace moves without MOVEFILE_REPLACE_EXISTING: it fails
// rather than replace a file.
func renameNoReplace(from, to place) error {
	f, err := windows.UTF16PtrFromString(from.path)
	if err != nil {
		return err
	}
	t, err := windows.UTF16PtrFromString(to.path)
	if err != nil {
		return err
	}
	switch err := windows.MoveFileEx(f, t, 0); {
	case err == nil:
		return nil
	case errors.Is(err, windows.ERROR_ALREADY_EXISTS) || errors.Is(err, windows.ERROR_FILE_EXISTS):
		return fmt.Errorf("%s is taken by another file: not replaced", to.path)
	case errors.Is(err, windows.ERROR_NOT_SAME_DEVICE):
		return fmt.Errorf("%s and %s are on different volumes: not moved back here", from.path, to.path)
	default:
		return fmt.Errorf("moving %s back to %s: %w", from.path, to.path, err)
	}
}

func unlinkAt(p place, dir bool) error { return os.Remove(p.path) }

func createAt(p place) (*os.File, error) {
	return os.OpenFile(p.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}

func chtimesAt(p place, atime, mtime time.Time) error { return os.Chtimes(p.path, atime, mtime) }

// realDir is where the folder of a place is, its links resolved now.
func realDir(p place) (string, error) { return resolve(filepath.Dir(p.path)), nil }

// sameFileAt reports whether a and b name one file.
func sameFileAt(a, b place) bool {
	fa, err1 := os.Lstat(a.path)
	fb, err2 := os.Lstat(b.path)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// renameReplace moves from over to (a restore over the file an
// executor overwrote, checked just before).
func renameReplace(from, to place) error {
	f, err := windows.UTF16PtrFromString(from.path)
	if err != nil {
		return err
	}
	t, err := windows.UTF16PtrFromString(to.path)
	if err != nil {
		return err
	}
	if err := windows.MoveFileEx(f, t, windows.MOVEFILE_REPLACE_EXISTING); err != nil {
		return fmt.Errorf("putting back %s: %w", to.path, err)
	}
	return nil
}

// openUnder opens the file rel of the folder dir for reading, refusing
// a symbolic link (reparse point) in any component, dir's own last one
// included. Windows has no openat here: each component is looked at,
// then the file is opened by its full path.
func openUnder(dir, rel, p string) (*os.File, error) {
	q := dir
	for k, name := range append([]string{""}, strings.Split(rel, `\`)...) {
		if k > 0 {
			q = filepath.Join(q, name)
		}
		fi, err := os.Lstat(q)
		if err != nil {
			return nil, err
		}
		if fi.Mode()&(os.ModeSymlink|os.ModeIrregular) != 0 {
			return nil, fmt.Errorf("%s is a link: not followed", q)
		}
	}
	return os.Open(filepath.Join(dir, rel))
}
