// Package fspath holds the path helpers several packages share: whether
// one path lies in another (cleaned paths compared by whole components,
// on the text only: nothing is resolved, so callers resolve links first
// where that matters), and a removal of a tree that works where
// os.RemoveAll does not (Wine).
package fspath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Within reports whether p is dir or lies beneath it.
func Within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// Inside reports whether p lies strictly beneath dir.
func Inside(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// RemoveBottomUp removes dir and everything beneath it with os.Remove,
// deepest entries first, clearing a read-only attribute where one is in
// the way; links and junctions are removed, never followed. It is
// os.RemoveAll for where that fails: Wine 8 does not implement the
// delete-on-close call Go's RemoveAll uses on Windows.
func RemoveBottomUp(dir string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range slices.Backward(paths) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			_ = os.Chmod(p, 0o600)
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}
