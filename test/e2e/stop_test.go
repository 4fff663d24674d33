//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"

	"github.com/metnos/agent/testkit/runcgroups"
)

// spooled lists the results waiting in the agent's spool.
func (w *world) spooled(t *testing.T) []string {
	t.Helper()
	ps, err := filepath.Glob(filepath.Join(w.dataDir(), "spool", "results", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// logLine returns the first line of an agent's log that has every one
// of subs, or "".
func logLine(p *agentProc, subs ...string) string {
	b, _ := os.ReadFile(p.log)
next:
	for _, l := range strings.Split(string(b), "\n") {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		return l
	}
	return ""
}

// TestStopDeliversFinishedRun: SIGTERM while an executor runs: the
// agent says which run it waits for, lets it finish, and delivers its
// result before it exits, so the server does not show it unanswered
// until the next start. It leaves none of the run cgroups it kept for
// its next runs under /sys/fs/cgroup.
func TestStopDeliversFinishedRun(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	pid := p.cmd.Process.Pid
	// Runs before the one the stop waits for: the first cgroup a process
	// gives back is removed, the next ones are kept for the next runs.
	for i := range 2 {
		if info := w.wait(w.enqueue("echo_args", map[string]any{"i": i}, refserver.EnqueueOptions{})); info.State != "done" {
			t.Fatalf("echo_args: state %s, result %s", info.State, info.ResultBody)
		}
	}
	if pooled := runcgroups.Of(pid); len(pooled) > 0 {
		t.Logf("run cgroups kept between runs: %v", pooled)
	} else {
		t.Log("runs get no cgroup here (not root, or no cgroup with pids and memory to make): no run cgroup to be left")
	}
	id := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "slow", "sleep_ms": 2500}, refserver.EnqueueOptions{DeadlineMS: 60000})
	waitFile(t, filepath.Join(w.work, "started-slow"), 60*time.Second)
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.exitCode(t, 25*time.Second); code != 0 {
		t.Errorf("the agent exited %d after SIGTERM, want 0", code)
	}
	info, _ := w.srv.Invocation(id)
	if info.ResultBody == nil {
		t.Fatalf("the agent exited without delivering the result of the run it waited for (state %s, spool %v)", info.State, w.spooled(t))
	}
	if r := result(t, info); r["ok"] != true {
		t.Errorf("result %s", info.ResultBody)
	}
	if l := logLine(p, "waiting for this run", id, "touch_once"); l == "" {
		t.Error("the log does not say which run (invocation id and executor) the stop waits for")
	}
	if len(w.spooled(t)) != 0 {
		t.Errorf("delivered results left in the spool: %v", w.spooled(t))
	}
	if left := runcgroups.Of(pid); len(left) > 0 {
		t.Errorf("the agent stopped and left its run cgroups: %v", left)
	}
}

// TestSecondSignalStopsNow: SIGTERM while an executor runs, and a
// second SIGTERM while its result cannot get through: the agent exits
// at once, the result stays in the spool, and the next start delivers
// it, once.
func TestSecondSignalStopsNow(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	held := make(chan struct{}, 10)
	release := make(chan struct{})
	w.srv.SetResultGate(func(string, []byte) int {
		// The server does not answer (nor store) the result until the
		// test lets it go, and then refuses it for now.
		held <- struct{}{}
		<-release
		return 503
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	id := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "slow", "sleep_ms": 1500}, refserver.EnqueueOptions{DeadlineMS: 60000})
	waitFile(t, filepath.Join(w.work, "started-slow"), 60*time.Second)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("after SIGTERM, the agent did not try to deliver the result of the run it waited for")
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	start := time.Now()
	p.exitCode(t, 5*time.Second)
	t.Logf("exited %s after the second SIGTERM", time.Since(start).Round(time.Millisecond))
	if !logHas(p, "stopping now") {
		t.Error("the log does not say the second signal stops now")
	}
	if n := len(w.spooled(t)); n != 1 {
		t.Fatalf("%d results in the spool after stopping now, want the one not delivered", n)
	}
	close(release)
	w.srv.SetResultGate(nil)
	if info, _ := w.srv.Invocation(id); info.ResultBody != nil {
		t.Fatal("the server stored a result the gate held")
	}
	q := w.start()
	info := w.wait(id)
	if r := result(t, info); r["ok"] != true {
		t.Errorf("result %s", info.ResultBody)
	}
	q.stop(t)
	info, _ = w.srv.Invocation(id)
	if info.ResultPosts != 1 {
		t.Errorf("the result was posted %d times past the gate, want once", info.ResultPosts)
	}
	if ran := lines(t, filepath.Join(w.work, "ran.log")); len(ran) != 1 {
		t.Errorf("the executor ran %d times, want once: %v", len(ran), ran)
	}
	if n := len(w.spooled(t)); n != 0 {
		t.Errorf("%d results left in the spool after the restart delivered it", n)
	}
}

// unitStopTimeout is TimeoutStopSec of the systemd unit the packages
// install: how long systemd waits after SIGTERM before SIGKILL.
func unitStopTimeout(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "packaging", "linux", "metnos-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "TimeoutStopSec="); ok {
			d, err := time.ParseDuration(v + "s")
			if err != nil {
				t.Fatalf("TimeoutStopSec=%s: %v", v, err)
			}
			return d
		}
	}
	t.Fatal("the unit sets no TimeoutStopSec")
	return 0
}

// TestStopDeliveryBounded: SIGTERM once, and the server never answers
// the result: the agent gives up delivering it in time to exit by
// itself before systemd's stop timeout would kill it, says so, and
// keeps the result in the spool.
func TestStopDeliveryBounded(t *testing.T) {
	limit := unitStopTimeout(t)
	w := newWorld(t)
	w.pair()
	p := w.start()
	held := make(chan struct{}, 10)
	release := make(chan struct{})
	w.srv.SetResultGate(func(string, []byte) int {
		held <- struct{}{}
		<-release
		return 503
	})
	t.Cleanup(func() { close(release) })
	w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "slow", "sleep_ms": 500}, refserver.EnqueueOptions{DeadlineMS: 60000})
	waitFile(t, filepath.Join(w.work, "started-slow"), 60*time.Second)
	p.cmd.Process.Signal(syscall.SIGTERM)
	stopped := time.Now()
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("after SIGTERM, the agent did not try to deliver the result of the run it waited for")
	}
	// The run took 0.5 s of the unit's time; leave a couple of seconds
	// for the rest of the stop.
	p.exitCode(t, limit-2*time.Second)
	t.Logf("exited %s after SIGTERM (the unit allows %s)", time.Since(stopped).Round(100*time.Millisecond), limit)
	if logLine(p, "not delivered", "spool") == "" {
		t.Error("the log does not say that the result was not delivered and stays in the spool")
	}
	if n := len(w.spooled(t)); n != 1 {
		t.Errorf("%d results in the spool, want the one not delivered", n)
	}
}

// TestSecondSignalCutsRun: a second SIGTERM while the run is still
// going stops the agent now, not at the run's deadline; the run is cut
// short, and the next start reports it as execution_outcome_unknown
// (as after a crash), never running it again.
func TestSecondSignalCutsRun(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	id := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "long", "sleep_ms": 120000}, refserver.EnqueueOptions{DeadlineMS: 180000})
	waitFile(t, filepath.Join(w.work, "started-long"), 60*time.Second)
	p.cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(10 * time.Second); logLine(p, "waiting for this run", id) == "" && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.exitCode(t, 10*time.Second)
	if logLine(p, "cut short", id) == "" {
		t.Error("the log does not say the run was cut short")
	}
	// The agent's death kills what it ran (bwrap by its parent-death
	// signal, the sandbox with it); on a loaded machine that takes a
	// moment, so a survivor is one still there after a generous wait.
	// Only this world's processes count: other tests on the machine
	// may be running touch_once of their own.
	survivors := func() (out []string) {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, c := range procs {
			if cl, _ := os.ReadFile(c); strings.Contains(string(cl), "touch_once") && strings.Contains(string(cl), w.dir+"/") {
				out = append(out, fmt.Sprintf("%s %q", c, cl))
			}
		}
		return out
	}
	left := survivors()
	for deadline := time.Now().Add(15 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = survivors() {
		time.Sleep(50 * time.Millisecond)
	}
	for _, s := range left {
		t.Errorf("a process of the cut run survives the agent: %s", s)
	}
	w.start()
	info := w.wait(id)
	if r := result(t, info); r["error_class"] != "execution_outcome_unknown" {
		t.Errorf("after a cut run, the next start reported %s", info.ResultBody)
	}
	if ran := lines(t, filepath.Join(w.work, "ran.log")); len(ran) != 1 {
		t.Errorf("the executor ran %d times, want once: %v", len(ran), ran)
	}
}

// TestStopDuringDelivery: SIGTERM while a result POST is under way does
// not cut it (the server may have it already): it completes, once, and
// the agent exits with nothing left in the spool.
func TestStopDuringDelivery(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	held := make(chan struct{}, 10)
	release := make(chan struct{})
	var once sync.Once
	w.srv.SetResultGate(func(string, []byte) int {
		first := false
		once.Do(func() { first = true })
		if first {
			// The server is slow with the first POST, and takes it.
			held <- struct{}{}
			<-release
		}
		return 0
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	id := w.enqueue("echo_args", map[string]any{}, refserver.EnqueueOptions{})
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatal("the agent did not deliver the result")
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond)
	close(release)
	p.exitCode(t, 15*time.Second)
	info, _ := w.srv.Invocation(id)
	if info.ResultBody == nil || info.ResultPosts != 1 {
		t.Errorf("result posted %d times (stored: %v), want once", info.ResultPosts, info.ResultBody != nil)
	}
	if n := len(w.spooled(t)); n != 0 {
		t.Errorf("%d results left in the spool: the delivery the server took was cut and will be sent again", n)
	}
}

// TestStopBudgetCutsRun: run as a service with a stop budget
// (METNOS_STOP_TIMEOUT_S, which the unit sets to its TimeoutStopSec),
// SIGTERM once while a run that would take minutes goes on: the agent
// cuts it at half the budget, delivers its result, once, saying so,
// and exits 0 within the budget, before the service manager's SIGKILL.
// Nothing of the run is left (its processes, its STARTED marker, its
// spooled result), and a restart neither runs it again nor reports it
// otherwise.
func TestStopBudgetCutsRun(t *testing.T) {
	const budget = 6 * time.Second
	w := newWorld(t)
	w.pair()
	p := w.startExe(filepath.Join(binDir, "metnos-agent"), []string{fmt.Sprintf("METNOS_STOP_TIMEOUT_S=%d", budget/time.Second)})
	id := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "long", "sleep_ms": 120000}, refserver.EnqueueOptions{DeadlineMS: 180000})
	waitFile(t, filepath.Join(w.work, "started-long"), 60*time.Second)
	p.cmd.Process.Signal(syscall.SIGTERM)
	stopped := time.Now()
	// Not cut, the run would hold the agent for two minutes.
	if code := p.exitCode(t, budget); code != 0 {
		t.Errorf("the agent exited %d after SIGTERM, want 0", code)
	}
	t.Logf("exited %s after SIGTERM (budget %s)", time.Since(stopped).Round(100*time.Millisecond), budget)

	// The sandbox killed and reaped the run before its result was made
	// (this world's run: other tests may be running touch_once).
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		if cl, _ := os.ReadFile(c); strings.Contains(string(cl), "touch_once") && strings.Contains(string(cl), w.dir+"/") {
			t.Errorf("a process of the cut run survives the agent: %s %q", c, cl)
		}
	}
	info, _ := w.srv.Invocation(id)
	if info.ResultBody == nil {
		t.Fatalf("the agent exited without delivering the cut run's result (state %s, spool %v)", info.State, w.spooled(t))
	}
	if info.ResultPosts != 1 {
		t.Errorf("the result was posted %d times, want once", info.ResultPosts)
	}
	r := result(t, info)
	payload, _ := r["payload"].(map[string]any)
	switch {
	case r["ok"] != false, r["n_processed"] != float64(0), fmt.Sprint(r["entries"]) != "[]":
		t.Errorf("want ok false, no entries, n_processed 0: %s", info.ResultBody)
	case r["error_class"] != "execution_outcome_unknown", payload["effect_status"] != "unknown", payload["recovery"] != "cut_at_stop":
		t.Errorf("want the outcome-unknown class and payload of a writer cut at the stop: %s", info.ResultBody)
	case !strings.Contains(fmt.Sprint(r["error"]), "cut short") || !strings.Contains(fmt.Sprint(r["error"]), "asked to stop"):
		t.Errorf("the error does not say the run was cut because the agent was asked to stop: %s", info.ResultBody)
	case r["sandbox"] != bestSandbox():
		t.Errorf("sandbox %v, want the run's, %s", r["sandbox"], bestSandbox())
	}
	if logLine(p, "waiting for this run", id, "at most 3 s") == "" {
		t.Error("the log does not say the run it waits for is cut at most 3 s after the stop")
	}
	if logLine(p, "WARN", "was cut short", id) == "" {
		t.Error("the log does not say, at warn, that the run was cut short")
	}
	if n := len(w.spooled(t)); n != 0 {
		t.Errorf("%d results left in the spool", n)
	}
	if ms, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "started", "*.json")); len(ms) > 0 {
		t.Errorf("STARTED markers left: %v", ms)
	}

	// A restart: the run is settled. Another invocation's result shows
	// the restarted agent has been through its start and a poll.
	q := w.start()
	if next := w.wait(w.enqueue("echo_args", map[string]any{}, refserver.EnqueueOptions{})); next.State != "done" {
		t.Fatalf("echo_args after the restart: state %s, result %s", next.State, next.ResultBody)
	}
	q.stop(t)
	if ran := lines(t, filepath.Join(w.work, "ran.log")); len(ran) != 1 {
		t.Errorf("the executor ran %d times, want once: %v", len(ran), ran)
	}
	if info, _ := w.srv.Invocation(id); info.ResultPosts != 1 {
		t.Errorf("the result was posted %d times after the restart, want once", info.ResultPosts)
	}
	if logLine(q, "was running when the agent stopped") != "" {
		t.Error("the restart reports the cut run as running when the agent stopped")
	}
}
