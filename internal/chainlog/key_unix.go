//go:build linux || darwin

package chainlog

import (
	"fmt"
	"os"
	"syscall"
)

// fileKey names a file's identity and last change: its device, inode,
// size, and modification and change times ("" when it cannot be read).
func fileKey(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return ""
	}
	mt, ct := times(&st)
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d:%d:%d:%d", st.Dev, st.Ino, fi.Size(), mt, ct)
}
