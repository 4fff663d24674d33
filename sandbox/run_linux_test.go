package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox/shim"
)

// TestFallbackLogsToCallersLogger: when bwrap turns out to be broken and
// Run falls back to a weaker sandbox, it says so to the logger the
// caller gave, and to no other (slog.Default is not the agent's log).
func TestFallbackLogsToCallersLogger(t *testing.T) {
	var dflt bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&dflt, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	var logs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := Run(ctx, Request{
		Argv:   []string{"/bin/true"},
		Policy: policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}, Network: true},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		// Present, and fails every run.
		Options: Options{Bwrap: "/bin/false"},
	})
	t.Logf("sandbox %q, err %v", out.Sandbox, err)
	const want = "bubblewrap is not usable here; falling back"
	if !strings.Contains(logs.String(), want) {
		t.Errorf("the caller's logger did not get %q:\n%s", want, logs.String())
	}
	if strings.Contains(dflt.String(), want) {
		t.Errorf("slog.Default got the sandbox's message:\n%s", dflt.String())
	}
}

// TestTimingSplitsSetup: a full run reports where its set-up went, step
// by step, from the shim's own clock: bwrap up to the shim's main, the
// shim's work, and the enforcing of Landlock and seccomp. (A plan has
// both layers or neither, when the shim does not run; TestSetupSteps
// covers a clock with steps missing.)
func TestTimingSplitsSetup(t *testing.T) {
	c := Probe(Options{})
	if !c.BwrapUsable || c.LandlockABI == 0 || !c.Seccomp {
		skipOrFail(t, fmt.Sprintf("this test needs bwrap, Landlock and seccomp (bwrap: %v %s; Landlock ABI %d; seccomp %v)", c.BwrapUsable, c.BwrapError, c.LandlockABI, c.Seccomp))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := Run(ctx, Request{
		Argv:   []string{"/bin/true"},
		Policy: policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}},
	})
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("run: %v, exit %d, stderr %s", err, out.ExitCode, out.Stderr)
	}
	if out.Sandbox != "bwrap+landlock+seccomp" {
		t.Fatalf("sandbox %q, want every layer", out.Sandbox)
	}
	tm := out.Timing
	if tm == nil {
		t.Fatal("no Timing in the output")
	}
	t.Logf("setup %v = bwrap %v + shim %v + landlock %v + seccomp %v + the ready line's way back", tm.Setup, tm.Bwrap, tm.Shim, tm.Landlock, tm.Seccomp)
	for name, d := range map[string]time.Duration{"bwrap": tm.Bwrap, "shim": tm.Shim, "landlock": tm.Landlock, "seccomp": tm.Seccomp} {
		if d <= 0 {
			t.Errorf("the %s step has no time (%v)", name, d)
		}
	}
}

// TestSetupSteps: the split of the set-up by the shim's clock, which
// runs on the wall clock: each step runs to the next one taken, and a
// step whose instants are out of order (the clock was set meanwhile)
// is zero rather than wrong.
func TestSetupSteps(t *testing.T) {
	at := time.Unix(1000, 0)
	ns := func(ms int64) int64 { return at.UnixNano() + ms*int64(time.Millisecond) }
	for _, tc := range []struct {
		name  string
		clock *shim.Clock
		want  [4]time.Duration
	}{
		{"no clock", nil, [4]time.Duration{}},
		{"every step", &shim.Clock{Main: ns(5), Landlock: ns(7), Seccomp: ns(8), Done: ns(10)},
			[4]time.Duration{5 * time.Millisecond, 2 * time.Millisecond, time.Millisecond, 2 * time.Millisecond}},
		{"no landlock", &shim.Clock{Main: ns(5), Seccomp: ns(8), Done: ns(10)},
			[4]time.Duration{5 * time.Millisecond, 3 * time.Millisecond, 0, 2 * time.Millisecond}},
		{"neither layer", &shim.Clock{Main: ns(5), Done: ns(10)},
			[4]time.Duration{5 * time.Millisecond, 5 * time.Millisecond, 0, 0}},
		{"clock set back during bwrap", &shim.Clock{Main: ns(-50), Landlock: ns(-48), Seccomp: ns(-47), Done: ns(-45)},
			[4]time.Duration{0, 2 * time.Millisecond, time.Millisecond, 2 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got [4]time.Duration
			got[0], got[1], got[2], got[3] = setupSteps(at, tc.clock)
			if got != tc.want {
				t.Errorf("setupSteps = %v, want %v", got, tc.want)
			}
		})
	}
}
