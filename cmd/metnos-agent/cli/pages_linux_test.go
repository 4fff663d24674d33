package cli

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// pagesData is written before the release and read after it: the
// executable's writable data must keep what the process wrote.
var pagesData = []string{"before"}

// TestReleaseExecutablePages: after start-up the process gives back the
// pages of its executable it mapped, so its resident file-backed memory
// drops, and it goes on running with its code and its data intact.
func TestReleaseExecutablePages(t *testing.T) {
	pagesData[0] = "written"
	before, after, err := releaseExecutablePages()
	if err != nil {
		t.Fatal(err)
	}
	if before <= 0 {
		t.Fatalf("RssFile before the release: %d, want > 0", before)
	}
	if after >= before {
		t.Errorf("RssFile %d KiB after the release, %d KiB before: nothing was given back", after>>10, before>>10)
	}
	// The code runs again (paged back in from the page cache) and the
	// writable data kept what was written.
	if got := fmt.Sprintf("%s-%d", strings.ToUpper(pagesData[0]), len(pagesData)); got != "WRITTEN-1" {
		t.Errorf("after the release: %q, want WRITTEN-1", got)
	}
	if _, err := os.ReadFile("/proc/self/status"); err != nil {
		t.Error(err)
	}
	t.Logf("RssFile %d KiB before, %d KiB after", before>>10, after>>10)
}

// TestReadOnlyMappingOf: only read-only mappings of the executable's
// own file (device and inode) are chosen.
func TestReadOnlyMappingOf(t *testing.T) {
	dev := uint64(0xfe00) // fe:00
	for _, c := range []struct {
		line string
		ok   bool
	}{
		{"00400000-00f64000 r-xp 00000000 fe:00 10002455 /usr/bin/metnos-agent", true},
		{"00f64000-01c26000 r--p 00b64000 fe:00 10002455 /usr/bin/metnos-agent", true},
		{"01c26000-01cd5000 rw-p 01826000 fe:00 10002455 /usr/bin/metnos-agent", false}, // data: written
		{"00400000-00f64000 r-xp 00000000 fe:00 10002456 /usr/bin/other", false},        // another file
		{"00400000-00f64000 r-xp 00000000 fe:01 10002455 /mnt/metnos-agent", false},     // another device
		{"01cd5000-03d25000 rw-p 00000000 00:00 0", false},
		{"7ffd4b5e2000-7ffd4b5e4000 r-xp 00000000 00:00 0 [vdso]", false},
	} {
		_, _, ok := readOnlyMappingOf(c.line, dev, 10002455)
		if ok != c.ok {
			t.Errorf("%q: chosen %v, want %v", c.line, ok, c.ok)
		}
	}
	s, e, ok := readOnlyMappingOf("00400000-00f64000 r-xp 00000000 fe:00 10002455 /usr/bin/metnos-agent", dev, 10002455)
	if !ok || s != 0x400000 || e != 0xf64000 {
		t.Errorf("range %#x-%#x %v, want 0x400000-0xf64000", s, e, ok)
	}
}

// TestReleaseExecutablePagesTraced: under a debugger (here strace, a
// tracer as gdb is) nothing is released, so that breakpoints written
// into the code stay.
func TestReleaseExecutablePagesTraced(t *testing.T) {
	if os.Getenv("METNOS_TEST_PAGES_CHILD") == "1" {
		before, after, err := releaseExecutablePages()
		fmt.Printf("pages: %d %d %v\n", before, after, err)
		return
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skipf("needs strace as the tracer: %v", err)
	}
	cmd := exec.Command(strace, "-f", "-o", os.DevNull, os.Args[0], "-test.run=^TestReleaseExecutablePagesTraced$", "-test.count=1")
	cmd.Env = append(os.Environ(), "METNOS_TEST_PAGES_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "ptrace") {
			t.Skipf("tracing is not allowed here: %s", out)
		}
		t.Fatalf("%v\n%s", err, out)
	}
	var before, after int64
	var errText string
	i := strings.Index(string(out), "pages: ")
	if i < 0 {
		t.Fatalf("the traced child said nothing:\n%s", out)
	}
	fmt.Sscanf(string(out[i:]), "pages: %d %d %s", &before, &after, &errText)
	if before <= 0 || after != before {
		t.Errorf("traced: RssFile %d KiB before, %d KiB after: want nothing released", before>>10, after>>10)
	}
}
