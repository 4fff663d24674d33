//go:build linux

package hostile

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/testkit/testbin"
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

		pol := fx.profile(t, policy.ProfileSupervised, nil, nil, false)
		out, err := sandbox.Run(context.Background(), sandbox.Request{Argv: []string{"/bin/true"}, Env: env, Policy: pol, Limits: sandbox.Limits{Timeout: 20 * time.Second}, Options: testbin.SandboxOptions()})
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

// TestEnvNotInCommandLines: the command's environment is in no command
// line while it runs (every user of the machine can read those), and a
// large one (two variables of 100 KiB, over the 128 KiB an argument may
// have) reaches the command whole.
func TestEnvNotInCommandLines(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		tok := token("METNOS-ENVSECRET")
		scan := func() bool {
			procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
			for _, p := range procs {
				if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(tok)) {
					return true
				}
			}
			return false
		}
		// The scanner finds a token that is in a command line.
		host := exec.Command("/bin/sh", "-c", "sleep 1", tok)
		host.Start()
		time.Sleep(200 * time.Millisecond)
		seen := scan()
		host.Wait()
		if !seen {
			t.Fatal("the scanner does not find a token in a command line, so this test proves nothing")
		}

		big := strings.Repeat("x", 100<<10)
		env := append(fx.env(), "API_TOKEN="+tok, "BIG1="+big, "BIG2="+big)
		pol := fx.profile(t, policy.ProfileSupervised, nil, nil, false)
		done := make(chan sandbox.Output)
		go func() {
			out, err := sandbox.Run(context.Background(), sandbox.Request{
				Argv: []string{python, "-c", "import os, time; print(len(os.environ['BIG1']) + len(os.environ['BIG2']), os.environ['API_TOKEN'][:6]); time.sleep(1.5)"},
				Env:  env, Policy: pol, Limits: sandbox.Limits{Timeout: 20 * time.Second}, Options: testbin.SandboxOptions()})
			if err != nil {
				t.Error(err)
			}
			done <- out
		}()
		leaked := false
		for i := 0; i < 10; i++ {
			time.Sleep(100 * time.Millisecond)
			leaked = leaked || scan()
		}
		out := <-done
		if leaked {
			t.Errorf("ATTACK SUCCEEDED: the command's environment was readable in a command line (%s)", m.name)
		}
		if got := strings.TrimSpace(string(out.Stdout)); got != "204800 METNOS" || out.Sandbox != m.word() {
			t.Errorf("the command saw %q under %s (stderr %s)", got, out.Sandbox, out.Stderr)
		}
	})
}
