//go:build unix

package cli

import "golang.org/x/sys/unix"

// signalNum returns the number of the signal named like "SIGKILL", or 0.
func signalNum(name string) int { return int(unix.SignalNum(name)) }
