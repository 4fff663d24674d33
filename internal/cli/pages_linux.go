package cli

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// releaseExecutablePages drops this process's mappings of its own
// executable's read-only pages (code, read-only data, the function
// tables): madvise(MADV_DONTNEED) on each read-only mapping of the
// file. The pages stay in the page cache; the next touch maps them back
// from it, so only what the process goes on using comes back. Package
// initialisation of everything linked in, and the kernel mapping 64 KiB
// around every fault, leave most of a 26 MB executable resident after
// start-up, which waiting for the server never touches again (issue
// 16). Writable mappings (data, bss, heap) are never touched. It
// returns the resident file-backed memory (RssFile, in bytes) before
// and after.
func releaseExecutablePages() (before, after int64, err error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return 0, 0, err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, 0, err
	}
	before = rssFile()
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		start, end, ok := readOnlyMappingOf(sc.Text(), st.Dev, st.Ino)
		if !ok {
			continue
		}
		// A raw syscall: the range is not Go memory, and is never read
		// or written here.
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_DONTNEED); e != 0 && err == nil {
			err = e
		}
	}
	return before, rssFile(), err
}

// readOnlyMappingOf parses a line of /proc/self/maps ("start-end perms
// offset major:minor inode path") and reports the range when it maps
// the file dev/ino without write permission.
func readOnlyMappingOf(line string, dev, ino uint64) (start, end uintptr, ok bool) {
	f := strings.Fields(line)
	if len(f) < 6 || len(f[1]) < 2 || f[1][1] == 'w' {
		return 0, 0, false
	}
	if i, err := strconv.ParseUint(f[4], 10, 64); err != nil || i != ino {
		return 0, 0, false
	}
	major, minor, ok := strings.Cut(f[3], ":")
	if !ok {
		return 0, 0, false
	}
	ma, err1 := strconv.ParseUint(major, 16, 32)
	mi, err2 := strconv.ParseUint(minor, 16, 32)
	if err1 != nil || err2 != nil || unix.Mkdev(uint32(ma), uint32(mi)) != dev {
		return 0, 0, false
	}
	a, b, ok := strings.Cut(f[0], "-")
	if !ok {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(a, 16, 64)
	e, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}

// rssFile is this process's resident file-backed memory in bytes, from
// /proc/self/status (0 when it cannot be read).
func rssFile() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
