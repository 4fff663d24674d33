package bench

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/internal/pbstest"
)

// stdlibImports are standard-library modules the real Metnos shim
// (executor_helpers) and its file executors import.
const stdlibImports = "import json, mimetypes, urllib.parse, concurrent.futures, pathlib, logging, hashlib, shutil, re, typing, tempfile, datetime"

// TestRuntimeBytecode measures what a provisioned Python pays to start
// an executor's imports: a python-build-standalone-layout archive of
// this machine's Python, with its standard library's bytecode, unpacked
// by fetch.Extract, against the same interpreter where it is installed
// (the baseline), and against the same unpacked tree with every file
// given the time of the extraction, which is what Extract left before
// it kept the archive's times: all the bytecode is then stale, and
// Python compiles the modules again on each start. Interleaved rounds,
// medians; information only, except that Python itself must say it
// used the unpacked bytecode (and that the stale variant really is).
//
//	go test ./test/bench -run RuntimeBytecode -count=1 -v
func TestRuntimeBytecode(t *testing.T) {
	if testing.Short() {
		t.Skip("runtime benchmark skipped under -short")
	}
	sysPy, _, _, err := pbstest.System()
	if errors.Is(err, pbstest.ErrNoPython) {
		t.Skip(err)
	}
	var arc bytes.Buffer
	if _, err := pbstest.Write(&arc, gzip.BestSpeed); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ap := filepath.Join(dir, "python.tar.gz")
	if err := os.WriteFile(ap, arc.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	kept, stale := filepath.Join(dir, "kept"), filepath.Join(dir, "stale")
	for _, d := range []string{kept, stale} {
		if err := fetch.Extract(ap, d, fetch.Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	filepath.WalkDir(stale, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			os.Chtimes(p, now, now)
		}
		return nil
	})
	keptPy, stalePy := filepath.Join(kept, "python", "bin", "python3"), filepath.Join(stale, "python", "bin", "python3")

	// Python is the judge of whether the bytecode is used.
	verbose := func(py string) string {
		var stderr bytes.Buffer
		cmd := exec.Command(py, "-B", "-v", "-c", "import json")
		cmd.Env, cmd.Stderr = []string{}, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s -v: %v\n%s", py, err, stderr.Bytes())
		}
		return stderr.String()
	}
	if v := verbose(keptPy); !strings.Contains(v, "code object from '"+filepath.Join(kept, "python", "lib")) || strings.Contains(v, "bytecode is stale") {
		t.Errorf("the unpacked runtime did not use its own bytecode for json:\n%s", grepLines(v, "json"))
	}
	if v := verbose(stalePy); !strings.Contains(v, "bytecode is stale") {
		t.Errorf("the variant with the extraction's times does not have stale bytecode: it measures nothing:\n%s", grepLines(v, "json"))
	}

	variants := []variant{
		{"installed python", command([]string{sysPy, "-B", "-c", stdlibImports}, []string{})},
		{"unpacked, times kept", command([]string{keptPy, "-B", "-c", stdlibImports}, []string{})},
		{"unpacked, times reset", command([]string{stalePy, "-B", "-c", stdlibImports}, []string{})},
	}
	n := 30
	times := make([][]time.Duration, len(variants))
	for round := 0; round < warmups+n; round++ {
		for k := range variants {
			i := (round + k) % len(variants)
			d, err := variants[i].run()
			if err != nil {
				t.Fatalf("%s: %v", variants[i].name, err)
			}
			if round >= warmups {
				times[i] = append(times[i], d)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nstarting Python and importing %d standard-library modules, %d interleaved rounds, medians:\n", strings.Count(stdlibImports, ",")+1, n)
	base := median(times[0])
	for i, v := range variants {
		m := median(times[i])
		fmt.Fprintf(&b, "  %-24s %8s  %5.2f× the installed python\n", v.name, ms(m), ratio(m, base))
	}
	t.Log(b.String())
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
