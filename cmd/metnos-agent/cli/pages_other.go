//go:build !linux

package cli

// releaseExecutablePages does nothing outside Linux.
func releaseExecutablePages() (before, after int64, err error) { return 0, 0, nil }
