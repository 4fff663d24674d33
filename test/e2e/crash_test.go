//go:build linux

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/refserver"
)

func shortGrace(c *refserver.Config) { c.RedeliveryGrace = time.Second }

// sameBodies fails unless every result POST of the invocation carried
// the same bytes.
func sameBodies(t *testing.T, info refserver.InvocationInfo, also ...[]byte) {
	t.Helper()
	all := append(append([][]byte(nil), info.ResultBodies...), also...)
	for i, b := range all {
		if !bytes.Equal(b, all[0]) {
			t.Errorf("result %d of %s differs from the first:\n%s\n%s", i, info.ID, all[0], b)
		}
	}
}

// TestKillWhileRunning: kill -9 between the STARTED marker and the
// spooled result. After the restart the invocation is reported as
// execution_outcome_unknown and never runs again, even when the server
// hands it out again.
func TestKillWhileRunning(t *testing.T) {
	w := newWorld(t, shortGrace)
	w.pair()
	p := w.start()
	id := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "a", "sleep_ms": 20000}, refserver.EnqueueOptions{DeadlineMS: 2000, Reversibility: "read_only"})
	waitFile(t, filepath.Join(w.work, "started-a"), 30*time.Second)
	p.kill9()
	if m, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "started", "*.json")); len(m) != 1 {
		t.Fatalf("STARTED markers after the crash: %v", m)
	}
	// Hold the results back until the server has handed the invocation
	// out again, to the restarted agent.
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
	p = w.start()
	deadline := time.Now().Add(60 * time.Second)
	for {
		info, _ := w.srv.Invocation(id)
		if info.Deliveries >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never handed the invocation out again (deliveries %d)", info.Deliveries)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	hold = false
	mu.Unlock()
	info := w.wait(id)
	r := result(t, info)
	if r["error_class"] != "execution_outcome_unknown" || r["sandbox"] != "unknown_after_restart" {
		t.Fatalf("result after the crash: %s", info.ResultBody)
	}
	if n := len(lines(t, filepath.Join(w.work, "ran.log"))); n != 1 {
		t.Fatalf("the executor ran %d times, want exactly once (it declares fs:write, though labelled read_only)", n)
	}
	if !logHas(p, "already executed") {
		t.Error("the restarted agent's log does not show it declined the re-delivered invocation")
	}
	sameBodies(t, info)
	// The device's history says what is known: the run was cut short.
	if e := w.history()[id]; e.State != "interrupted" || !strings.Contains(e.Undo, "not known") {
		t.Errorf("history of the killed run: %+v", e)
	}
	if code, out := w.cli("audit", "verify"); code != 0 || !strings.Contains(out, "intact") {
		t.Errorf("audit log after the crash: %d %s", code, out)
	}
}

// TestKillBeforeDelivery: kill -9 after the result is spooled, before
// the server has it. After the restart the very same bytes are sent,
// and the executor does not run again.
func TestKillBeforeDelivery(t *testing.T) {
	w := newWorld(t)
	w.pair()
	var mu sync.Mutex
	var refused [][]byte
	w.srv.SetResultGate(func(_ string, body []byte) int {
		mu.Lock()
		defer mu.Unlock()
		refused = append(refused, append([]byte(nil), body...))
		return 503
	})
	p := w.start()
	id := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "b"}, refserver.EnqueueOptions{})
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := len(refused)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never tried to deliver")
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.kill9()
	w.srv.SetResultGate(nil)
	w.start()
	info := w.wait(id)
	if info.State != "done" {
		t.Fatalf("state %s: %s", info.State, info.ResultBody)
	}
	mu.Lock()
	sameBodies(t, info, refused...)
	mu.Unlock()
	if n := len(lines(t, filepath.Join(w.work, "ran.log"))); n != 1 {
		t.Fatalf("the executor ran %d times, want 1", n)
	}
}

// TestKillDuringDelivery: kill -9 while the result POST is in flight;
// the server stores it but the agent never hears back. After the
// restart it sends the same bytes again; the server keeps the first.
func TestKillDuringDelivery(t *testing.T) {
	w := newWorld(t)
	w.pair()
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	w.srv.SetResultGate(func(string, []byte) int {
		first := false
		once.Do(func() { first = true })
		if first {
			close(arrived)
			<-release
		}
		return 0
	})
	p := w.start()
	id := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "c"}, refserver.EnqueueOptions{})
	select {
	case <-arrived:
	case <-time.After(60 * time.Second):
		t.Fatal("no delivery arrived")
	}
	p.kill9()
	close(release)
	p = w.start()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pending, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "results", "*.json"))
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted agent never delivered its spooled result: %v", pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, _ := w.srv.Invocation(id)
	if info.State != "done" || len(info.ResultBodies) < 2 {
		t.Fatalf("state %s, %d result posts (want the first stored and a re-send)", info.State, len(info.ResultBodies))
	}
	sameBodies(t, info)
	if n := len(lines(t, filepath.Join(w.work, "ran.log"))); n != 1 {
		t.Fatalf("the executor ran %d times, want 1", n)
	}
}

// TestKillAtRandom: the agent is killed with -9 at random moments while
// it works through a queue of mutating invocations, and restarted each
// time. No invocation runs twice, every one gets a result, and every
// re-sent result is byte for byte the first.
func TestKillAtRandom(t *testing.T) {
	w := newWorld(t, shortGrace)
	w.pair()
	const n = 8
	var ids []string
	for i := 0; i < n; i++ {
		ids = append(ids, w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": fmt.Sprint(i), "sleep_ms": rand.IntN(300)},
			refserver.EnqueueOptions{DeadlineMS: 2000, Reversibility: "revertible"}))
	}
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	t.Logf("kill schedule seed %d", seed)
	finished := func() bool {
		for _, id := range ids {
			if info, _ := w.srv.Invocation(id); info.ResultBody == nil {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(3 * time.Minute)
	kills := 0
	for !finished() && time.Now().Before(deadline) {
		p := w.start()
		if kills < 6 {
			time.Sleep(time.Duration(50+rng.IntN(600)) * time.Millisecond)
			p.kill9()
			kills++
			continue
		}
		for !finished() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		p.stop(t)
	}
	t.Logf("%d kills", kills)
	counts := map[string]int{}
	for _, l := range lines(t, filepath.Join(w.work, "ran.log")) {
		counts[l]++
	}
	for i, id := range ids {
		info, _ := w.srv.Invocation(id)
		if info.ResultBody == nil {
			t.Errorf("invocation %d (%s) got no result", i, id)
			continue
		}
		r := result(t, info)
		c := counts[fmt.Sprint(i)]
		switch {
		case c > 1:
			t.Errorf("invocation %d ran %d times", i, c)
		case r["ok"] == true && c != 1:
			t.Errorf("invocation %d reported done but ran %d times", i, c)
		case r["ok"] != true && r["error_class"] != "execution_outcome_unknown":
			t.Errorf("invocation %d: unexpected failure %s", i, info.ResultBody)
		}
		sameBodies(t, info)
	}
	if _, err := os.Stat(filepath.Join(w.dataDir(), "spool", "executed.log")); err != nil {
		t.Error(err)
	}
}

// TestServerDownThenUp: the agent keeps trying while the server is
// unreachable, and picks work up again when it is back.
func TestServerDownThenUp(t *testing.T) {
	// The long-poll cut by the outage may still claim the invocation on
	// the server (docs/protocol.md §6.5): a short deadline and grace bound the wait.
	w := newWorld(t, shortGrace)
	w.pair()
	p := w.start()
	w.wait(w.enqueue("echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{}))
	w.proxy.down()
	id := w.enqueue("echo_args", map[string]any{"i": 2}, refserver.EnqueueOptions{DeadlineMS: 2000})
	deadline := time.Now().Add(20 * time.Second)
	for !logHas(p, "poll failed") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !logHas(p, "poll failed") {
		t.Fatal("the agent never noticed the server was gone")
	}
	w.proxy.up()
	if info := w.wait(id); info.State != "done" {
		t.Fatalf("after the server came back: %s", info.State)
	}
}

// TestWatchdog: an execution stuck past its deadline plus 10 s makes
// the agent exit 124 for its supervisor; restarted, it reports the
// invocation as of unknown outcome and does not run it again. The run
// is stuck the way a wedged process of the same user would leave it:
// holding, exclusively, the lock the sandbox takes before it masks a
// nucleus path (here ~/.ssh, visible under a write grant of the home).
func TestWatchdog(t *testing.T) {
	w := newWorld(t)
	needFull(t, "the run is stuck on the lock bubblewrap's masks take")
	w.pair()
	p := w.start()
	unlock := holdPlaceholderLock(t, filepath.Join(w.home, ".ssh"))
	id := w.enqueue("touch_once", map[string]any{"folder": w.home, "tag": "w"}, refserver.EnqueueOptions{DeadlineMS: 2000})
	if code := p.exitCode(t, 60*time.Second); code != 124 {
		t.Fatalf("the agent exited %d, want 124", code)
	}
	if !logHas(p, "watchdog") {
		t.Error("the log does not name the watchdog")
	}
	unlock()
	w.start()
	info := w.wait(id)
	if r := result(t, info); r["error_class"] != "execution_outcome_unknown" {
		t.Fatalf("after the watchdog: %s", info.ResultBody)
	}
	if l := lines(t, filepath.Join(w.home, "ran.log")); len(l) != 0 {
		t.Fatalf("the executor ran: %v", l)
	}
}

// holdPlaceholderLock takes, exclusively, the lock the sandbox takes
// shared before it masks path: in the layout's PlaceholderLocks, as the
// agent's command line gives it to the sandbox, under the name the
// sandbox's placeholderLocks gives it.
func holdPlaceholderLock(t *testing.T, path string) func() {
	t.Helper()
	lay, err := layout.CurrentWith(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	dir := lay.PlaceholderLocks(os.Getuid(), os.TempDir())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(path))
	f, err := os.OpenFile(filepath.Join(dir, hex.EncodeToString(sum[:12])+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { f.Close() }) }
	t.Cleanup(release)
	return release
}

// TestShimSelfHeal: a shim module missing from the device's copy is
// fetched again, once, and the run retried (docs/protocol.md §8); a new shim on the
// server is picked up before the next run.
func TestShimSelfHeal(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	if info := w.wait(w.enqueue("echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{})); info.State != "done" {
		t.Fatalf("%s", info.ResultBody)
	}
	helpers := filepath.Join(w.cacheDir(), "shim", "executor_helpers.py")
	if err := os.Remove(helpers); err != nil {
		t.Fatal(err)
	}
	if info := w.wait(w.enqueue("echo_args", map[string]any{"i": 2}, refserver.EnqueueOptions{})); info.State != "done" {
		t.Fatalf("no self-heal: %s", info.ResultBody)
	}
	if !logHas(p, "misses a shim module") {
		t.Error("the log does not show the self-heal")
	}
	// Drift: the server announces another shim.
	extra := []byte("# a newer shim\n" + string(must(os.ReadFile(helpers))))
	if err := w.srv.SetShimFile("executor_helpers.py", extra, true); err != nil {
		t.Fatal(err)
	}
	info := w.wait(w.enqueue("print_env", map[string]any{"probe": []any{helpers}}, refserver.EnqueueOptions{}))
	seen := result(t, info)["payload"].(map[string]any)["seen"].(map[string]any)[helpers]
	if seen != fmt.Sprintf("read %d bytes", len(extra)) {
		t.Fatalf("the executor saw the old shim: %v", seen)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestOrphanedPoll: a dead agent's long-poll, still open on the server,
// claims the invocation queued next (docs/protocol.md §6.5). The restarted agent gets
// it once its deadline has passed, even though newer invocations ran
// in between (the Rust client's cursor hides it until another restart).
func TestOrphanedPoll(t *testing.T) {
	w := newWorld(t, shortGrace)
	w.pair()
	w.proxy.setSticky(true)
	p := w.start()
	w.wait(w.enqueue("echo_args", map[string]any{"i": 0}, refserver.EnqueueOptions{}))
	time.Sleep(200 * time.Millisecond) // the agent is back in its long-poll
	p.kill9()
	orphan := w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "orphan"}, refserver.EnqueueOptions{DeadlineMS: 2000})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if info, _ := w.srv.Invocation(orphan); info.Deliveries == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead agent's long-poll did not claim the invocation; the test proves nothing")
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.proxy.setSticky(false)
	w.start()
	newer := w.enqueue("echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{})
	if info := w.wait(newer); info.State != "done" {
		t.Fatalf("newer: %s", info.ResultBody)
	}
	info := w.wait(orphan)
	if info.State != "done" || info.Deliveries != 2 {
		t.Fatalf("the orphaned invocation: %s after %d deliveries", info.State, info.Deliveries)
	}
	if l := lines(t, filepath.Join(w.work, "ran.log")); len(l) != 1 {
		t.Fatalf("ran %d times", len(l))
	}
}
