//go:build linux

package hostile

import (
	"regexp"
	"strconv"
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
