//go:build unix

package fetch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/sandbox/shim"
)

func TestMain(m *testing.M) {
	// The test binary is also the sandbox's shim (TestRuntimeFromSystemPython).
	shim.MainIfShim()
	// As a child of TestKill9Resume: download, then exit.
	if spec := os.Getenv("METNOS_FETCH_CHILD"); spec != "" {
		f := strings.Split(spec, "|")
		size, _ := strconv.ParseInt(f[3], 10, 64)
		chunk, _ := strconv.ParseInt(f[4], 10, 64)
		err := File(context.Background(), f[0], f[1], Pin{SHA256: f[2], Size: size}, Options{Chunk: chunk, Backoff: time.Millisecond})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestKill9Resume: a downloading process killed with -9 at a random
// point loses at most the chunk in flight; the next run resumes and
// installs the verified file. The server's byte counter says how much
// was fetched twice.
func TestKill9Resume(t *testing.T) {
	const size, chunk = 2_000_000, 100_000
	m, srv := newMirror(t, size)
	// Slow enough to be caught in the middle.
	m.delay = 15 * time.Millisecond
	dst := filepath.Join(t.TempDir(), "python.tar.gz")
	pin := m.pin()
	child := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("METNOS_FETCH_CHILD=%s|%s|%s|%d|%d", srv.URL, dst, pin.SHA256, size, chunk))
		return cmd
	}
	cmd := child()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m.mu.Lock()
		served := m.served
		m.mu.Unlock()
		if served >= size/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the download never got half-way")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if _, err := os.Stat(dst); err == nil {
		t.Fatal("a file was installed by the killed download")
	}
	m.mu.Lock()
	before := m.served
	m.mu.Unlock()
	if out, err := child().CombinedOutput(); err != nil {
		t.Fatalf("the resumed download failed: %v\n%s", err, out)
	}
	check(t, dst, m, nil, "")
	m.mu.Lock()
	total := m.served
	m.mu.Unlock()
	again := total - size
	t.Logf("killed after %d bytes served; %d bytes fetched twice (chunk %d)", before, again, chunk)
	// In flight when it died: the chunks fetched at once, and the one
	// whose sync had not been recorded yet.
	if limit := int64(DefaultParallel+1) * chunk; again > limit {
		t.Errorf("%d bytes were fetched twice, more than the chunks in flight (%d)", again, limit)
	}
}
