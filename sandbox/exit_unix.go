//go:build linux || darwin

package sandbox

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// exitStatus is the exit code of a finished command, or -1 and the
// signal's name when a signal ended it (bwrap reports that as 128+n).
func exitStatus(ps *os.ProcessState, bwrap bool) (int, string) {
	if ps == nil {
		return -1, ""
	}
	ws := ps.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return -1, unix.SignalName(ws.Signal())
	}
	code := ws.ExitStatus()
	// bwrap reports a command killed by signal n as 128+n.
	if bwrap && code > 128 && code <= 128+31 {
		return -1, unix.SignalName(syscall.Signal(code - 128))
	}
	return code, ""
}
