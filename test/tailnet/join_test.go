//go:build linux

package tailnet

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/testkit/tailnettest"
)

// TestJoinBadControl: register with a control URL that is not one is
// refused at once, naming it, with nothing started or written; with one
// that does not answer, it says every few seconds what it waits for,
// and gives up at --tailnet-wait with a sentence naming the URL.
func TestJoinBadControl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home)
	env = append(env, tailnettest.Knobs...)
	register := func(control string, more ...string) (int, string, time.Duration) {
		args := append([]string{"register", "--server", "http://metnos:8765", "--token", "DEV.x.y", "--name", "laptop", "--tailnet-control-url", control}, more...)
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "metnos-agent"), args...)
		cmd.Env = env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out), time.Since(start)
	}
	for _, bad := range []string{"notaurl", "ftp://headscale.example", "http://"} {
		code, out, took := register(bad)
		if code == 0 || strings.Contains(out, "joining the tailnet") || !strings.Contains(out, `"`+bad+`"`) || !strings.Contains(out, "http:// or https://") {
			t.Errorf("--tailnet-control-url %s: exit %d after %v (want a refusal before any joining):\n%s", bad, code, took, out)
		}
	}
	if _, err := os.Stat(filepath.Join(home, ".local", "share", "metnos", "tailnet")); err == nil {
		t.Error("a node was started for a control URL that is not one")
	}

	const control = "http://127.0.0.1:9"
	code, out, took := register(control, "--tailnet-wait", "12s")
	if code == 0 || took > 40*time.Second {
		t.Fatalf("an unreachable control server: exit %d after %v:\n%s", code, took, out)
	}
	if n := strings.Count(out, "joining the tailnet at 127.0.0.1:9: waiting for control ("); n < 2 {
		t.Errorf("%d progress lines while waiting 12 s, want one every 5 s:\n%s", n, out)
	}
	if !strings.Contains(out, "could not join the tailnet of "+control+" as laptop within 12s") {
		t.Errorf("the time-out does not say which control server did not answer:\n%s", out)
	}
}
