package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/testkit/winetest"
)

// testContainer is the AppContainer profile the tests use, not the
// agent's.
const testContainer = "Metnos.Agent.Test"

// cmdRequest runs System32's cmd.exe (readable in every AppContainer)
// with args, on the best rung the machine gives, with o.
func cmdRequest(t *testing.T, o Options, args ...string) Request {
	t.Helper()
	sys := systemDirs()
	if len(sys) == 0 {
		t.Fatal("no system folder")
	}
	env := []string{"SystemRoot=" + filepath.Dir(sys[0])}
	return Request{Argv: append([]string{filepath.Join(sys[0], "cmd.exe"), "/c"}, args...), Env: env, Options: o, Limits: Limits{Timeout: 20 * time.Second}}
}

// TestWindowsRungsAreHonest: Probe says a rung is there only when a
// process it started in that rung was found, by its token, to run in it,
// and says why not otherwise; a run reports the word of the best rung,
// and a minimum above it is refused before anything runs, saying why.
// Under Wine, which implements neither the AppContainer profiles nor
// integrity levels, it proves the honest fallback: the job object, with
// both reasons.
func TestWindowsRungsAreHonest(t *testing.T) {
	dir := winetest.TempDir(t)
	o := Options{ContainerName: testContainer, GrantLedger: filepath.Join(dir, "ledger")}
	c := Probe(o)
	t.Logf("appcontainer %v (%s); low integrity %v (%s)", c.AppContainer, c.AppContainerNote, c.LowIntegrity, c.LowIntegrityNote)
	if !c.AppContainer && c.AppContainerNote == "" || !c.LowIntegrity && c.LowIntegrityNote == "" {
		t.Fatalf("a rung is missing and Probe does not say why: %+v", c)
	}
	if winetest.UnderWine() {
		if c.AppContainer || c.LowIntegrity {
			t.Fatalf("under Wine, Probe claims a rung Wine does not implement: %+v", c)
		}
		for _, want := range []string{"has no CreateAppContainerProfile"} {
			if !strings.Contains(c.AppContainerNote, want) {
				t.Errorf("AppContainer note %q lacks %q", c.AppContainerNote, want)
			}
		}
		if !strings.Contains(c.LowIntegrityNote, "did not run at low integrity") {
			t.Errorf("low-integrity note %q does not say the process ran at another level", c.LowIntegrityNote)
		}
	}
	best := winBest(c)
	out, err := Run(context.Background(), cmdRequest(t, o, "exit 7"))
	if err != nil {
		t.Fatal(err)
	}
	if out.Sandbox != best.word() || out.ExitCode != 7 || out.Reason == "" {
		t.Errorf("word %q exit %d reason %q, want %q, 7 and a reason", out.Sandbox, out.ExitCode, out.Reason, best.word())
	}
	if !c.AppContainer && !strings.Contains(out.Reason, c.AppContainerNote) {
		t.Errorf("reason %q does not say why there is no AppContainer", out.Reason)
	}

	// The owner's switch.
	off := o
	off.NoAppContainer = "turned off by METNOS_SANDBOX_APPCONTAINER=0"
	if c := Probe(off); c.AppContainer || c.AppContainerNote != off.NoAppContainer {
		t.Errorf("switched off: %+v", c)
	}

	// A minimum the machine does not give: refused, nothing runs.
	if c.AppContainer {
		return
	}
	marker := filepath.Join(dir, "marker")
	req := cmdRequest(t, o, "echo ran > "+marker)
	req.MinSandbox = policy.LevelIsolated
	_, err = Run(context.Background(), req)
	var re *RefusedError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), `minimum sandbox "isolated" not met`) || !strings.Contains(err.Error(), c.AppContainerNote) {
		t.Errorf("min_sandbox isolated: %v", err)
	}
	if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Error("the refused command ran")
	}
}

// TestWindowsAppContainerConfines: in the AppContainer, a granted folder
// is readable and writable as granted and its ungranted sibling is not;
// a nucleus folder under the grant is denied; every entry the run added
// is gone afterwards and its ledger is empty. It needs a Windows that
// gives AppContainers (not Wine).
func TestWindowsAppContainerConfines(t *testing.T) {
	dir := winetest.TempDir(t)
	o := Options{ContainerName: testContainer, GrantLedger: filepath.Join(dir, "ledger")}
	if c := Probe(o); !c.AppContainer {
		t.Skipf("no AppContainer here: %s", c.AppContainerNote)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	granted, other, secret := filepath.Join(dir, "granted"), filepath.Join(dir, "other"), filepath.Join(dir, "granted", ".ssh")
	for _, d := range []string{granted, other, secret} {
		os.MkdirAll(d, 0o755)
	}
	os.WriteFile(filepath.Join(granted, "a"), []byte("granted"), 0o644)
	os.WriteFile(filepath.Join(other, "b"), []byte("other"), 0o644)
	os.WriteFile(filepath.Join(secret, "id"), []byte("secret"), 0o644)
	p := policy.Policy{
		Grants: []policy.Grant{{Path: filepath.Dir(self), Access: policy.Read, Own: true}, {Path: granted, Access: policy.Write}},
		Masks:  []policy.Mask{{Path: secret, Kind: policy.MaskDir, Why: "~/.ssh"}},
	}
	run := func(args ...string) Output {
		req := helper(t, args[0], args[1:]...)
		req.Options, req.Policy = o, p
		out, err := Run(context.Background(), req)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if out.Sandbox != wordAppContainer {
			t.Fatalf("%v ran as %q", args, out.Sandbox)
		}
		return out
	}
	if out := run("cat", filepath.Join(granted, "a")); out.ExitCode != 0 || string(out.Stdout) != "granted" {
		t.Errorf("the granted file: exit %d %q %q", out.ExitCode, out.Stdout, out.Stderr)
	}
	if out := run("cat", filepath.Join(other, "b")); out.ExitCode == 0 || strings.Contains(string(out.Stdout), "other") {
		t.Errorf("the ungranted sibling was read: %q", out.Stdout)
	}
	if out := run("cat", filepath.Join(secret, "id")); out.ExitCode == 0 || strings.Contains(string(out.Stdout), "secret") {
		t.Errorf("the nucleus under the grant was read: %q", out.Stdout)
	}
	if out := run("marker", filepath.Join(granted, "new")); out.ExitCode != 0 {
		t.Errorf("writing in the granted folder: exit %d %q", out.ExitCode, out.Stderr)
	}
	if out := run("marker", filepath.Join(other, "new")); out.ExitCode == 0 {
		t.Error("wrote in the ungranted sibling")
	}
	// The escape works outside: the same reads as this user.
	if b, err := os.ReadFile(filepath.Join(secret, "id")); err != nil || string(b) != "secret" {
		t.Fatalf("outside the sandbox the secret is not readable either (%v): the test proves nothing", err)
	}
	sid, err := containerSID(testContainer)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{granted, secret, filepath.Dir(self)} {
		acl, _, err := winACL{}.dacl(path)
		if err != nil {
			t.Fatal(err)
		}
		es, _ := parseACL(acl)
		b, _ := sidBytes(sid.String())
		for _, e := range es {
			if string(e.sid()) == string(b) && e.flags()&aceInherited == 0 {
				t.Errorf("%s still has an entry for the container", path)
			}
		}
	}
	if recs, _ := filepath.Glob(filepath.Join(o.GrantLedger, "*.json")); len(recs) > 0 {
		t.Errorf("ledger records left: %v", recs)
	}
}
