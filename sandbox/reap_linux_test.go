package sandbox

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
)

// children lists this process's children, from /proc: pid and state.
func children(t *testing.T) map[int]string {
	t.Helper()
	self := os.Getpid()
	out := map[int]string{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(self) {
			out[pid] = f[0] + " " + s[strings.IndexByte(s, '(')+1:i]
		}
	}
	return out
}

// TestRunLeavesNoOrphan: a run under bwrap leaves no process behind
// that is not reaped. bwrap's outer process exits before the sandbox's
// pid 1, which is reparented to the nearest subreaper, or to PID 1,
// where a PID 1 that does not reap keeps a zombie per run. The process
// that runs the sandbox is a subreaper after its first run, and none of
// its children may be left after Run, zombie or not.
func TestRunLeavesNoOrphan(t *testing.T) {
	c := Probe(Options{})
	if !c.BwrapUsable {
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatalf("bwrap is not usable here: %s (METNOS_REQUIRE_SANDBOX=1 makes this a failure)", c.BwrapError)
		}
		t.Skipf("bwrap is not usable here: %s", c.BwrapError)
	}
	before := children(t)
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := Run(ctx, Request{
			Argv:   []string{"/bin/sh", "-c", "echo hi; sleep 0.1"},
			Policy: policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}},
		})
		cancel()
		if err != nil || out.ExitCode != 0 || !strings.HasPrefix(out.Sandbox, "bwrap") {
			t.Fatalf("run %d: %v, exit %d, sandbox %q, stderr %s", i, err, out.ExitCode, out.Sandbox, out.Stderr)
		}
		if i == 0 {
			var on int32
			if err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&on)), 0, 0, 0); err != nil || on != 1 {
				t.Fatalf("after a run this process is not a child subreaper (%d, %v): what the run leaves goes to PID 1", on, err)
			}
		}
	}
	// A run its deadline kills leaves nothing either.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := Run(ctx, Request{
		Argv:   []string{"/bin/sh", "-c", "sleep 30 & sleep 30"},
		Policy: policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}},
		Limits: Limits{Timeout: 300 * time.Millisecond},
	})
	if err != nil || !out.TimedOut {
		t.Fatalf("the run past its deadline: %v, timed out %v", err, out.TimedOut)
	}
	after := children(t)
	for pid, st := range after {
		if _, ok := before[pid]; !ok {
			t.Errorf("left behind: pid %d (%s)", pid, st)
		}
	}
}
