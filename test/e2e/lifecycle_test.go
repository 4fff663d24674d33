//go:build linux

package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// TestStdoutOverLimit: an executor that prints more than the sandbox's
// 8 MiB stdout limit gets a device_error that says so, with the limit,
// not a JSON decoding error about the cut output.
func TestStdoutOverLimit(t *testing.T) {
	w := newWorld(t)
	w.pair()
	w.start()
	info := w.wait(w.enqueue("big_output", map[string]any{"bytes": 9 << 20}, refserver.EnqueueOptions{}))
	r := result(t, info)
	msg, _ := r["error"].(string)
	if r["error_class"] != "device_error" || !strings.Contains(msg, "more than 8 MiB") || !strings.Contains(msg, "big_output") {
		t.Fatalf("state %s, result %.400s", info.State, info.ResultBody)
	}
	if strings.Contains(msg, "EOF") {
		t.Errorf("the error still reports the cut output's decoding: %s", msg)
	}
}

// TestPausedAgent: an agent stopped (SIGSTOP: a VM pause, a debugger,
// heavy swapping) for longer than its run's deadline plus the
// watchdog's 10 s, while a 4 s executor with an 8 s deadline runs, is
// resumed: the run had ended by itself, so its ok result is delivered,
// and the watchdog does not exit 124.
func TestPausedAgent(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	// A first invocation, so that the executor and the shim are cached
	// and the pause falls in the run.
	if info := w.wait(w.enqueue("nap", map[string]any{"seconds": 0}, refserver.EnqueueOptions{})); info.State != "done" {
		t.Fatalf("first nap: %s %s", info.State, info.ResultBody)
	}
	id := w.enqueue("nap", map[string]any{"seconds": 4}, refserver.EnqueueOptions{DeadlineMS: 8000})
	if !waitCmdline("nap.py", 30*time.Second) {
		t.Fatal("the executor never started")
	}
	time.Sleep(300 * time.Millisecond)
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(25 * time.Second)
	resumed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	info := waitEnd(t, w, p, id)
	// What a user would see: the result arrives shortly after the resume
	// (the run had ended; only its collection and delivery remain).
	t.Logf("result %s after the resume", time.Since(resumed).Round(100*time.Millisecond))
	if r := result(t, info); info.State != "done" || r["ok"] != true {
		t.Fatalf("state %s, result %s", info.State, info.ResultBody)
	}
	if logHas(p, "watchdog") {
		t.Error("the log names the watchdog")
	}

	// Paused while idle, in its long poll, for longer than the poll:
	// an invocation queued meanwhile is taken soon after the resume
	// (what this prints is the figure: the run is 1 s).
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	id = w.enqueue("nap", map[string]any{"seconds": 1}, refserver.EnqueueOptions{DeadlineMS: 8000})
	time.Sleep(20 * time.Second)
	resumed = time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	info = waitEnd(t, w, p, id)
	t.Logf("paused while idle: result %s after the resume, for a 1 s run", time.Since(resumed).Round(100*time.Millisecond))
	if r := result(t, info); info.State != "done" || r["ok"] != true {
		t.Fatalf("state %s, result %s", info.State, info.ResultBody)
	}
}

// waitEnd waits, up to 60 s, for the invocation's result, failing at
// once when the agent exits.
func waitEnd(t *testing.T, w *world, p *agentProc, id string) refserver.InvocationInfo {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-p.done:
			t.Fatalf("the agent exited: %v", p.err)
		default:
		}
		if info, ok := w.srv.Invocation(id); ok && (info.State == "done" || info.State == "failed") {
			return info
		}
		if time.Now().After(end) {
			t.Fatalf("no result for %s within 60 s", id)
		}
	}
}

// waitCmdline waits until a process whose command line has s runs.
func waitCmdline(s string, within time.Duration) bool {
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && bytes.Contains(b, []byte(s)) {
				return true
			}
		}
	}
	return false
}

// TestBundleDownloadFailsOnce: the executor's bundle GET is cut halfway
// once, then answered 502 once: the agent fetches it again and the
// invocation is done, with no .tmp folder left in the cache.
func TestBundleDownloadFailsOnce(t *testing.T) {
	w := newWorld(t)
	w.pair()
	var calls atomic.Int32
	w.srv.SetExecutorGate(func(string) int {
		switch calls.Add(1) {
		case 1:
			return refserver.CutAnswer
		case 2:
			return 502
		}
		return 0
	})
	w.start()
	info := w.wait(w.enqueue("echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{DeadlineMS: 30000}))
	if r := result(t, info); info.State != "done" || r["ok"] != true {
		t.Fatalf("state %s, result %s", info.State, info.ResultBody)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d bundle GETs, want 3", n)
	}
	if left, _ := filepath.Glob(filepath.Join(w.cacheDir(), "executors", "*.tmp")); len(left) != 0 {
		t.Errorf("left in the cache: %v", left)
	}
}
