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
// 16). Writable mappings (data, bss, heap) are never touched, and
// nothing is released while a debugger traces the process (its
// breakpoints live in private copies of code pages, which this would
// drop). It returns the resident file-backed memory (RssFile, in bytes)
// before and after.
func releaseExecutablePages() (before, after int64, err error) {
	before, traced := selfStatus()
	if traced {
		return before, before, nil
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return before, before, err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return before, before, err
	}
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
	after, _ = selfStatus()
	return before, after, err
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

// selfStatus reads /proc/self/status: the resident file-backed memory
// in bytes (RssFile; 0 when it cannot be read), and whether a tracer
// (a debugger) is attached.
func selfStatus() (rssFile int64, traced bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "RssFile":
			kb, _ := strconv.ParseInt(f[0], 10, 64)
			rssFile = kb << 10
		case "TracerPid":
			traced = f[0] != "0"
		}
	}
	return rssFile, traced
}
