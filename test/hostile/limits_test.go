//go:build linux

package hostile

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/sandbox"
)

// TestMemoryLimit: a command allocating 2 GiB under a 256 MiB limit
// fails; outside it succeeds.
func TestMemoryLimit(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		attack(t, fx, m, attackCase{
			name:   "allocate-2GiB-under-256MiB",
			policy: supervised(nil, []string{"{{WORK}}"}),
			// 2 GiB reserved, and more than the limit touched (so that a
			// cgroup limit would be crossed too); touching all of it
			// takes seconds on a small VM.
			py: `
import mmap
b = mmap.mmap(-1, 2 << 30)
for i in range(0, 320 << 20, 4096):
    b[i] = 1
print("ALLOCATED", len(b))
`,
			landed: func(t *testing.T, fx *fixture, r result) []string {
				if r.exit == 0 && regexp.MustCompile(`ALLOCATED \d+`).MatchString(r.stdout) {
					return []string{"2 GiB allocated with MemoryBytes=256 MiB"}
				}
				return nil
			},
			limits: sandbox.Limits{MemoryBytes: 256 << 20, Timeout: 20 * time.Second},
		})
	})
}

var spawnedRe = regexp.MustCompile(`SPAWNED (\d+)`)

// TestProcessLimit: with MaxProcs=32, spawning 200 processes stops
// short; outside all 200 start.
func TestProcessLimit(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		attack(t, fx, m, attackCase{
			name:   "spawn-200-under-MaxProcs-32",
			policy: supervised(nil, []string{"{{WORK}}"}),
			py: `
import subprocess
ps = []
err = ""
for i in range(200):
    try:
        ps.append(subprocess.Popen(["/bin/sleep", "5"]))
    except OSError as e:
        err = str(e)
        break
print("SPAWNED", len(ps), err, flush=True)
for p in ps:
    p.kill()
for p in ps:
    p.wait()
`,
			landed: func(t *testing.T, fx *fixture, r result) []string {
				mm := spawnedRe.FindStringSubmatch(r.stdout)
				if mm == nil {
					return nil
				}
				if n, _ := strconv.Atoi(mm[1]); n >= 40 {
					return []string{"started " + mm[1] + " processes with MaxProcs=32"}
				}
				return nil
			},
			limits: sandbox.Limits{MaxProcs: 32, Timeout: 30 * time.Second},
		})
	})
}

// childHog is an executor whose child asks for 1 GiB, which the memory
// limit kills, while the executor itself goes on, prints its result
// rows and exits 0, as an executor that shells out to a greedy tool
// may.
const childHog = `
import json, subprocess, sys
r = subprocess.run([sys.executable, "-c", "b = b'x' * (1 << 30); print('CHILD SURVIVED')"])
for i in range(36):
    print(json.dumps({"path": "/work/row-%d" % i, "created": True}))
print("CHILD-EXIT", r.returncode, flush=True)
`

// TestChildKilledByMemoryLimit: a child the memory limit kills does not
// make the run a memory failure: every row the executor printed and its
// exit status 0 arrive as it wrote them (as root the cgroup's OOM
// counter used to mark the whole run OOM-killed, and the agent dropped
// its result).
func TestChildKilledByMemoryLimit(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		lim := sandbox.Limits{MemoryBytes: 128 << 20, Timeout: 30 * time.Second}
		r := runInside(t, fx, m, supervised(nil, []string{"{{WORK}}"})(t, fx), pyArgv(childHog), lim)
		t.Logf("limits by %s; %s", r.out.LimitsBy, strings.TrimSpace(regexp.MustCompile(`CHILD-EXIT -?\d+`).FindString(r.stdout)))
		if strings.Contains(r.stdout, "CHILD SURVIVED") {
			t.Fatalf("the child allocated 1 GiB under a 128 MiB limit:\n%s", r)
		}
		if r.exit != 0 || r.out.Signal != "" || r.out.OOMKilled {
			t.Errorf("exit %d, signal %q, OOMKilled %v; want the executor's own exit 0, not a memory failure:\n%s", r.exit, r.out.Signal, r.out.OOMKilled, r)
		}
		for i := 0; i < 36; i++ {
			if row := fmt.Sprintf(`{"path": "/work/row-%d", "created": true}`, i); !strings.Contains(r.stdout, row+"\n") {
				t.Fatalf("row %d of 36 is missing from the output:\n%s", i, r)
			}
		}
	})
}

// TestMainKilledByMemoryLimit: where a cgroup holds the memory limit,
// the executor's main process allocating past it is a memory failure,
// and the Output names the limit that killed it.
func TestMainKilledByMemoryLimit(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		lim := sandbox.Limits{MemoryBytes: 96 << 20, Timeout: 30 * time.Second}
		r := runInside(t, fx, m, supervised(nil, []string{"{{WORK}}"})(t, fx), pyArgv(`
print("ROW", flush=True)
b = b"x" * (1 << 30)
print("MAIN SURVIVED", flush=True)
`), lim)
		if strings.Contains(r.stdout, "MAIN SURVIVED") {
			t.Fatalf("1 GiB allocated under a 96 MiB limit:\n%s", r)
		}
		if by := r.out.LimitsBy; by != "cgroup" && by != "cgroup(memory)+rlimit" {
			t.Skipf("the memory limit is an rlimit here (limits by %s: not root, or no cgroup to make), so the kernel OOM-kills nothing: the main process got a MemoryError (exit %d)", r.out.LimitsBy, r.exit)
		}
		if !r.out.OOMKilled || r.out.Signal != "SIGKILL" {
			t.Errorf("OOMKilled %v, signal %q; want a memory failure:\n%s", r.out.OOMKilled, r.out.Signal, r)
		}
		if r.out.Limits.MemoryBytes != 96<<20 || sandbox.FormatBytes(r.out.Limits.MemoryBytes) != "96 MiB" {
			t.Errorf("the Output names a memory limit of %d bytes (%s), want 96 MiB", r.out.Limits.MemoryBytes, sandbox.FormatBytes(r.out.Limits.MemoryBytes))
		}
	})
}

// TestOutputNamesTheLimits: a Request that leaves the limits unset gets
// this system's defaults, and its Output says which, so that a message
// about the memory limit names the real one (the agent used to say
// "killed by the memory limit (0 MiB)" of its unset limit).
func TestOutputNamesTheLimits(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		r := runInside(t, fx, m, supervised(nil, nil)(t, fx), shArgv("true"), sandbox.Limits{Timeout: 20 * time.Second})
		want := sandbox.DefaultLimits()
		want.Timeout = 20 * time.Second
		if r.out.Limits != want {
			t.Errorf("Output.Limits = %+v, want %+v", r.out.Limits, want)
		}
	})
}
