package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metnos/agent/policy"

	"github.com/metnos/agent/testkit/runcgroups"
)

// TestCgroupReusedPerRun: a cgroup a run gives back is the next run's,
// with that run's own limits and OOM count. Run A is killed by its
// 64 MiB limit; run B, in the same cgroup right after, allocates
// 128 MiB under its 256 MiB limit, is not reported killed by memory,
// and cannot start more processes than its own limit of 4; run C, which
// kills itself with SIGKILL there, is not reported killed by memory.
func TestCgroupReusedPerRun(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	pol := policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}}
	run := func(lim Limits, argv ...string) Output {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		lim.Timeout = 30 * time.Second
		out, err := Run(ctx, Request{Argv: argv, Policy: pol, Limits: lim})
		if err != nil {
			t.Fatalf("%q: %v", argv, err)
		}
		return out
	}
	// The first cgroup a process gives back is removed, not pooled.
	if out := run(Limits{}, "/bin/true"); out.LimitsBy != "cgroup" {
		t.Skipf("limits by %s here (not root, or no cgroup with pids and memory to make): no cgroup to reuse", out.LimitsBy)
	}

	a := run(Limits{MemoryBytes: 64 << 20}, py, "-c", "b = bytearray(300 << 20); print('SURVIVED')")
	if !a.OOMKilled || strings.Contains(string(a.Stdout), "SURVIVED") {
		t.Fatalf("run A: OOMKilled %v, stdout %q; want killed by its 64 MiB limit", a.OOMKilled, a.Stdout)
	}
	cgroupPool.Lock()
	var pooled *runCgroup
	if n := len(cgroupPool.free); n > 0 {
		pooled = cgroupPool.free[n-1]
	}
	cgroupPool.Unlock()
	if pooled == nil {
		t.Fatal("run A's cgroup was not given back to the pool")
	}

	b := run(Limits{MemoryBytes: 256 << 20, MaxProcs: 4}, py, "-c", `
import subprocess
b = bytearray(128 << 20)
ps = []
try:
    for i in range(20):
        ps.append(subprocess.Popen(["/bin/sleep", "5"]))
except OSError:
    pass
print("SPAWNED", len(ps), flush=True)
for p in ps:
    p.kill()
    p.wait()
`)
	cgroupPool.Lock()
	reused := len(cgroupPool.free) > 0 && cgroupPool.free[len(cgroupPool.free)-1] == pooled
	cgroupPool.Unlock()
	if !reused {
		t.Fatal("run B did not run in run A's cgroup")
	}
	if b.OOMKilled || b.ExitCode != 0 {
		t.Fatalf("run B: exit %d, OOMKilled %v, stderr %q; want exit 0: run A's OOM kill and 64 MiB limit are not run B's", b.ExitCode, b.OOMKilled, b.Stderr)
	}
	var spawned int
	if _, err := fmt.Sscanf(string(b.Stdout), "SPAWNED %d", &spawned); err != nil || spawned >= 4 {
		t.Fatalf("run B: stdout %q; want fewer than 4 processes started under MaxProcs 4", b.Stdout)
	}
	// Run C, in the same cgroup again, dies of a SIGKILL of its own:
	// no memory failure, whatever run A's count says.
	c := run(Limits{}, py, "-c", "import os; os.kill(os.getpid(), 9)")
	if c.Signal != "SIGKILL" || c.OOMKilled {
		t.Fatalf("run C: signal %q, OOMKilled %v; want SIGKILL and no memory failure", c.Signal, c.OOMKilled)
	}
}

// poolCgroups makes run cgroups and leaves them in the pool through
// real runs: several at once, so that each needs a cgroup of its own.
// It skips where runs get no cgroup (as root, it fails instead with
// METNOS_REQUIRE_SANDBOX=1), and returns how many cgroups the pool holds.
func poolCgroups(t *testing.T) int {
	t.Helper()
	pol := policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}}
	run := func(argv ...string) (Output, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return Run(ctx, Request{Argv: argv, Policy: pol, Limits: Limits{Timeout: 30 * time.Second}})
	}
	// The first cgroup a process gives back is removed, not pooled.
	out, err := run("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case out.LimitsBy == "cgroup":
	case os.Getuid() != 0:
		// Not a layer an unprivileged user is owed: without a delegated
		// cgroup, runs are limited by rlimits.
		t.Skipf("limits by %s here (not root, and no delegated cgroup): no cgroup to pool", out.LimitsBy)
	default:
		skipOrFail(t, "limits by "+out.LimitsBy+" here (no cgroup with pids and memory to make): no cgroup to pool")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Go(func() {
			out, err := run("/bin/sleep", "0.5")
			if err == nil && out.ExitCode != 0 {
				err = fmt.Errorf("sleep: exit %d, stderr %q", out.ExitCode, out.Stderr)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	cgroupPool.Lock()
	defer cgroupPool.Unlock()
	return len(cgroupPool.free)
}

// TestDrainPoolRemovesPooledCgroups: the cgroups finished runs left in
// the pool are folders under /sys/fs/cgroup until DrainPool, which the
// agent calls as it stops; after it none of this process's run cgroups
// is left.
func TestDrainPoolRemovesPooledCgroups(t *testing.T) {
	t.Cleanup(func() { DrainPool(nil) })
	n := poolCgroups(t)
	if n == 0 {
		t.Fatal("three runs at once left no cgroup in the pool")
	}
	before := runcgroups.Of(os.Getpid())
	if len(before) == 0 {
		t.Fatalf("the pool holds %d cgroups, but no metnos-run-%d-* folder is under /sys/fs/cgroup", n, os.Getpid())
	}
	t.Logf("pooled: %d cgroups, folders %v", n, before)
	DrainPool(nil)
	if left := runcgroups.Of(os.Getpid()); len(left) > 0 {
		t.Errorf("after DrainPool, run cgroups of this process are left: %v", left)
	}
	cgroupPool.Lock()
	free := len(cgroupPool.free)
	cgroupPool.Unlock()
	if free != 0 {
		t.Errorf("after DrainPool the pool still holds %d cgroups", free)
	}
	// Draining an empty pool is nothing.
	DrainPool(nil)
}

// TestDrainPoolLeavesBusyCgroup: a pooled cgroup that holds a task again
// (something moved it there) is not emptied by force: DrainPool logs it
// and leaves it, and the task lives on.
func TestDrainPoolLeavesBusyCgroup(t *testing.T) {
	t.Cleanup(func() { DrainPool(nil) })
	if poolCgroups(t) == 0 {
		t.Fatal("three runs at once left no cgroup in the pool")
	}
	cgroupPool.Lock()
	c := cgroupPool.free[len(cgroupPool.free)-1]
	cgroupPool.Unlock()
	sleep := exec.Command("/bin/sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	pid := sleep.Process.Pid
	t.Cleanup(func() {
		sleep.Process.Kill()
		sleep.Wait()
		for _, d := range c.dirs {
			for i := 0; i < 100 && os.Remove(d) != nil && fileExists(d); i++ {
				time.Sleep(10 * time.Millisecond)
			}
		}
	})
	for _, d := range c.dirs {
		if err := writeCgroupFile(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			t.Fatalf("moving a process into %s: %v", d, err)
		}
	}
	var logged bytes.Buffer
	var mu sync.Mutex
	DrainPool(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil)))
	for _, d := range c.dirs {
		if !fileExists(d) {
			t.Errorf("DrainPool removed %s, which holds a process", d)
		}
	}
	if !alive(pid) {
		t.Error("DrainPool killed the process in a pooled cgroup")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, d := range c.dirs {
		if !strings.Contains(logged.String(), d) {
			t.Errorf("the log does not name the cgroup left, %s:\n%s", d, logged.String())
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
