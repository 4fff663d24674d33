package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/testkit/testexec"
)

// TestConflicts: runs whose grants overlap where one of them may write
// conflict; readers, and writers of disjoint trees, do not.
func TestConflicts(t *testing.T) {
	w := func(p ...string) footprint { return footprint{writes: p} }
	r := func(p ...string) footprint { return footprint{reads: p} }
	for _, tc := range []struct {
		name string
		a, b footprint
		want bool
	}{
		{"two readers of one tree", r("/h/Photos"), r("/h/Photos"), false},
		{"reader beside an unrelated writer", r("/h/Desktop"), w("/h/Photos"), false},
		{"writer of the tree a reader reads", r("/h/Photos"), w("/h/Photos"), true},
		{"writer inside what a reader reads", r("/h"), w("/h/Photos/2024"), true},
		{"writer above what a reader reads", r("/h/Photos/2024"), w("/h/Photos"), true},
		{"two writers of one folder", w("/h/Photos"), w("/h/Photos"), true},
		{"writers of disjoint folders", w("/h/Photos"), w("/h/Music"), false},
		{"a name that only starts the same", w("/h/Photo"), r("/h/Photos"), false},
		{"a writable root and anything", footprint{all: true}, r("/h/Desktop"), true},
		{"a writable root and a run with no grant", footprint{all: true}, footprint{}, true},
		{"a readable root and a writer", footprint{rootRead: true}, w("/h/x"), true},
		{"a readable root and a reader", footprint{rootRead: true}, r("/h/x"), false},
		{"one executor writing its own data twice", footprint{own: "organize_photos"}, footprint{own: "organize_photos"}, true},
		{"two executors' own data", footprint{own: "organize_photos"}, footprint{own: "write_files"}, false},
		{"a readable root and a writer of its own data only", footprint{rootRead: true}, footprint{own: "write_files"}, true},
		{"no grants at all", footprint{}, footprint{}, false},
		{"one identity for every run (Windows' AppContainer)", footprint{alone: true}, footprint{alone: true}, true},
		{"one identity, readers of disjoint trees", footprint{alone: true, reads: []string{"/h/a"}}, footprint{alone: true, reads: []string{"/h/b"}}, true},
	} {
		if got := conflicts(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: conflicts = %v, want %v", tc.name, got, tc.want)
		}
		if got := conflicts(tc.b, tc.a); got != tc.want {
			t.Errorf("%s (the other way): conflicts = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSharedIdentityRunsAlone: where the device's sandbox is Windows'
// AppContainer, one container for every run, each run's footprint says
// it runs alone; elsewhere it does not.
func TestSharedIdentityRunsAlone(t *testing.T) {
	inv := &invocation{}
	for _, tc := range []struct {
		best string
		want bool
	}{
		{sandbox.WordAppContainer, true},
		{"job-object+low-integrity", false},
		{"job-object", false},
		{"bwrap+landlock+seccomp", false},
		{"seatbelt", false},
	} {
		a := &Agent{best: tc.best}
		if got := footprintOf(inv, policy.Policy{}, a.sharedIdentity()).alone; got != tc.want {
			t.Errorf("sandbox %q: alone = %v, want %v", tc.best, got, tc.want)
		}
	}
}

// TestReadyKeepsArrivalOrder: a job waits for a conflicting run under
// way and for a conflicting job that came before it, not for others.
func TestReadyKeepsArrivalOrder(t *testing.T) {
	j := func(f footprint) *job { return &job{fp: f} }
	a := &Agent{}
	a.running = []*job{j(footprint{writes: []string{"/h/Photos"}})}
	a.queue = []*job{
		j(footprint{writes: []string{"/h/Photos"}}), // waits for the run
		j(footprint{reads: []string{"/h/Desktop"}}), // unrelated: starts
		j(footprint{writes: []string{"/h/Music"}}),  // unrelated: starts
		j(footprint{reads: []string{"/h/Music"}}),   // waits for the job before it
		j(footprint{reads: []string{"/h/Photos"}}),  // waits for the run
	}
	want := []bool{false, true, true, false, false}
	for i, w := range want {
		if got := a.ready(i); got != w {
			t.Errorf("queue[%d]: ready = %v, want %v", i, got, w)
		}
	}
}

// TestRunsSideBySide: in process (so that -race sees the run loop, the
// runs' goroutines and the heartbeat together), short invocations run
// and are delivered while a long writer holds; a second writer of its
// folder waits for it; the heartbeat and InFlight count the runs.
func TestRunsSideBySide(t *testing.T) {
	a := newDeviceAgent(t, testexec.Merge(t, examples.Executors, testexec.Hold), "side-by-side", func(d *deviceAgent, c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(d.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.HeartbeatEvery = 50 * time.Millisecond
	})
	srv, reg, dir, logs := a.srv, a.reg, a.dir, a.logs
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop, ran := a.start(t, ctx)
	folder := filepath.Join(dir, "Photos")
	os.MkdirAll(folder, 0o755)
	enqueue := func(ex string, args map[string]any) string {
		id, err := srv.Enqueue(reg.DeviceID, ex, args, refserver.EnqueueOptions{DeadlineMS: 120000})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	wait := func(id string) refserver.InvocationInfo {
		info, err := srv.Wait(ctx, id)
		if err != nil {
			t.Fatalf("%s: %v\n%s", id, err, logs.String())
		}
		return info
	}
	long := enqueue("hold", map[string]any{"folder": folder, "tag": "first", "wait_for": "release"})
	for {
		if _, err := os.Stat(filepath.Join(folder, "started-first")); err == nil {
			break
		}
		if info, _ := srv.Invocation(long); info.ResultBody != nil {
			t.Fatalf("the long run ended: %s", info.ResultBody)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var short []string
	for i := range 6 {
		short = append(short, enqueue("echo_args", map[string]any{"i": i}))
	}
	second := enqueue("hold", map[string]any{"folder": folder, "tag": "second"})
	for _, id := range short {
		if info := wait(id); info.State != "done" {
			t.Fatalf("echo_args beside the long run: %s", info.ResultBody)
		}
	}
	if running, limit := a.InFlight(); running < 1 || limit < 2 {
		t.Errorf("InFlight = %d of %d while the long run holds", running, limit)
	}
	if _, err := os.Stat(filepath.Join(folder, "started-second")); err == nil {
		t.Fatal("the second writer of the folder started while the first held it")
	}
	os.WriteFile(filepath.Join(folder, "release"), nil, 0o644)
	wait(long)
	info := wait(second)
	if !strings.Contains(string(info.ResultBody), "started-first") {
		t.Errorf("the second writer ran before the first ended: %s", info.ResultBody)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, info := range srv.Invocations() {
		if info.ResultPosts != 1 || info.Deliveries != 1 {
			t.Errorf("%s: handed out %d times, posted %d times, want once", info.ID, info.Deliveries, info.ResultPosts)
		}
	}
	if running, _ := a.InFlight(); running != 0 {
		t.Errorf("InFlight = %d after Run returned", running)
	}
}

// TestSlotsTotalMemory: the runs together stay under half the
// machine's memory: runs whose memory limit is the machine's run one
// at a time, whatever the owner's concurrency; small ones up to it.
func TestSlotsTotalMemory(t *testing.T) {
	total := physicalMemory()
	if total <= 0 {
		t.Skip("this system does not say how much memory it has: concurrency alone bounds the runs")
	}
	a := &Agent{}
	a.lim.Priority.Concurrency = 8
	a.cfg.MemoryBytes = total
	if n := a.slots(); n != 1 {
		t.Errorf("runs of %d bytes each on a machine of %d: %d at once, want 1", total, total, n)
	}
	a.cfg.MemoryBytes = total / 8
	if n := a.slots(); n != 4 {
		t.Errorf("runs of an eighth of the memory: %d at once, want 4 (half the memory)", n)
	}
	a.cfg.MemoryBytes = 1 << 20
	if n := a.slots(); n != 8 {
		t.Errorf("runs of 1 MiB: %d at once, want the owner's 8", n)
	}
	if _, limit := a.InFlight(); limit != 8 {
		t.Errorf("InFlight's limit %d, want 8", limit)
	}
}
