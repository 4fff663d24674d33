// Package winetest helps tests that run the Windows build for real under
// Wine (see .ci/wine): it tells Wine from Windows, and gives a temporary
// directory whose cleanup works on Wine 8.0, where os.RemoveAll of a
// non-empty directory fails.
//
// On other systems UnderWine is false and TempDir is t.TempDir.
package winetest

import (
	"os"
	"testing"

	"github.com/metnos/agent/internal/fspath"
)

// TempDir returns a new temporary directory removed when t ends. Under
// Wine it removes the tree entry by entry, deepest first, with os.Remove
// (Wine 8.0 does not implement the file disposition class os.RemoveAll
// uses); elsewhere it is t.TempDir.
func TempDir(t testing.TB) string {
	t.Helper()
	if !UnderWine() {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp("", "winetest-")
	if err != nil {
		t.Fatalf("winetest: temporary directory: %v", err)
	}
	t.Cleanup(func() {
		if err := RemoveTree(dir); err != nil {
			t.Errorf("winetest: removing %s: %v", dir, err)
		}
	})
	return dir
}

// RemoveTree removes dir and everything beneath it, as Wine allows
// (see fspath.RemoveBottomUp).
func RemoveTree(dir string) error { return fspath.RemoveBottomUp(dir) }
