package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/update"
)

// TestUpdateDevBuild: a development build (version dev, as `go build`
// without a release's stamp makes, and as this test binary is) has no
// release to be replaced by. `metnos-agent update` and `update --check`
// say so in one sentence and exit 1, rather than crash.
func TestUpdateDevBuild(t *testing.T) {
	if v := version(); v != "dev" {
		t.Skipf("this test binary is version %q, not a development build", v)
	}
	for _, args := range [][]string{{"--check"}, nil} {
		std, e, out, errb := identityStd(t, false)
		writePaired(t, e)
		var code int
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("update %v panicked: %v", args, r)
				}
			}()
			code = runUpdate(std, args)
		}()
		if code != exitFailure || !strings.Contains(errb.String(), "development build") {
			t.Errorf("update %v: exit %d, stdout %q, stderr %q; want exit %d saying it is a development build", args, code, out, errb, exitFailure)
		}
	}
}

// TestRunHelpWhileRunning: `metnos-agent run --help` on a device with an
// update record, while its agent runs (holding the lock), prints run's
// help and exits 0: asking for help is not a start of the build (which
// would count against a build on probation) and does not need the lock.
func TestRunHelpWhileRunning(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("USERPROFILE", home)
	t.Setenv(layout.DataDirEnv, filepath.Join(home, "data"))
	e, err := processEnvironment()
	if err != nil {
		t.Fatal(err)
	}
	lay := e.lay
	os.MkdirAll(lay.Data, 0o700)
	st := update.State{Phase: update.PhaseProbation, Version: "2.0.0", SHA256: strings.Repeat("a", 64), Previous: strings.Repeat("b", 64)}
	if err := update.SaveState(lay.UpdateState(), st); err != nil {
		t.Fatal(err)
	}
	held, err := lockfile.Lock(lay.Lock())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	var out, errb bytes.Buffer
	code := runRun(stdio{out: &out, err: &errb}, []string{"--help"})
	if code != exitOK || !strings.Contains(out.String(), "min-sandbox") {
		t.Errorf("run --help: exit %d, stdout %q, stderr %q; want run's help and exit 0", code, out.String(), errb.String())
	}
	if got, err := update.LoadState(lay.UpdateState()); err != nil || got.Boots != 0 {
		t.Errorf("run --help counted a start of the build on probation: %+v, %v", got, err)
	}
}
