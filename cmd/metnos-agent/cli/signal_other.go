//go:build !unix

package cli

// signalNum returns 0: signals have no numbers here.
func signalNum(string) int { return 0 }
