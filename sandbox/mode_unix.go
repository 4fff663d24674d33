//go:build unix

package sandbox

import (
	"os"
	"syscall"
)

// writableByMode reports whether this process's uid or groups could
// write fi without any capability: as its owner (who can always change
// its mode), or through its group or other mode bits.
func writableByMode(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	m := fi.Mode().Perm()
	if int(st.Uid) == os.Getuid() {
		// The owner can always chmod its way in.
		return true
	}
	groups, _ := os.Getgroups()
	groups = append(groups, os.Getgid())
	for _, g := range groups {
		if int(st.Gid) == g {
			return m&0o020 != 0
		}
	}
	return m&0o002 != 0
}
