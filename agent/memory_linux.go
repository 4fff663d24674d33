package agent

import (
	"sync"
	"syscall"
)

// physicalMemory is the machine's memory in bytes (0: not known).
var physicalMemory = sync.OnceValue(func() int64 {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
})
