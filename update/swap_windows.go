package update

import (
	"fmt"
	"os"
)

// swap puts f.New at f.Exe and keeps the build it replaces as f.Old.
// Windows can rename a running executable but not replace it, so f.Exe
// is renamed to f.Old and f.New to f.Exe; between the two, only f.Old
// exists, and [Boot] (or the logon task) puts it back.
func swap(f Files) error {
	if err := os.Remove(f.Old); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing %s: %w", f.Old, err)
	}
	if err := os.Rename(f.Exe, f.Old); err != nil {
		return fmt.Errorf("moving the running build %s aside: %w", f.Exe, err)
	}
	at("kept-old")
	if err := os.Rename(f.New, f.Exe); err != nil {
		if rerr := os.Rename(f.Old, f.Exe); rerr != nil {
			return fmt.Errorf("putting the new build in place of %s: %w (and putting the old one back: %v; the next start does)", f.Exe, err, rerr)
		}
		return fmt.Errorf("putting the new build in place of %s: %w", f.Exe, err)
	}
	at("swapped")
	return nil
}

// rollback puts f.Old back at f.Exe and keeps the build it replaces as
// f.Failed, in the same order as swap.
func rollback(f Files) error {
	if err := os.Remove(f.Failed); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing %s: %w", f.Failed, err)
	}
	if err := os.Rename(f.Exe, f.Failed); err != nil {
		return fmt.Errorf("moving the failed build %s aside: %w", f.Exe, err)
	}
	at("kept-failed")
	if err := os.Rename(f.Old, f.Exe); err != nil {
		if rerr := os.Rename(f.Failed, f.Exe); rerr != nil {
			return fmt.Errorf("putting %s back: %w (and the failed build back: %v)", f.Old, err, rerr)
		}
		return fmt.Errorf("putting %s back: %w", f.Old, err)
	}
	at("rolled-back")
	return nil
}
