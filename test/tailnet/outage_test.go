//go:build linux

package tailnet

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// TestOutage: with control, DERP and the server all gone, whoami no
// longer says the tailnet is up, but when the server last answered and
// what the node cannot reach, and gives the peers online only as
// control last gave them, dated from before the outage; the agent logs
// the outage once, at warn, and its end at info; and whoami says the
// server answers again.
func TestOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, refserver.Config{PollCheck: 20 * time.Millisecond}, 0o600)
	tok, _ := w.srv.IssueToken("laptop", 10*time.Minute)
	if code, out := w.cli("register", "--server", "http://metnos:8765", "--token", tok, "--tailnet-control-url", w.control, "--tailnet-authkey-file", w.keyFile, "--name", "laptop"); code != 0 {
		t.Fatalf("register over the tailnet: exit %d\n%s", code, out)
	}
	cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), "run")
	cmd.Env = w.env
	logPath := filepath.Join(w.home, "run.log")
	logf, _ := os.Create(logPath)
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	agentLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	serve := func(what string) {
		t.Helper()
		id, _ := w.srv.Enqueue(w.srv.Devices()[0].ID, "echo_args", map[string]any{}, refserver.EnqueueOptions{})
		wctx, wcancel := context.WithTimeout(ctx, 100*time.Second)
		defer wcancel()
		if info, err := w.srv.Wait(wctx, id); err != nil || info.State != "done" {
			t.Fatalf("%s: the agent did not serve over the tailnet: %v %s\n%s", what, err, info.ResultBody, agentLog())
		}
	}
	// waitWhoami waits until whoami's output has every one of want.
	waitWhoami := func(what string, want ...string) string {
		t.Helper()
		var out string
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
			_, out = w.cli("whoami")
			ok := true
			for _, s := range want {
				ok = ok && strings.Contains(out, s)
			}
			if ok {
				return out
			}
		}
		t.Fatalf("%s: whoami never said %q:\n%s\nagent log:\n%s", what, want, out, agentLog())
		return ""
	}
	serve("before the outage")
	out := waitWhoami("before the outage", "tailnet:             node up, server last answered")
	if !regexp.MustCompile(`tailnet peers: +\d+ of 1 online as of [0-9:-]+( [0-9:]+)?\n`).MatchString(out) {
		t.Errorf("before the outage, whoami does not give the peers online, dated:\n%s", out)
	}

	outageAt := time.Now()
	w.tc.Outage(true) // the server's handler too: see newWorld
	// (The node counts its relay lost after 2 minutes of silence, as
	// tailscale does: not waited for here.)
	out = waitWhoami("during the outage", "tailnet:             no answer from the server since", "control unreachable", ", when control was last reached")
	for _, bad := range []string{"node up", "connected"} {
		if strings.Contains(out, bad) {
			t.Errorf("during the outage, whoami says %q:\n%s", bad, out)
		}
	}
	// The peers' count is control's last word, dated before the outage
	// (give or take the moment the node's poll takes to end).
	if m := regexp.MustCompile(`tailnet peers: +\d+ of \d+ online as of (?:\d{4}-\d\d-\d\d )?(\d\d:\d\d:\d\d), when control was last reached`).FindStringSubmatch(out); m == nil {
		t.Errorf("during the outage, whoami does not date the peers online:\n%s", out)
	} else if at := outageAt.Add(2 * time.Second).Local().Format("15:04:05"); m[1] > at && time.Now().Local().Format("15:04:05") > at {
		t.Errorf("during the outage, the peers online are dated %s, after the outage began at %s:\n%s", m[1], at, out)
	}
	time.Sleep(12 * time.Second) // a few more looks at the node: still one warning
	if n := strings.Count(agentLog(), "tailnet unreachable: "); n != 1 {
		t.Errorf("the outage was logged %d times, want once:\n%s", n, agentLog())
	}
	if !strings.Contains(agentLog(), "level=WARN msg=\"tailnet unreachable: control unreachable") {
		t.Errorf("no warning naming the outage:\n%s", agentLog())
	}

	w.tc.Outage(false)
	serve("after the outage")
	out = waitWhoami("after the outage", "tailnet:             node up, server last answered", "control reachable, DERP relay test,", "tailnet peers:       ", " of 1 online as of ")
	if strings.Contains(out, "when control was last reached") {
		t.Errorf("after the outage, whoami still dates the peers from before it:\n%s", out)
	}
	if !strings.Contains(agentLog(), "level=INFO msg=\"tailnet reachable again\"") {
		t.Errorf("the end of the outage was not logged:\n%s", agentLog())
	}
	if !strings.Contains(agentLog(), "msg=\"tailnet back: the polls in flight start again on new connections") {
		t.Errorf("the client kept the connections made before the outage:\n%s", agentLog())
	}
	if strings.Contains(agentLog(), "cut short for a new connection: the path to the server changed; polling again until it answers") {
		t.Errorf("the poll the agent cut itself for a new connection was reported as the server unreachable:\n%s", agentLog())
	}
}
