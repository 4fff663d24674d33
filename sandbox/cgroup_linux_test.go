package sandbox

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
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
