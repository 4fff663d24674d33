//go:build linux

package hostile

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/metnos/agent/sandbox"
)

// TestPreloadDoesNotReachHost: the command's environment is the
// command's. An LD_PRELOAD in it must not be loaded by the host programs
// that build the sandbox (bwrap runs unconfined): the library, which
// leaves a mark when loaded, does so when a host program runs with that
// environment, and not when the sandbox runs one.
func TestPreloadDoesNotReachHost(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is needed to build the preload library")
	}
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		mark := filepath.Join(fx.Outside, "preloaded")
		src := filepath.Join(fx.Outside, "evil.c")
		lib := filepath.Join(fx.Outside, "evil.so")
		writeFile(t, src, `#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) { close(open("`+mark+`", O_CREAT|O_WRONLY, 0644)); }
`, 0o644)
		if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
			t.Fatalf("building the library: %v\n%s", err, out)
		}
		env := append(fx.env(), "LD_PRELOAD="+lib)

		host := exec.Command("/bin/true")
		host.Env = env
		if err := host.Run(); err != nil || !exists(mark) {
			t.Fatalf("the preload library does not work even on the host (%v), so this test proves nothing", err)
		}
		os.Remove(mark)

		pol := fx.profile(t, sandbox.ProfileSupervised, nil, nil, false)
		out, err := sandbox.Run(context.Background(), sandbox.Request{Argv: []string{"/bin/true"}, Env: env, Policy: pol, Limits: sandbox.Limits{Timeout: 20 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		if out.Sandbox != m.word() {
			t.Fatalf("sandbox %q, want %q", out.Sandbox, m.word())
		}
		if exists(mark) {
			t.Errorf("ATTACK SUCCEEDED: the command's LD_PRELOAD was loaded outside the sandbox (%s)\n%s", m.name, out.Stderr)
		}
	})
}
