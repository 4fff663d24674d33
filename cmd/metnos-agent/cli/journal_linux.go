package cli

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// isJournalStream reports whether f is the stream to the journal that
// stream, JOURNAL_STREAM's value, names: "DEV:INODE" in decimal, which
// systemd sets to the device and inode of the stream it connected stdout
// or stderr to (systemd.exec(5)). A process that inherited the variable
// but whose f goes elsewhere (a terminal, a pipe, a file) is not
// writing to the journal, and an f that cannot be looked at is taken
// not to.
func isJournalStream(f *os.File, stream string) bool {
	d, i, ok := strings.Cut(stream, ":")
	if !ok {
		return false
	}
	dev, err := strconv.ParseUint(d, 10, 64)
	if err != nil {
		return false
	}
	ino, err := strconv.ParseUint(i, 10, 64)
	if err != nil {
		return false
	}
	fi, err := f.Stat() // fstat
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == dev && uint64(st.Ino) == ino
}
