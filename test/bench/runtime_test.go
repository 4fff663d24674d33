package bench

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/testkit/pbstest"
	"github.com/metnos/agent/testkit/testbin"
)

// stdlibImports are standard-library modules the real Metnos shim
// (executor_helpers) and its file executors import.
const stdlibImports = "import json, mimetypes, urllib.parse, concurrent.futures, pathlib, logging, hashlib, shutil, re, typing, tempfile, datetime"

// TestRuntimeBytecode measures what a provisioned Python pays to start
// an executor's imports: a python-build-standalone-layout archive of
// this machine's Python (sources only, as python-build-standalone ships
// them), installed by fetch.Install, which compiles its standard
// library, against the same archive as shipped (unpacked by
// fetch.Extract alone: each start compiles what it imports, which is
// what the Rust client runs, and this agent did before), and against
// the interpreter where it is installed, with its distribution's
// bytecode (the baseline). Interleaved rounds, medians; information
// only, except that Python itself must say the installed runtime used
// its bytecode and the shipped one had none.
//
//	go test ./test/bench -run RuntimeBytecode -count=1 -v
func TestRuntimeBytecode(t *testing.T) {
	if testing.Short() {
		t.Skip("runtime benchmark skipped under -short")
	}
	sysPy, _, ver, err := pbstest.System()
	if errors.Is(err, pbstest.ErrNoPython) {
		t.Skip(err)
	}
	var arc bytes.Buffer
	if _, err := pbstest.Write(&arc, gzip.BestSpeed); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "python.tar.gz", time.Unix(0, 0), bytes.NewReader(arc.Bytes()))
	}))
	defer srv.Close()
	sum := sha256.Sum256(arc.Bytes())
	dir := t.TempDir()
	rt, err := fetch.Install(context.Background(), layout.Layout{Cache: filepath.Join(dir, "cache")},
		fetch.Source{URL: srv.URL + "/cpython-" + ver + "-install_only.tar.gz", Pin: fetch.Pin{SHA256: hex.EncodeToString(sum[:]), Size: int64(arc.Len())}}, fetch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ap := filepath.Join(dir, "python.tar.gz")
	if err := os.WriteFile(ap, arc.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	shipped := filepath.Join(dir, "shipped")
	if err := fetch.Extract(ap, shipped, fetch.Limits{}); err != nil {
		t.Fatal(err)
	}
	shippedPy := filepath.Join(shipped, "python", "bin", "python3")

	// Python is the judge of where the code came from.
	verbose := func(py string) string {
		var stderr bytes.Buffer
		cmd := exec.Command(py, "-B", "-v", "-c", "import json")
		cmd.Env, cmd.Stderr = []string{}, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s -v: %v\n%s", py, err, stderr.Bytes())
		}
		return stderr.String()
	}
	if v := verbose(rt.Interpreter); !strings.Contains(v, "code object from '"+filepath.Join(rt.Dir, "lib")) {
		t.Errorf("the installed runtime did not use bytecode of its own for json:\n%s", testbin.Grep(v, "json"))
	}
	if v := verbose(shippedPy); strings.Contains(v, "code object from '"+filepath.Join(shipped, "python", "lib")) {
		t.Errorf("the archive as shipped has bytecode: this bench measures nothing:\n%s", testbin.Grep(v, "json"))
	}

	variants := []variant{
		{"python3 of the system", command([]string{sysPy, "-B", "-c", stdlibImports}, []string{})},
		{"runtime, installed", command([]string{rt.Interpreter, "-B", "-c", stdlibImports}, []string{})},
		{"runtime, as shipped", command([]string{shippedPy, "-B", "-c", stdlibImports}, []string{})},
	}
	n := 30
	times := interleave(t, variants, n, "")
	var b strings.Builder
	fmt.Fprintf(&b, "\nstarting Python and importing %d standard-library modules, %d interleaved rounds, medians:\n", strings.Count(stdlibImports, ",")+1, n)
	base := median(times[0])
	for i, v := range variants {
		m := median(times[i])
		fmt.Fprintf(&b, "  %-24s %8s  %5.2f× the system's python3\n", v.name, ms(m), ratio(m, base))
	}
	t.Log(b.String())
}
