package undo

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// renameExcl renames, failing with EEXIST rather than replacing.
func renameExcl(fromDir int, from string, toDir int, to string) error {
	return unix.Renameat2(fromDir, from, toDir, to, unix.RENAME_NOREPLACE)
}

// realDir is where the folder a place was opened in really is now,
// asked of the kernel by its descriptor.
func realDir(p place) (string, error) {
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(p.fd()))
}
