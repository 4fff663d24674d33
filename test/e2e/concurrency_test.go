//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// Issue 30: a long executor never makes a short one wait. The agent runs
// with the default concurrency (4), whatever METNOS_CONCURRENCY the
// tests run with; nothing here waits for a clock: a long run holds
// until the test creates the file it waits for.

// startSideBySide runs the agent with the default concurrency, and env.
func startSideBySide(w *world, env ...string) *agentProc {
	w.t.Helper()
	return w.startExe(filepath.Join(binDir, "metnos-agent"), append([]string{"METNOS_CONCURRENCY=4"}, env...))
}

// saw is what a hold run found in its folder when it started.
func saw(t *testing.T, info refserver.InvocationInfo) []string {
	t.Helper()
	r := result(t, info)
	if r["ok"] != true {
		t.Fatalf("%s (%s) failed: %s", info.ID, info.Executor, info.ResultBody)
	}
	es, _ := r["entries"].([]any)
	if len(es) != 1 {
		t.Fatalf("%s: entries %v", info.ID, r["entries"])
	}
	var out []string
	for _, s := range es[0].(map[string]any)["saw"].([]any) {
		out = append(out, s.(string))
	}
	return out
}

// listed are the names a list_folder result lists.
func listed(t *testing.T, info refserver.InvocationInfo) []string {
	t.Helper()
	r := result(t, info)
	if r["ok"] != true {
		t.Fatalf("list_folder %s failed: %s", info.ID, info.ResultBody)
	}
	var out []string
	for _, e := range r["entries"].([]any) {
		out = append(out, e.(map[string]any)["name"].(string))
	}
	return out
}

// noResult fails when the invocation has a result already.
func noResult(t *testing.T, w *world, id, what string) {
	t.Helper()
	if info, _ := w.srv.Invocation(id); info.ResultBody != nil {
		t.Fatalf("%s already has a result: %s", what, info.ResultBody)
	}
}

// TestShortBesideLong: a long writer of one folder holds (sleeping, or
// hashing: CPU-bound); a list of an unrelated folder is claimed, runs
// and is delivered while it holds; a second writer of the same folder,
// and a list of it, are claimed but wait, and run after it, in the
// order they came (the second writer sees the first's file, the list
// sees both). Every invocation is handed out and delivered once; the
// history and audit log hold each.
func TestShortBesideLong(t *testing.T) {
	t.Run("sleep", func(t *testing.T) { shortBesideLong(t, false) })
	t.Run("cpu", func(t *testing.T) { shortBesideLong(t, true) })
}

func shortBesideLong(t *testing.T, burn bool) {
	w := newWorld(t)
	w.pair()
	photos, desktop := filepath.Join(w.work, "Photos"), filepath.Join(w.work, "Desktop")
	for _, d := range []string{photos, desktop} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(desktop, "notes.txt"), []byte("hello"), 0o644)
	p := startSideBySide(w)
	long := w.enqueue("hold", map[string]any{"folder": photos, "tag": "first", "wait_for": "release", "burn": burn}, refserver.EnqueueOptions{DeadlineMS: 180000, Reversibility: "revertible"})
	waitFile(t, filepath.Join(photos, "started-first"), 60*time.Second)

	// The short one: it finishes, and is delivered, while the long one
	// holds (it cannot end before the test lets it).
	short := w.enqueue("list_folder", map[string]any{"path": desktop}, refserver.EnqueueOptions{})
	if got := listed(t, w.wait(short)); !slices.Equal(got, []string{"notes.txt"}) {
		t.Errorf("the list of the Desktop: %v", got)
	}
	noResult(t, w, long, "the long writer, still holding")

	// A second writer of the same folder, then a list of it: claimed
	// (the lists of the Desktop enqueued after each are done, and the
	// server hands out in order), but neither starts while the first
	// writer holds.
	second := w.enqueue("hold", map[string]any{"folder": photos, "tag": "second"}, refserver.EnqueueOptions{Reversibility: "revertible"})
	w.wait(w.enqueue("list_folder", map[string]any{"path": desktop}, refserver.EnqueueOptions{}))
	reader := w.enqueue("list_folder", map[string]any{"path": photos}, refserver.EnqueueOptions{})
	w.wait(w.enqueue("list_folder", map[string]any{"path": desktop}, refserver.EnqueueOptions{}))
	for _, id := range []string{second, reader} {
		if info, _ := w.srv.Invocation(id); info.Deliveries != 1 {
			t.Fatalf("%s was handed out %d times before the long writer ended, want once (claimed)", id, info.Deliveries)
		}
		noResult(t, w, id, "an invocation that conflicts with the long writer")
	}
	if _, err := os.Stat(filepath.Join(photos, "started-second")); err == nil {
		t.Fatal("the second writer of the folder started while the first held it")
	}
	noResult(t, w, long, "the long writer, still holding")
	if !logHas(p, `msg="starting beside other runs" invocation=`+short) {
		t.Error("the agent's log does not say the short list started beside the long run")
	}

	// Let the long one end: the others follow, in order.
	if err := os.WriteFile(filepath.Join(photos, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := saw(t, w.wait(long)); slices.Contains(got, "started-second") {
		t.Errorf("the first writer saw the second's file when it started: %v", got)
	}
	if got := saw(t, w.wait(second)); !slices.Contains(got, "done-first") {
		t.Errorf("the second writer did not see the first's file: it ran before the first ended (saw %v)", got)
	}
	if got := listed(t, w.wait(reader)); !slices.Contains(got, "done-first") || !slices.Contains(got, "done-second") {
		t.Errorf("the list of the folder ran before both writers ended: %v", got)
	}
	p.stop(t)

	// Everything once: handed out once, posted once; none left over.
	for _, info := range w.srv.Invocations() {
		if info.Deliveries != 1 || info.ResultPosts != 1 {
			t.Errorf("%s (%s): handed out %d times, posted %d times, want once each", info.ID, info.Executor, info.Deliveries, info.ResultPosts)
		}
	}
	if n := len(w.spooled(t)); n != 0 {
		t.Errorf("%d results left in the spool", n)
	}
	if ms, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "started", "*.json")); len(ms) > 0 {
		t.Errorf("STARTED markers left: %v", ms)
	}
	h := w.history()
	for _, id := range []string{long, second} {
		if e, ok := h[id]; !ok || e.State == "interrupted" {
			t.Errorf("history of %s: %+v (present %v)", id, e, ok)
		}
	}
	if code, out := w.cli("audit", "verify"); code != 0 || !strings.Contains(out, "intact") {
		t.Errorf("audit log: %d %s", code, out)
	}
	if code, out := w.cli("audit", "verify"); code == 0 {
		for _, id := range []string{long, short, second, reader} {
			if !auditHas(t, w, id) {
				t.Errorf("the audit log has no line for %s\n%s", id, out)
			}
		}
	}
}

// auditHas reports whether the audit log has a line for invocation id.
func auditHas(t *testing.T, w *world, id string) bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(w.dataDir(), "audit", "*"))
	n := 0
	for _, f := range files {
		b, _ := os.ReadFile(f)
		n += strings.Count(string(b), `"invocation_id":"`+id+`"`)
	}
	if n > 1 {
		t.Errorf("the audit log has %d lines for %s, want one", n, id)
	}
	return n == 1
}

// TestKillWithRunsInFlight: kill -9 while two writers of different
// folders run side by side: after the restart each is reported
// execution_outcome_unknown, once, and neither runs again when the
// server hands them out again; the history marks both interrupted.
func TestKillWithRunsInFlight(t *testing.T) {
	w := newWorld(t, shortGrace)
	w.pair()
	a, b := filepath.Join(w.work, "a"), filepath.Join(w.work, "b")
	os.MkdirAll(a, 0o755)
	os.MkdirAll(b, 0o755)
	p := startSideBySide(w)
	// Two writers (of different executors: two runs of one executor
	// that writes share its data folder, and run one after the other).
	ids := []string{
		w.enqueue("touch_once", map[string]any{"folder": a, "tag": "a", "sleep_ms": 60000}, refserver.EnqueueOptions{DeadlineMS: 2000, Reversibility: "read_only"}),
		w.enqueue("hold", map[string]any{"folder": b, "tag": "b", "wait_for": "never"}, refserver.EnqueueOptions{DeadlineMS: 2000, Reversibility: "read_only"}),
	}
	waitFile(t, filepath.Join(a, "started-a"), 60*time.Second)
	waitFile(t, filepath.Join(b, "started-b"), 60*time.Second)
	p.kill9()
	if m, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "started", "*.json")); len(m) != 2 {
		t.Fatalf("STARTED markers after the crash: %v, want two", m)
	}
	// Hold the results back until the server has handed both out
	// again, to the restarted agent.
	var mu sync.Mutex
	hold := true
	w.srv.SetResultGate(func(string, []byte) int {
		mu.Lock()
		defer mu.Unlock()
		if hold {
			return 503
		}
		return 0
	})
	p = startSideBySide(w)
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range ids {
		for {
			info, _ := w.srv.Invocation(id)
			if info.Deliveries >= 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server never handed %s out again (deliveries %d)", id, info.Deliveries)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	mu.Lock()
	hold = false
	mu.Unlock()
	for _, id := range ids {
		info := w.wait(id)
		if r := result(t, info); r["error_class"] != "execution_outcome_unknown" || r["sandbox"] != "unknown_after_restart" {
			t.Errorf("result of %s after the crash: %s", id, info.ResultBody)
		}
		sameBodies(t, info)
		if e := w.history()[id]; e.State != "interrupted" {
			t.Errorf("history of the killed run %s: %+v", id, e)
		}
	}
	if n := len(lines(t, filepath.Join(a, "ran.log"))); n != 1 {
		t.Errorf("touch_once ran %d times, want exactly once", n)
	}
	if m, _ := filepath.Glob(filepath.Join(b, "done-*")); len(m) > 0 {
		t.Errorf("hold ran again after the crash: %v", m)
	}
	p.stop(t)
	if code, out := w.cli("audit", "verify"); code != 0 || !strings.Contains(out, "intact") {
		t.Errorf("audit log after the crash: %d %s", code, out)
	}
}

// TestStopWithRunsInFlight: SIGTERM while several runs go on. Without
// a stop budget, every run finishes and its result is delivered, and
// an invocation claimed but waiting for a conflicting run is not
// started (no result: the server hands it out again); with one, the
// long runs are all cut at half of it and their results (which say so)
// delivered, once each, and the agent exits 0 within it.
func TestStopWithRunsInFlight(t *testing.T) {
	t.Run("drain", func(t *testing.T) {
		w := newWorld(t)
		w.pair()
		p := startSideBySide(w)
		a, b := filepath.Join(w.work, "a"), filepath.Join(w.work, "b")
		os.MkdirAll(a, 0o755)
		os.MkdirAll(b, 0o755)
		ids := []string{
			w.enqueue("hold", map[string]any{"folder": a, "tag": "a", "wait_for": "release"}, refserver.EnqueueOptions{DeadlineMS: 120000}),
			w.enqueue("touch_once", map[string]any{"folder": b, "tag": "b", "sleep_ms": 20000}, refserver.EnqueueOptions{DeadlineMS: 120000}),
			w.enqueue("nap", map[string]any{"seconds": 20}, refserver.EnqueueOptions{DeadlineMS: 120000}),
		}
		waitFile(t, filepath.Join(a, "started-a"), 60*time.Second)
		waitFile(t, filepath.Join(b, "started-b"), 60*time.Second)
		waitLog(t, p, `msg="starting beside other runs" invocation=`+ids[2], 1)
		// A second writer of a: claimed, it waits for the first.
		queued := w.enqueue("hold", map[string]any{"folder": a, "tag": "queued"}, refserver.EnqueueOptions{DeadlineMS: 120000})
		waitFor(t, 30*time.Second, "the second writer of a is claimed", func() bool {
			info, _ := w.srv.Invocation(queued)
			return info.Deliveries > 0
		})
		time.Sleep(300 * time.Millisecond) // prepared: its executor is cached
		p.cmd.Process.Signal(syscall.SIGTERM)
		// Stopping, the agent waits for all three: let the one that
		// waits for the test end.
		waitLog(t, p, "stop requested: waiting for this run to end", 3)
		os.WriteFile(filepath.Join(a, "release"), nil, 0o644)
		if code := p.exitCode(t, 60*time.Second); code != 0 {
			t.Errorf("the agent exited %d after SIGTERM, want 0", code)
		}
		for _, id := range ids {
			info, _ := w.srv.Invocation(id)
			if info.ResultBody == nil || info.ResultPosts != 1 || result(t, info)["ok"] != true {
				t.Errorf("%s: posted %d times, result %s; want one, ok", id, info.ResultPosts, info.ResultBody)
			}
		}
		if n := len(w.spooled(t)); n != 0 {
			t.Errorf("%d results left in the spool", n)
		}
		if _, err := os.Stat(filepath.Join(a, "started-queued")); err == nil {
			t.Error("the writer that waited for a conflicting run was started after the stop request")
		}
		if info, _ := w.srv.Invocation(queued); info.ResultPosts != 0 {
			t.Errorf("the writer not started was answered (%s): the server would not hand it out again", info.ResultBody)
		}
		if !logHas(p, "stopping: this invocation waited for a conflicting run and was not started") {
			t.Error("the agent's log does not say the waiting writer was not started")
		}
	})
	t.Run("budget", func(t *testing.T) {
		const budget = 6 * time.Second
		w := newWorld(t)
		w.pair()
		p := startSideBySide(w, fmt.Sprintf("METNOS_STOP_TIMEOUT_S=%d", budget/time.Second))
		a, b := filepath.Join(w.work, "a"), filepath.Join(w.work, "b")
		os.MkdirAll(a, 0o755)
		os.MkdirAll(b, 0o755)
		ids := []string{
			w.enqueue("touch_once", map[string]any{"folder": a, "tag": "a", "sleep_ms": 120000}, refserver.EnqueueOptions{DeadlineMS: 180000}),
			w.enqueue("hold", map[string]any{"folder": b, "tag": "b", "wait_for": "never"}, refserver.EnqueueOptions{DeadlineMS: 180000}),
		}
		waitFile(t, filepath.Join(a, "started-a"), 60*time.Second)
		waitFile(t, filepath.Join(b, "started-b"), 60*time.Second)
		short := w.wait(w.enqueue("echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{}))
		if short.State != "done" {
			t.Fatalf("a short run beside two long ones: %s %s", short.State, short.ResultBody)
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.exitCode(t, budget); code != 0 {
			t.Errorf("the agent exited %d after SIGTERM, want 0", code)
		}
		for _, id := range ids {
			info, _ := w.srv.Invocation(id)
			if info.ResultBody == nil || info.ResultPosts != 1 {
				t.Fatalf("%s: posted %d times (stored %v), want once", id, info.ResultPosts, info.ResultBody != nil)
			}
			r := result(t, info)
			if payload, _ := r["payload"].(map[string]any); r["error_class"] != "execution_outcome_unknown" || payload["recovery"] != "cut_at_stop" {
				t.Errorf("%s: want a writer cut at the stop: %s", id, info.ResultBody)
			}
		}
		if n := len(w.spooled(t)); n != 0 {
			t.Errorf("%d results left in the spool", n)
		}
		if ms, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "started", "*.json")); len(ms) > 0 {
			t.Errorf("STARTED markers left: %v", ms)
		}
		if n := len(lines(t, filepath.Join(a, "ran.log"))); n != 1 {
			t.Errorf("touch_once ran %d times, want once", n)
		}
	})
}

// waitLog waits until the agent's log has n lines containing s.
func waitLog(t *testing.T, p *agentProc, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(p.log)
		if strings.Count(string(b), s) >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the agent's log has fewer than %d lines with %q", n, s)
}

// TestWaitedPastDeadline: a writer claimed while a conflicting run
// holds its folder, whose deadline goes by while it waits, is not
// started late: its result, while the holder still holds, is a timeout
// that says it was not run, and it leaves nothing on disk, even once
// the holder ends.
func TestWaitedPastDeadline(t *testing.T) {
	w := newWorld(t, shortGrace)
	w.pair()
	photos, desktop := filepath.Join(w.work, "Photos"), filepath.Join(w.work, "Desktop")
	os.MkdirAll(photos, 0o755)
	os.MkdirAll(desktop, 0o755)
	p := startSideBySide(w)
	long := w.enqueue("hold", map[string]any{"folder": photos, "tag": "first", "wait_for": "release"}, refserver.EnqueueOptions{DeadlineMS: 180000})
	waitFile(t, filepath.Join(photos, "started-first"), 60*time.Second)
	late := w.enqueue("touch_once", map[string]any{"folder": photos, "tag": "late"}, refserver.EnqueueOptions{DeadlineMS: 1000})
	w.wait(w.enqueue("list_folder", map[string]any{"path": desktop}, refserver.EnqueueOptions{}))
	// Claimed and waiting. Its result comes once its deadline has gone
	// by, while the holder still holds.
	info := w.wait(late)
	noResult(t, w, long, "the holder")
	os.WriteFile(filepath.Join(photos, "release"), nil, 0o644)
	w.wait(long)
	w.wait(w.enqueue("list_folder", map[string]any{"path": desktop}, refserver.EnqueueOptions{}))
	r := result(t, info)
	if r["ok"] != false || r["error_class"] != "timeout" || !strings.Contains(fmt.Sprint(r["error"]), "not run") {
		t.Errorf("the late writer's result: %s", info.ResultBody)
	}
	if _, err := os.Stat(filepath.Join(photos, "started-late")); err == nil {
		t.Error("the late writer ran after its deadline")
	}
	if n := len(lines(t, filepath.Join(photos, "ran.log"))); n != 0 {
		t.Errorf("the late writer ran %d times, want never", n)
	}
	if info, _ := w.srv.Invocation(late); info.ResultPosts != 1 {
		t.Errorf("its result was posted %d times, want once", info.ResultPosts)
	}
	if !logHas(p, "not started: its deadline went by while it waited for conflicting runs") {
		t.Error("the agent's log does not say why the writer was not started")
	}
	p.stop(t)
	if code, out := w.cli("audit", "verify"); code != 0 || !strings.Contains(out, "intact") {
		t.Errorf("audit log: %d %s", code, out)
	}
}

// TestWaitTakenFromDeadline: a writer that waited for a conflicting run
// gets what is left of its deadline when it starts, not the whole of it
// again: with a 6 s deadline, 3 s of it spent waiting, a run of 4 s is
// cut at its deadline, which it would not be with 6 s.
func TestWaitTakenFromDeadline(t *testing.T) {
	w := newWorld(t, shortGrace)
	w.pair()
	photos := filepath.Join(w.work, "Photos")
	os.MkdirAll(photos, 0o755)
	p := startSideBySide(w)
	long := w.enqueue("hold", map[string]any{"folder": photos, "tag": "first", "wait_for": "release"}, refserver.EnqueueOptions{DeadlineMS: 180000})
	waitFile(t, filepath.Join(photos, "started-first"), 60*time.Second)
	// touch_once fetched and cached, in a folder of its own (w.work
	// holds Photos: it would wait for the holder).
	warm := filepath.Join(w.work, "Warm")
	os.MkdirAll(warm, 0o755)
	if r := result(t, w.wait(w.enqueue("touch_once", map[string]any{"folder": warm, "tag": "warm"}, refserver.EnqueueOptions{}))); r["ok"] != true {
		t.Fatalf("touch_once beside the holder: %v", r)
	}
	queued := w.enqueue("touch_once", map[string]any{"folder": photos, "tag": "queued", "sleep_ms": 4000}, refserver.EnqueueOptions{DeadlineMS: 6000})
	waitFor(t, 30*time.Second, "the second writer is claimed", func() bool {
		info, _ := w.srv.Invocation(queued)
		return info.Deliveries > 0
	})
	time.Sleep(3 * time.Second)
	os.WriteFile(filepath.Join(photos, "release"), nil, 0o644)
	w.wait(long)
	r := result(t, w.wait(queued))
	if r["ok"] != false || r["error_class"] != "timeout" {
		t.Errorf("the writer that waited 3 s of its 6 s deadline and runs 4 s: %v, want a timeout", r)
	}
	if ms, _ := r["elapsed_ms"].(float64); ms >= 4000 {
		t.Errorf("it ran %.0f ms, its whole sleep: the wait was not taken from its deadline", ms)
	}
	p.stop(t)
}
