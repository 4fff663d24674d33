//go:build !linux

package agent

// physicalMemory is the machine's memory in bytes: 0, not known here
// (the runs' concurrency alone bounds them).
func physicalMemory() int64 { return 0 }
