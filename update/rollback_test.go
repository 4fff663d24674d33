//go:build unix

package update

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/metnos/agent/wire"
)

// TestCrashingBuildRolledBack: the test is the supervisor of a build
// that exits 2 at every start. After its MaxBoots starts, the next start
// (the crashing build's own Boot) puts the previous build back and
// exits 0; the previous build then runs, the failure is recorded for
// the heartbeat, the crashing build is kept as .failed, and the same
// descriptor is not applied again.
func TestCrashingBuildRolledBack(t *testing.T) {
	a := agents(t)
	s := newServer(t)
	d := install(t, a.old)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.crash))
	if err := d.updater(t, s, false).Apply(context.Background(), desc); !errors.Is(err, ErrRestart) {
		t.Fatalf("Apply: %v, want ErrRestart", err)
	}
	start := func() (string, int) {
		out, err := exec.Command(d.Exe, "run", d.state).CombinedOutput()
		return strings.TrimSpace(string(out)), exitCode(err)
	}
	for i := 1; i <= MaxBoots; i++ {
		if out, code := start(); code != 2 {
			t.Fatalf("start %d of the crashing build: exit %d (%s), want 2", i, code, out)
		}
		if st := d.load(t); st.Phase != PhaseProbation || st.Boots != i {
			t.Fatalf("after start %d the record is %+v", i, st)
		}
	}
	if out, code := start(); code != 0 || out != "rolled back 2.0.0" {
		t.Fatalf("start %d: exit %d (%s), want the rollback and exit 0", MaxBoots+1, code, out)
	}
	if got := version(t, d.Exe); got != "metnos-agent 1.0.0" {
		t.Fatalf("after the rollback the executable says %q", got)
	}
	if out, code := start(); code != 0 || out != "running 1.0.0" {
		t.Fatalf("the previous build's start: exit %d (%s)", code, out)
	}
	st := d.load(t)
	if st.Phase != PhaseNone || st.Failed == nil || !st.Failed.RolledBack || st.Failed.Version != "2.0.0" || st.Failed.SHA256 != desc.SHA256 {
		t.Fatalf("record after the rollback: %+v (failed %+v)", st, st.Failed)
	}
	if fileSum(t, d.Failed) != desc.SHA256 || exists(d.Old) {
		t.Fatal("the crashing build is not kept as .failed, or .old is left")
	}
	u := d.updater(t, s, false)
	if got := u.Summary(); !strings.Contains(got, "update to 2.0.0 rolled back") || !strings.Contains(got, "started 2 times without reaching a successful poll") {
		t.Errorf("summary for the heartbeat: %q", got)
	}
	if dec, err := u.Check(context.Background(), false); err != nil || dec.Apply {
		t.Fatalf("Check of the rolled-back build: %+v, %v; want it refused", dec, err)
	}
}

// TestNeverConfirmedRolledBack: a build that starts but never reaches
// a successful poll (run's probation watch stops it with exit 1, which
// the supervisor follows with another start) is rolled back at the
// start after its MaxBoots: each start here is Boot without Confirm.
func TestNeverConfirmedRolledBack(t *testing.T) {
	a := agents(t)
	s := newServer(t)
	d := install(t, a.old)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.new))
	if err := d.updater(t, s, false).Apply(context.Background(), desc); !errors.Is(err, ErrRestart) {
		t.Fatalf("Apply: %v, want ErrRestart", err)
	}
	for i := 1; i <= MaxBoots; i++ {
		out, st, err := Boot(d.state, d.Files, nil)
		if err != nil || out != Probation || st.Boots != i {
			t.Fatalf("start %d: %v, %+v, %v; want start %d on probation", i, out, st, err, i)
		}
		if u := d.updater(t, s, true); !u.Probation() || !strings.Contains(u.Summary(), fmt.Sprintf("on probation: 2.0.0, start %d of %d", i, MaxBoots)) {
			t.Fatalf("start %d: probation %v, summary %q", i, u.Probation(), u.Summary())
		}
		if got := version(t, d.Exe); got != "metnos-agent 2.0.0" {
			t.Fatalf("start %d runs %q", i, got)
		}
	}
	out, st, err := Boot(d.state, d.Files, nil)
	if err != nil || out != RolledBack {
		t.Fatalf("start %d: %v, %v; want the rollback", MaxBoots+1, out, err)
	}
	if got := version(t, d.Exe); got != "metnos-agent 1.0.0" {
		t.Fatalf("after the rollback the executable says %q", got)
	}
	if st.Phase != PhaseNone || st.Failed == nil || !st.Failed.RolledBack || st.Failed.Version != "2.0.0" {
		t.Fatalf("record after the rollback: %+v", st)
	}
	if out, _, err := Boot(d.state, d.Files, nil); err != nil || out != Normal {
		t.Fatalf("the previous build's start: %v, %v", out, err)
	}
}
