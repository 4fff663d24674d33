// Package runcgroups finds the run cgroups a process of the agent made,
// for the tests that check none is left behind. Tests only.
package runcgroups

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// Of lists the run cgroups the process pid made that are still under
// /sys/fs/cgroup, in every hierarchy: metnos-run-<pid>-*.
func Of(pid int) []string {
	prefix := fmt.Sprintf("metnos-run-%d-", pid)
	var out []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil // a cgroup removed under the walk, or a file
		}
		if strings.HasPrefix(d.Name(), prefix) {
			out = append(out, p)
			return filepath.SkipDir
		}
		return nil
	})
	return out
}
