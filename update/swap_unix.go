//go:build !windows

package update

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/metnos/agent/internal/atomicfile"
)

// swap puts f.New at f.Exe and keeps the build it replaces as f.Old.
// The old file is hard-linked (else copied) to f.Old first, then f.New
// is renamed over f.Exe: at every point f.Exe is one build or the
// other.
func swap(f Files) error {
	if err := keep(f.Exe, f.Old); err != nil {
		return err
	}
	at("kept-old")
	if err := os.Rename(f.New, f.Exe); err != nil {
		return fmt.Errorf("putting the new build in place of %s: %w", f.Exe, err)
	}
	atomicfile.SyncDir(filepath.Dir(f.Exe))
	at("swapped")
	return nil
}

// rollback puts f.Old back at f.Exe and keeps the build it replaces as
// f.Failed, in the same order as swap.
func rollback(f Files) error {
	if err := keep(f.Exe, f.Failed); err != nil {
		return err
	}
	at("kept-failed")
	if err := os.Rename(f.Old, f.Exe); err != nil {
		return fmt.Errorf("putting %s back in place of %s: %w", f.Old, f.Exe, err)
	}
	atomicfile.SyncDir(filepath.Dir(f.Exe))
	at("rolled-back")
	return nil
}

// keep makes dst a second name (else a copy) of src, replacing dst.
func keep(src, dst string) error {
	if err := os.Remove(dst); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing %s: %w", dst, err)
	}
	if err := os.Link(src, dst); err != nil {
		if err := copyFile(src, dst); err != nil {
			return fmt.Errorf("keeping %s as %s: %w", src, dst, err)
		}
	}
	atomicfile.SyncDir(filepath.Dir(dst))
	return nil
}
