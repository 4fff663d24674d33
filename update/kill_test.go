//go:build unix

package update

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/metnos/agent/wire"
)

// killedAt runs the test binary as a child in mode (apply, boot) on d,
// killed with -9 by the step hook at step, and fails the test unless it
// died of that signal (the step was reached).
func killedAt(t *testing.T, d device, mode, step string, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"METNOS_UPDATE_CHILD=" + mode, "METNOS_UPDATE_EXE=" + d.Exe,
		"METNOS_UPDATE_STATE=" + d.state, "METNOS_UPDATE_KILL_AT=" + step}, env...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the child was not killed at %s: %v\n%s", step, err, out)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed at %s: %v\n%s", step, err, out)
	}
}

// TestKill9 kills the update with -9 after each step that changes a
// file, in Apply and in Boot's rollback, and checks what the next start
// finds: an executable that runs, the old build or the verified new
// one, a record that puts on probation only the new build, and a cycle
// that then completes (the new build confirmed, .old deleted, its
// version applied).
func TestKill9(t *testing.T) {
	a := agents(t)
	for _, c := range []struct {
		step string
		// rollback: the kill is in Boot rolling back the crashing build.
		rollback bool
		// killed: the version at the executable's path right after the
		// kill, what the supervisor starts next.
		killed string
		// after the next start's Boot: the version that runs, and the
		// outcome.
		version string
		outcome Outcome
	}{
		{step: "downloaded", killed: "1.0.0", version: "1.0.0", outcome: Normal},
		{step: "marked", killed: "1.0.0", version: "1.0.0", outcome: Normal},
		{step: "kept-old", killed: "1.0.0", version: "1.0.0", outcome: Normal},
		{step: "swapped", killed: "2.0.0", version: "2.0.0", outcome: Probation},
		{step: "kept-failed", rollback: true, killed: "2.0.0", version: "1.0.0", outcome: RolledBack},
		{step: "rolled-back", rollback: true, killed: "1.0.0", version: "1.0.0", outcome: Normal},
	} {
		t.Run(c.step, func(t *testing.T) {
			s := newServer(t)
			d := install(t, a.old)
			if !c.rollback {
				desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.new))
				b, _ := json.Marshal(desc)
				killedAt(t, d, "apply", c.step, "METNOS_UPDATE_URL="+s.URL, "METNOS_UPDATE_DESC="+string(b))
			} else {
				// The crashing build in place, started and crashed twice.
				desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.crash))
				if err := d.updater(t, s, false).Apply(context.Background(), desc); !errors.Is(err, ErrRestart) {
					t.Fatalf("Apply: %v", err)
				}
				for i := 0; i < MaxBoots; i++ {
					if err := exec.Command(d.Exe, "run", d.state).Run(); exitCode(err) != 2 {
						t.Fatalf("start %d of the crashing build: %v, want exit 2", i+1, err)
					}
				}
				killedAt(t, d, "boot", c.step)
			}

			// The supervisor finds a build at the executable's path (on
			// Linux and macOS nothing puts one back before it starts it).
			if got := version(t, d.Exe); got != "metnos-agent "+c.killed {
				t.Fatalf("right after the kill at %s the executable says %q, want %s", c.step, got, c.killed)
			}

			// The next start.
			out, _, err := Boot(d.state, d.Files, nil)
			if err != nil {
				t.Fatalf("Boot: %v", err)
			}
			if got := version(t, d.Exe); got != "metnos-agent "+c.version {
				t.Fatalf("after the kill at %s the executable says %q, want %s", c.step, got, c.version)
			}
			if out != c.outcome {
				t.Fatalf("Boot: outcome %v, want %v", out, c.outcome)
			}
			st := d.load(t)
			if onNew := fileSum(t, d.Exe) == st.SHA256; (st.Phase == PhaseProbation) != onNew || (out == Probation) != onNew {
				t.Fatalf("record %+v, outcome %v, with the executable %s the build on probation: %v", st, out, d.Exe, onNew)
			}
			if out != Probation && exists(d.Old) {
				t.Errorf("%s is left beside the previous build", d.Old)
			}
			if c.rollback {
				if st.Failed == nil || !st.Failed.RolledBack || st.Failed.Version != "2.0.0" || fileSum(t, d.Failed) != sum(read(t, a.crash)) {
					t.Fatalf("after the rollback: record %+v; want the failure of 2.0.0 and the crashing build kept as .failed", st)
				}
				if got := st.Summary(); !strings.Contains(got, "update to 2.0.0 rolled back") {
					t.Errorf("summary %q", got)
				}
				if exists(d.Old) {
					t.Error(".old is left after the rollback")
				}
			}

			// The cycle completes.
			if out != Probation {
				desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.new))
				u := d.updater(t, s, false)
				if dec, err := u.Check(context.Background(), false); err != nil || !dec.Apply {
					t.Fatalf("Check after the kill: %+v, %v", dec, err)
				}
				if err := u.Apply(context.Background(), desc); !errors.Is(err, ErrRestart) {
					t.Fatalf("Apply after the kill: %v", err)
				}
			}
			if b, err := exec.Command(d.Exe, "run", d.state).CombinedOutput(); err != nil || strings.TrimSpace(string(b)) != "running 2.0.0" {
				t.Fatalf("the new build's start: %v\n%s", err, b)
			}
			assertConfirmed(t, d, "2.0.0")
			if st := d.load(t); st.Failed != nil {
				t.Errorf("the confirmed update left the failure recorded: %+v", st.Failed)
			}
		})
	}
}
