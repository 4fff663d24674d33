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

// TestHostNetViewPlan checks how a run that reads the host's network
// interfaces with the network cut (system:read network_interfaces) is
// planned: it runs wherever seccomp filters (with or without bwrap),
// says what it shares, and is refused without seccomp; with unix
// sockets allowed it also needs Landlock's abstract-socket scope.
func TestHostNetViewPlan(t *testing.T) {
	full := Caps{BwrapUsable: true, LandlockABI: 7, Seccomp: true}
	for _, c := range []struct {
		name    string
		caps    Caps
		view    bool
		network bool
		unix    bool
		sandbox string
		refused string // a substring; "" when it runs
	}{
		{"every layer", full, true, false, false, "bwrap+landlock+seccomp", ""},
		{"no bwrap", Caps{BwrapError: "no bwrap", LandlockABI: 6, Seccomp: true}, true, false, false, "landlock+seccomp", ""},
		{"no seccomp", Caps{BwrapUsable: true, LandlockABI: 7}, true, false, false, "", "without seccomp"},
		{"no seccomp, no view", Caps{BwrapUsable: true, LandlockABI: 7}, false, false, false, "bwrap+landlock", ""},
		{"unix sockets, landlock abi 5", Caps{BwrapUsable: true, LandlockABI: 5, Seccomp: true}, true, false, true, "", "abstract unix sockets"},
		{"unix sockets, landlock abi 6", Caps{BwrapUsable: true, LandlockABI: 6, Seccomp: true}, true, false, true, "bwrap+landlock+seccomp", ""},
		{"network open: nothing to say", full, true, true, false, "bwrap+landlock+seccomp", ""},
		{"disabled", Caps{BwrapUsable: true, LandlockABI: 7, Seccomp: true, Disabled: "disabled by METNOS_SANDBOX=off"}, true, false, false, "", "disabled by METNOS_SANDBOX=off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := policy.Policy{Profile: policy.ProfileManifest, HostNetView: c.view, Network: c.network, UnixSockets: c.unix}
			pl := planFor(c.caps, p, policy.LevelNone)
			if c.refused != "" {
				if !strings.Contains(pl.Refused, c.refused) || !strings.Contains(pl.Refused, "system:read network_interfaces") {
					t.Fatalf("refused = %q, want it to name system:read network_interfaces and %q", pl.Refused, c.refused)
				}
				return
			}
			if pl.Refused != "" {
				t.Fatalf("refused: %s", pl.Refused)
			}
			if pl.Sandbox != c.sandbox {
				t.Errorf("sandbox = %q, want %q", pl.Sandbox, c.sandbox)
			}
			if shares := strings.Contains(pl.Reason, "host's network namespace read-only"); shares != (c.view && !c.network) {
				t.Errorf("reason = %q: says it shares the host's network namespace: %v", pl.Reason, shares)
			}
		})
	}
}

// TestHostNetViewLaunch checks what such a run asks of bwrap and the
// shim: no network namespace of its own, the network still cut (and
// the shim told so), the other namespaces kept.
func TestHostNetViewLaunch(t *testing.T) {
	for _, view := range []bool{false, true} {
		p := policy.Policy{Profile: policy.ProfileManifest, HostNetView: view}
		args, _, err := bwrapArgs(layout{Policy: p}, "/opt/metnos/metnos-shim", "/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(args, "--unshare-net"); got == view {
			t.Errorf("HostNetView %v: --unshare-net present: %v", view, got)
		}
		for _, want := range []string{"--unshare-user", "--unshare-ipc", "--unshare-pid", "--cap-drop"} {
			if !slices.Contains(args, want) {
				t.Errorf("HostNetView %v: %s missing from %q", view, want, args)
			}
		}
		spec, err := shimSpec(layout{Policy: p}, layers{true, true, true}, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if !spec.NetCut || spec.NetView != view {
			t.Errorf("HostNetView %v: the shim's spec says NetCut %v NetView %v", view, spec.NetCut, spec.NetView)
		}
	}
}

// TestShimRefusesNetViewWithoutSeccomp: the shim does not start a
// command in the host's network namespace with the network cut when
// the seccomp filter was not applied.
func TestShimRefusesNetViewWithoutSeccomp(t *testing.T) {
	args, err := shim.EncodeArgs(shim.Spec{NetCut: true, NetView: true, Landlock: true}, []string{"/bin/echo", "RAN"})
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
		t.Errorf("the command ran (err %v, stdout %q)", err, out)
	}
	if !strings.Contains(string(status), "host's network interfaces with the network cut and needs seccomp") {
		t.Errorf("the shim's status %q does not say why it refused", status)
	}
}
