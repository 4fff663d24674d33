package undo

import (
	"path/filepath"

	"golang.org/x/sys/unix"
)

// renameExcl renames, failing with EEXIST rather than replacing.
func renameExcl(fromDir int, from string, toDir int, to string) error {
	return unix.RenameatxNp(fromDir, from, toDir, to, unix.RENAME_EXCL)
}

// realDir is where the folder of a place is, its links resolved now
// (macOS has no /proc: the path is resolved again for each step).
func realDir(p place) (string, error) {
	return resolve(filepath.Dir(p.path)), nil
}
