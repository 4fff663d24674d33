package sandbox

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox/shim"
)

// TestHostPIDsPlan checks how a run that shares the host's PID namespace
// (system:read processes) is planned: it runs only where Landlock scopes
// signals (ABI 6) and seccomp filters, with or without bwrap, and says
// what it shares; a kernel with less refuses it, naming what is missing.
func TestHostPIDsPlan(t *testing.T) {
	full := Caps{BwrapUsable: true, LandlockABI: 7, Seccomp: true}
	for _, c := range []struct {
		name    string
		caps    Caps
		host    bool
		sandbox string
		refused string // a substring; "" when it runs
	}{
		{"every layer", full, true, "bwrap+landlock+seccomp", ""},
		{"no bwrap", Caps{BwrapError: "no bwrap", LandlockABI: 6, Seccomp: true}, true, "landlock+seccomp", ""},
		{"landlock abi 5", Caps{BwrapUsable: true, LandlockABI: 5, Seccomp: true}, true, "", "Landlock ABI 5 cannot keep the command from signalling"},
		{"landlock abi 5, own pid namespace", Caps{BwrapUsable: true, LandlockABI: 5, Seccomp: true}, false, "bwrap+landlock+seccomp", ""},
		{"no landlock", Caps{BwrapUsable: true, Seccomp: true}, true, "", "has no Landlock"},
		{"no seccomp", Caps{BwrapUsable: true, LandlockABI: 7}, true, "", "seccomp filters are not available"},
		{"disabled", Caps{BwrapUsable: true, LandlockABI: 7, Seccomp: true, Disabled: "disabled by METNOS_SANDBOX=off"}, true, "", "disabled by METNOS_SANDBOX=off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := policy.Policy{Profile: policy.ProfileManifest, HostPIDs: c.host}
			pl := planFor(c.caps, p, policy.LevelNone)
			if c.refused != "" {
				if !strings.Contains(pl.Refused, c.refused) || !strings.Contains(pl.Refused, "system:read processes") {
					t.Fatalf("refused = %q, want it to name system:read processes and %q", pl.Refused, c.refused)
				}
				return
			}
			if pl.Refused != "" {
				t.Fatalf("refused: %s", pl.Refused)
			}
			if pl.Sandbox != c.sandbox {
				t.Errorf("sandbox = %q, want %q", pl.Sandbox, c.sandbox)
			}
			if shares := strings.Contains(pl.Reason, "shares the host's PID namespace"); shares != c.host {
				t.Errorf("reason = %q: says it shares the host's PID namespace: %v, want %v", pl.Reason, shares, c.host)
			}
		})
	}
}

// TestHostPIDsLaunch checks what a run with HostPIDs asks of bwrap and
// the shim: no PID namespace of its own (the user namespace and the
// rest stay), a supervising shim that ends the tree, and the shim told
// to insist on the signal scope.
func TestHostPIDsLaunch(t *testing.T) {
	for _, host := range []bool{false, true} {
		p := policy.Policy{Profile: policy.ProfileManifest, HostPIDs: host}
		args, _, err := bwrapArgs(layout{Policy: p}, "/opt/metnos/metnos-shim", "/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(args, "--unshare-pid"); got == host {
			t.Errorf("HostPIDs %v: --unshare-pid present: %v", host, got)
		}
		for _, want := range []string{"--unshare-user", "--unshare-ipc", "--unshare-net", "--proc"} {
			if !slices.Contains(args, want) {
				t.Errorf("HostPIDs %v: %s missing from %q", host, want, args)
			}
		}
		spec, err := shimSpec(layout{Policy: p}, layers{true, true, true}, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if spec.HostPIDs != host {
			t.Errorf("HostPIDs %v: the shim's spec says %v", host, spec.HostPIDs)
		}
	}
}

// TestShimRefusesHostPIDsWithoutScope: the shim itself does not start a
// command that shares the host's PID namespace when Landlock or seccomp
// was not applied (a plan the kernel did not honour), and says why.
func TestShimRefusesHostPIDsWithoutScope(t *testing.T) {
	for _, spec := range []shim.Spec{
		{HostPIDs: true, Seccomp: false, Landlock: false},
		{HostPIDs: true, Landlock: true},
	} {
		args, err := shim.EncodeArgs(spec, []string{"/bin/echo", "RAN"})
		if err != nil {
			t.Fatal(err)
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], args...)
		cmd.ExtraFiles = []*os.File{w}
		out, err := cmd.Output()
		w.Close()
		status, _ := io.ReadAll(r)
		r.Close()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != shim.ExitShimFailed || strings.Contains(string(out), "RAN") {
			t.Errorf("spec %+v: the command ran (err %v, stdout %q)", spec, err, out)
		}
		if !strings.Contains(string(status), "shares the host's PID namespace and needs Landlock ABI 6") {
			t.Errorf("spec %+v: the shim's status %q does not say why it refused", spec, status)
		}
	}
}
