//go:build !windows

package config

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// checkPrivate refuses the limits file open as f at path when another
// user could have written it: it or its folder is not this user's, or
// lets the group or others write.
func checkPrivate(path string, f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("config: reading the owner's limits file %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("config: reading the owner's limits file %s: its folder: %w", path, err)
	}
	uid := os.Getuid()
	for _, c := range []struct {
		what, path string
		fi         os.FileInfo
	}{{"it", path, fi}, {"its folder " + dir, dir, di}} {
		if st, ok := c.fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
			return &LimitsError{File: path, Msg: fmt.Sprintf("refused: %s belongs to uid %d, not to this user (uid %d), so another user could have written it: make it yours (chown %d %s) or remove it",
				c.what, st.Uid, uid, uid, c.path)}
		}
		if perm := c.fi.Mode().Perm(); perm&0o022 != 0 {
			return &LimitsError{File: path, Msg: fmt.Sprintf("refused: other users can write %s (mode %04o): run chmod go-w %s", c.what, perm, c.path)}
		}
	}
	return nil
}
