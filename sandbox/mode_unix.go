//go:build unix

package sandbox

import (
	"os"
	"syscall"
)

// writableByMode reports whether fi's mode bits let this process's
// uid or groups write it, as they would without any capability.
func writableByMode(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	m := fi.Mode().Perm()
	if int(st.Uid) == os.Getuid() {
		return m&0o200 != 0
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
