//go:build linux

package hostile

import (
	"errors"
	"strings"
	"testing"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/testkit/testbin"
)

// TestFallback: without bwrap (hidden, or present but broken) Run falls
// back to Landlock and seccomp, says so, and still hides the nucleus and
// refuses writes outside the grants.
func TestFallback(t *testing.T) {
	requireSandbox(t, false)
	for _, bw := range []struct{ name, path string }{
		{"bwrap-hidden", hiddenBwrap},
		{"bwrap-broken", "/bin/false"},
	} {
		t.Run(bw.name, func(t *testing.T) {
			t.Setenv("METNOS_SANDBOX", "")
			t.Setenv("METNOS_BWRAP", bw.path)
			fx := newFixture(t)
			var script strings.Builder
			for _, s := range fx.Secrets {
				script.WriteString("cat " + fx.path(s.Rel) + "\n")
			}
			script.WriteString("echo PWNED >> " + fx.Outside + "/target.txt\n")
			pol := supervised([]string{"{{HOME}}"}, []string{"{{WORK}}"})(t, fx)
			r, err := tryInside(fx, pol, shArgv(script.String()), sandbox.Limits{})
			if err != nil {
				t.Fatalf("Run with %s refused or failed instead of falling back: %v", bw.path, err)
			}
			if r.out.Sandbox != "landlock+seccomp" {
				t.Errorf("Output.Sandbox is %q with %s, want landlock+seccomp", r.out.Sandbox, bw.path)
			}
			if !strings.Contains(r.out.Reason, "bwrap") {
				t.Errorf("Output.Reason does not say why bwrap was not used: %q", r.out.Reason)
			}
			if !strings.Contains(r.stdout, startedMark) {
				t.Fatalf("the command never started:\n%s", r)
			}
			for _, s := range fx.Secrets {
				if strings.Contains(r.stdout, s.Token) {
					t.Errorf("secret readable inside the sandbox after falling back: %s", s.Name)
				}
			}
			if fileHas(fx.Outside+"/target.txt", "PWNED") {
				t.Errorf("host file outside every grant changed after falling back: %s/target.txt", fx.Outside)
			}
		})
	}
}

// TestRefused: what cannot be enforced is refused, and nothing runs.
func TestRefused(t *testing.T) {
	fx := newFixture(t)
	canary := func(t *testing.T) []string {
		return shArgv("echo RAN > " + fx.Work + "/ran")
	}
	for _, c := range []struct {
		name     string
		bwrap    string
		disabled bool
		policy   func(t *testing.T) policy.Policy
		min      policy.Level
	}{
		{
			name: "network-cut-with-no-layer", bwrap: hiddenBwrap, disabled: true,
			policy: func(t *testing.T) policy.Policy { return supervised(nil, []string{"{{WORK}}"})(t, fx) },
		},
		{
			name: "full-fs-no-net-bwrap-hidden", bwrap: hiddenBwrap,
			policy: func(t *testing.T) policy.Policy { return profileOnly(policy.ProfileFullFSNoNet)(t, fx) },
		},
		{
			name: "full-fs-no-net-bwrap-broken", bwrap: "/bin/false",
			policy: func(t *testing.T) policy.Policy { return profileOnly(policy.ProfileFullFSNoNet)(t, fx) },
		},
		{
			name: "manifest-min-sandbox-full-bwrap-hidden", bwrap: hiddenBwrap,
			policy: func(t *testing.T) policy.Policy {
				p, err := policy.Derive(policy.DeriveInput{
					Manifest: manifestOf("full", []policy.Capability{{Name: "fs:write", Hints: []string{"~/work/**"}}}),
					Host:     fx.Host,
				})
				if err != nil {
					t.Fatal(err)
				}
				return p
			},
		},
		{
			name: "agent-min-sandbox-full-bwrap-hidden", bwrap: hiddenBwrap, min: policy.LevelFull,
			policy: func(t *testing.T) policy.Policy { return supervised(nil, []string{"{{WORK}}"})(t, fx) },
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.bwrap != hiddenBwrap {
				requireSandbox(t, false)
			}
			fx.reset(t)
			t.Setenv("METNOS_BWRAP", c.bwrap)
			t.Setenv("METNOS_SANDBOX", "")
			if c.disabled {
				t.Setenv("METNOS_SANDBOX", "off")
			}
			pol := c.policy(t)
			out, err := sandbox.Run(t.Context(), sandbox.Request{
				Argv: canary(t), Env: fx.env(), Policy: pol, MinSandbox: c.min,
				Options: testbin.SandboxOptions(),
			})
			if !errors.Is(err, sandbox.ErrRefused) {
				t.Errorf("Run was not refused (err %v, sandbox %q): a policy this machine cannot enforce must not run", err, out.Sandbox)
			}
			var re *sandbox.RefusedError
			if errors.As(err, &re) && re.Why == "" {
				t.Errorf("RefusedError without a reason: %v", err)
			}
			if exists(fx.Work + "/ran") {
				t.Errorf("the command ran although Run refused it")
			}
		})
	}
}
