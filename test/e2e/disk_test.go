//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// dataDisk is the agent's data folder on a small tmpfs of its own, in a
// private mount namespace that a holder process keeps alive across
// agent restarts: the rest of the machine never sees the mount, and it
// goes away with the holder.
type dataDisk struct {
	holder *exec.Cmd
	// root is the holder's view of the file system, from outside its
	// namespace (/proc/<pid>/root): the test reads and changes the data
	// folder through it.
	root string
}

// path is p (a path under the agent's data folder) as the test reaches
// it.
func (d *dataDisk) path(p string) string { return filepath.Join(d.root, p) }

// onSmallDisk moves the paired device's data folder onto a tmpfs of
// size bytes, in a mount namespace of its own. It needs root.
func (w *world) onSmallDisk(size int64) *dataDisk {
	w.t.Helper()
	if os.Geteuid() != 0 {
		w.t.Skip("a data folder on a small tmpfs needs root (a private mount namespace)")
	}
	for _, tool := range []string{"unshare", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			w.t.Skipf("a data folder on a small tmpfs needs %s: %v", tool, err)
		}
	}
	data := w.dataDir()
	seed := data + ".seed"
	if err := os.Rename(data, seed); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Mkdir(data, 0o700); err != nil {
		w.t.Fatal(err)
	}
	script := `mount -t tmpfs -o size=$2,mode=0700 metnos-e2e-data "$0" && cp -a "$1"/. "$0"/ && echo ready && exec sleep 3600`
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script, data, seed, fmt.Sprint(size))
	out, err := cmd.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		w.t.Fatalf("mounting a tmpfs in a private mount namespace: %q %v", line, err)
	}
	return &dataDisk{holder: cmd, root: fmt.Sprintf("/proc/%d/root", cmd.Process.Pid)}
}

// startOn runs the agent in the data disk's mount namespace, as start
// does outside it.
func (w *world) startOn(d *dataDisk) *agentProc {
	w.t.Helper()
	w.runs++
	logPath := filepath.Join(w.dir, fmt.Sprintf("agent-%d.log", w.runs))
	f, err := os.Create(logPath)
	if err != nil {
		w.t.Fatal(err)
	}
	// nsenter execs the agent (no fork for a mount namespace): its pid
	// is the agent's.
	cmd := exec.Command("nsenter", "-t", fmt.Sprint(d.holder.Process.Pid), "-m", "--", filepath.Join(binDir, "metnos-agent"), "run")
	cmd.Env = w.env()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	p := &agentProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	w.t.Cleanup(func() { p.kill9() })
	return p
}

// waitFor polls cond for up to within, and fails with what otherwise.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDiskFillsDuringRun: an executor fills the data folder's disk, so
// its result cannot be spooled. The run is done once, the server gets
// its result all the same (done, not delivered forever), the agent says
// so once, and when space returns the spool catches up: the ledger
// records the invocation, no STARTED marker is left, and after a
// restart it is neither run again nor reported as outcome unknown.
func TestDiskFillsDuringRun(t *testing.T) {
	w := newWorld(t)
	w.pair()
	d := w.onSmallDisk(16 << 20)
	p := w.startOn(d)
	spool := d.path(filepath.Join(w.dataDir(), "spool"))

	id := w.enqueue("fill_disk", map[string]any{"folder": w.work, "tag": "fill"}, refserver.EnqueueOptions{})
	info := w.wait(id)
	if r := result(t, info); info.State != "done" || r["ok"] != true {
		t.Fatalf("state %s, result %.300s", info.State, info.ResultBody)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.path(w.dataDir()), &st); err != nil || st.Bavail*uint64(st.Bsize) >= 4096 {
		t.Fatalf("the data disk was not full after the run (%d bytes free, %v): the test proves nothing", st.Bavail*uint64(st.Bsize), err)
	}
	if m, _ := filepath.Glob(filepath.Join(spool, "results", "*.json")); len(m) != 0 {
		t.Fatalf("a result was spooled on the full disk: %v", m)
	}
	waitFor(t, 5*time.Second, "the log does not say the result could not be spooled", func() bool {
		return logHas(p, "could not spool the result")
	})

	// Space returns. The next round of the run loop (here, the one that
	// brings the next invocation) records the first.
	fillers, _ := filepath.Glob(d.path(filepath.Join(w.dataDir(), "shimdata", "filler-*.bin")))
	if len(fillers) != 1 {
		t.Fatalf("filler files %v", fillers)
	}
	if err := os.Remove(fillers[0]); err != nil {
		t.Fatal(err)
	}
	next := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "next"}, refserver.EnqueueOptions{})
	if info := w.wait(next); info.State != "done" {
		t.Fatalf("the next invocation: state %s, result %.300s", info.State, info.ResultBody)
	}
	ledger := filepath.Join(spool, "executed.log")
	waitFor(t, 10*time.Second, "the ledger does not record the invocation whose result could not be spooled", func() bool {
		return slices.Contains(lines(t, ledger), id)
	})
	waitFor(t, 10*time.Second, "STARTED markers are left", func() bool {
		m, _ := filepath.Glob(filepath.Join(spool, "started", "*"))
		return len(m) == 0
	})
	if n := strings.Count(readLog(p), "could not spool the result"); n != 1 {
		t.Errorf("the log says %d times that the result could not be spooled, want once", n)
	}
	p.stop(t)

	// A restart: nothing is reported unknown, nothing runs again.
	var posts atomic.Int32
	w.srv.SetResultGate(func(string, []byte) int { posts.Add(1); return 0 })
	p = w.startOn(d)
	waitFor(t, 10*time.Second, "the restarted agent does not run", func() bool { return logHas(p, "agent running") })
	time.Sleep(time.Second)
	if logHas(p, "execution_outcome_unknown") || posts.Load() != 0 {
		t.Errorf("after the restart, %d results were sent; log:\n%s", posts.Load(), readLog(p))
	}
	if got := lines(t, filepath.Join(w.work, "ran.log")); !slices.Equal(got, []string{"fill", "next"}) {
		t.Errorf("runs %q, want fill and next once each", got)
	}
	if info, _ := w.srv.Invocation(id); len(info.ResultBodies) != 1 {
		t.Errorf("the server got %d results for the invocation that filled the disk, want 1", len(info.ResultBodies))
	}
}

// readLog is an agent's log so far.
func readLog(p *agentProc) string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// TestTruncatedSpooledResult: a spooled result cut in half (a disk
// error, a crash of the file system) is found at start: the server
// receives an execution_outcome_unknown result for its invocation,
// which does not run again, the agent logs it, and the damaged bytes
// are kept in dead-results.
func TestTruncatedSpooledResult(t *testing.T) {
	w := newWorld(t)
	w.pair()
	w.srv.SetResultGate(func(string, []byte) int { return 503 })
	p := w.start()
	id := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "a"}, refserver.EnqueueOptions{})
	spooled := filepath.Join(w.dataDir(), "spool", "results", id+".json")
	waitFile(t, spooled, 60*time.Second)
	p.kill9()
	body, err := os.ReadFile(spooled)
	if err != nil {
		t.Fatal(err)
	}
	half := body[:len(body)/2]
	if err := os.WriteFile(spooled, half, 0o600); err != nil {
		t.Fatal(err)
	}

	w.srv.SetResultGate(nil)
	p = w.start()
	info := w.wait(id)
	r := result(t, info)
	if r["error_class"] != "execution_outcome_unknown" || r["invocation_id"] != id {
		t.Fatalf("result after the damaged spool: %s", info.ResultBody)
	}
	if l := logLine(p, "spooled result was damaged", id); l == "" {
		t.Error("the agent's log does not name the invocation whose spooled result was damaged")
	}
	dead, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "dead-results", id+".damaged.*.json"))
	if len(dead) != 1 {
		t.Fatalf("dead-results %v", dead)
	}
	if b, _ := os.ReadFile(dead[0]); string(b) != string(half) {
		t.Errorf("the damaged bytes kept are %q, want %q", b, half)
	}
	if n := len(lines(t, filepath.Join(w.work, "ran.log"))); n != 1 {
		t.Errorf("the executor ran %d times, want 1", n)
	}
}

// TestDeviceErrorLogged: the agent's own log says why a run ended in a
// device_error, not only the result the server gets.
func TestDeviceErrorLogged(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	// touch_once without its folder: a Python traceback, no JSON.
	id := w.enqueue("touch_once", map[string]any{"tag": "x"}, refserver.EnqueueOptions{})
	info := w.wait(id)
	if r := result(t, info); r["error_class"] != "device_error" {
		t.Fatalf("result %s", info.ResultBody)
	}
	waitFor(t, 5*time.Second, "the log of the run does not carry the error", func() bool {
		return logLine(p, "executed", id, "KeyError") != ""
	})
}
