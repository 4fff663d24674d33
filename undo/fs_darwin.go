package undo

import "golang.org/x/sys/unix"

// renameExcl renames, failing with EEXIST rather than replacing.
func renameExcl(fromDir int, from string, toDir int, to string) error {
	return unix.RenameatxNp(fromDir, from, toDir, to, unix.RENAME_EXCL)
}
