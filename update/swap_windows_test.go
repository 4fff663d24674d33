package update

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/testkit/winetest"
)

// TestWindowsSwapRunningExecutable runs the Windows swap for real, on a
// running executable: a copy of this test binary, started as
// metnos-agent.exe, swaps its own file for a new build (Windows can
// rename a running executable, not replace it) and rolls itself back;
// a kill between the two renames of a swap, or of a rollback, leaves
// only metnos-agent.old.exe, which the next start's Boot puts back.
func TestWindowsSwapRunningExecutable(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	oldBuild, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	// The same program with bytes after its end: another build that
	// runs, with another sha256.
	newBuild := append(bytes.Clone(oldBuild), []byte("\x00metnos-agent 2.0.0\x00")...)
	dir := winetest.TempDir(t)
	d := installAt(t, self, filepath.Join(dir, "metnos-agent.exe"), filepath.Join(dir, "agent-update.json"))
	if d.New != filepath.Join(dir, "metnos-agent.new.exe") || d.Old != filepath.Join(dir, "metnos-agent.old.exe") {
		t.Fatalf("FilesFor: %+v", d.Files)
	}
	is := func(path string, want []byte, what string) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("%s is not the %s (%v)", path, what, err)
		}
	}
	// run starts d.Exe as a child in mode on its own files.
	run := func(mode string, env ...string) (string, error) {
		cmd := exec.Command(d.Exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), append([]string{"METNOS_UPDATE_CHILD=" + mode, "METNOS_UPDATE_EXE=self",
			"METNOS_UPDATE_STATE=" + d.state}, env...)...)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}

	// The running executable swaps itself for the new build.
	if err := os.WriteFile(d.New, newBuild, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := run("swap"); err != nil || out != "swap: <nil>" {
		t.Fatalf("the swap of the running executable: %v\n%s", err, out)
	}
	is(d.Exe, newBuild, "new build")
	is(d.Old, oldBuild, "previous build")
	if exists(d.New) {
		t.Error(".new.exe is left after the swap")
	}

	// The new build, running, fails its probation and rolls itself back.
	st := State{Phase: PhaseProbation, Version: "2.0.0", SHA256: fileSum(t, d.Exe), Previous: fileSum(t, d.Old), Boots: MaxBoots}
	if err := SaveState(d.state, st); err != nil {
		t.Fatal(err)
	}
	if out, err := run("boot"); err != nil || !strings.HasPrefix(out, "boot: 2 ") {
		t.Fatalf("the rollback by the running build: %v\n%s (want outcome %d)", err, out, RolledBack)
	}
	is(d.Exe, oldBuild, "previous build, back in place")
	is(d.Failed, newBuild, "failed build")
	if exists(d.Old) {
		t.Error(".old.exe is left after the rollback")
	}
	if st := d.load(t); st.Phase != PhaseNone || st.Failed == nil || !st.Failed.RolledBack {
		t.Fatalf("record after the rollback: %+v", st)
	}

	// Killed between the two renames of a swap: only .old.exe is left,
	// and the next start puts it back.
	if err := os.WriteFile(d.New, newBuild, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := run("swap", "METNOS_UPDATE_KILL_AT=kept-old")
	if exitCode(err) != 9 {
		t.Fatalf("the swap was not killed between its renames: %v\n%s", err, out)
	}
	if exists(d.Exe) || !exists(d.Old) {
		t.Fatalf("after the kill: %s exists %v, %s exists %v; want only the second", d.Exe, exists(d.Exe), d.Old, exists(d.Old))
	}
	if out, _, err := Boot(d.state, d.Files, nil); err != nil || out != Normal {
		t.Fatalf("Boot: %v, %v", out, err)
	}
	is(d.Exe, oldBuild, "previous build, put back by Boot")
	if out, err := run("boot"); err != nil || out != "boot: 0 <nil>" {
		t.Fatalf("the build put back does not start: %v\n%s", err, out)
	}

	// Killed between the two renames of a rollback by the running new
	// build: the next start puts .old.exe back too.
	if out, err := run("swap"); err != nil || out != "swap: <nil>" {
		t.Fatalf("the swap: %v\n%s", err, out)
	}
	st = State{Phase: PhaseProbation, Version: "2.0.0", SHA256: fileSum(t, d.Exe), Previous: fileSum(t, d.Old), Boots: MaxBoots}
	if err := SaveState(d.state, st); err != nil {
		t.Fatal(err)
	}
	out, err = run("boot", "METNOS_UPDATE_KILL_AT=kept-failed")
	if exitCode(err) != 9 {
		t.Fatalf("the rollback was not killed between its renames: %v\n%s", err, out)
	}
	if exists(d.Exe) || !exists(d.Old) {
		t.Fatalf("after the kill: %s exists %v, %s exists %v; want only the second", d.Exe, exists(d.Exe), d.Old, exists(d.Old))
	}
	if out, st, err := Boot(d.state, d.Files, nil); err != nil || out != Normal || st.Phase != PhaseNone || st.Failed == nil || !st.Failed.RolledBack {
		t.Fatalf("Boot: %v, %+v, %v", out, st, err)
	}
	is(d.Exe, oldBuild, "previous build, put back by Boot")
	is(d.Failed, newBuild, "failed build")
	if out, err := run("boot"); err != nil || out != "boot: 0 <nil>" {
		t.Fatalf("the build put back does not start: %v\n%s", err, out)
	}
}
