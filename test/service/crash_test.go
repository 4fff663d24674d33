//go:build linux

package service

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// installed boots a container with the agent built in dir installed in
// ada's ~/.local/bin, registered with a token and installed with
// `metnos-agent install` (the other way in than pair --install), with
// extra --env settings.
func installed(t *testing.T, dir string, env ...string) (*container, *world) {
	t.Helper()
	c := newContainer(t)
	w := newWorld(t)
	c.installAgent(dir)
	c.must("metnos-agent", "register", "--server", w.url, "--token", w.token())
	w.paired()
	args := []string{"metnos-agent", "install"}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	out := c.must(args...)
	t.Logf("$ metnos-agent install\n%s", out)
	w.polledSince(time.Time{}, 60*time.Second)
	return c, w
}

// restarts is how many times systemd restarted ada's agent.
func (c *container) restarts() int {
	c.t.Helper()
	n, _ := strconv.Atoi(c.unitProp("metnos-agent.service", "NRestarts"))
	return n
}

// active is systemd's word on ada's agent.
func (c *container) active() string {
	out, _ := c.as("systemctl", "--user", "is-active", "metnos-agent")
	return strings.TrimSpace(out)
}

// dropIn adds (or, with body "", removes) a drop-in of ada's agent's
// unit and reloads.
func (c *container) dropIn(name, body string) {
	c.t.Helper()
	p := home + "/.config/systemd/user/metnos-agent.service.d/" + name + ".conf"
	if body == "" {
		os.Remove(c.path(p))
	} else {
		c.write(p, []byte("[Service]\n"+body+"\n"), 0o644)
	}
	c.must("systemctl", "--user", "daemon-reload")
}

// ranLines is how many times touch_once ran in folder.
func (c *container) ranLines(folder string) int {
	b, _ := os.ReadFile(c.path(folder + "/ran.log"))
	return strings.Count(string(b), "\n")
}

// TestCrashRestart: kill -9 of the agent in the middle of a run that
// writes: systemd starts it again after RestartSec, the run is not run
// again and the server gets its answer (execution_outcome_unknown) once,
// with the restart logged in the journal at warning priority or above.
// The same kill under a unit without Restart= leaves the agent dead,
// which is what the test would see if the unit lost it. A start that
// fails every time ends at the start limit, and status says so and what
// to run.
func TestCrashRestart(t *testing.T) {
	c, w := installed(t, binDir)
	work := home + "/work"
	c.mkdir(work)

	id := w.enqueue("touch_once", map[string]any{"folder": work, "tag": "crash", "sleep_ms": 60000},
		refserver.EnqueueOptions{Reversibility: "revertible", DeadlineMS: 180000})
	waitFor(t, "touch_once starts", 90*time.Second, func() bool { _, err := os.Stat(c.path(work + "/started-crash")); return err == nil })
	before, pid := c.restarts(), c.mainPID("metnos-agent.service")
	if pid == 0 {
		t.Fatal("the agent's main process is not to be found")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitFor(t, "systemd restarts the killed agent", 60*time.Second, func() bool { return c.restarts() > before && c.active() == "active" })
	t.Logf("systemd restarted the agent %s after kill -9 (RestartSec=5); NRestarts %d", time.Since(killed).Round(100*time.Millisecond), c.restarts())
	info, res := w.wait(id, 90*time.Second)
	if res["error_class"] != "execution_outcome_unknown" {
		t.Fatalf("the killed run's answer: %v, want execution_outcome_unknown", res)
	}
	if n := c.ranLines(work); n != 1 {
		t.Fatalf("touch_once ran %d times, want once", n)
	}
	if info.ResultPosts != 1 {
		t.Fatalf("the server got %d results for the killed run, want 1", info.ResultPosts)
	}
	var said bool
	for _, l := range c.journal("metnos-agent.service") {
		if strings.Contains(l.Message, id) && (l.Priority == "4" || l.Priority == "3") {
			said = true
			t.Logf("journal, priority %s: %s", l.Priority, l.Message)
		}
	}
	if !said {
		t.Error("the journal has no warning or error line naming the interrupted invocation")
	}
	status := c.must("metnos-agent", "status")
	t.Logf("$ metnos-agent status (after the kill)\n%s", status)
	if !strings.Contains(status, "restarts:    1") {
		t.Error("status does not say the agent was restarted once")
	}

	// The promise broken on purpose: without Restart= the same kill is
	// the end of the agent.
	c.dropIn("norestart", "Restart=no")
	pid = c.mainPID("metnos-agent.service")
	syscall.Kill(pid, syscall.SIGKILL)
	time.Sleep(3 * 5 * time.Second) // three times RestartSec
	if a := c.active(); a == "active" || a == "activating" {
		t.Fatalf("with Restart=no the killed agent is %s: the restart check above proves nothing", a)
	}
	c.dropIn("norestart", "")
	c.must("systemctl", "--user", "reset-failed", "metnos-agent")
	c.must("systemctl", "--user", "start", "metnos-agent")

}

// TestCrashLoop: a start that fails every time (a setting the agent
// refuses) ends at the unit's start limit, and status says so and what
// to run; once mended, the agent starts again.
func TestCrashLoop(t *testing.T) {
	c, w := installed(t, binDir)
	// A crash loop: every start fails at once (a setting the agent
	// refuses), and systemd stops at its start limit.
	c.dropIn("broken", "Environment=METNOS_STOP_TIMEOUT_S=soon")
	c.must("systemctl", "--user", "restart", "metnos-agent")
	waitFor(t, "the crash loop ends at the start limit", 150*time.Second, func() bool {
		out, _ := c.rootRun("journalctl", "--no-pager", "USER_UNIT=metnos-agent.service", "MESSAGE=metnos-agent.service: Start request repeated too quickly.")
		return strings.Contains(out, "repeated too quickly")
	})
	status := c.must("metnos-agent", "status")
	t.Logf("$ metnos-agent status (a crash loop)\n%s", status)
	for _, want := range []string{"supervisor says: failed", "start-limit-hit", "reset-failed"} {
		if !strings.Contains(status, want) {
			t.Errorf("status after the crash loop does not say %q", want)
		}
	}
	j, _ := c.as("journalctl", "--user", "-u", "metnos-agent", "-n", "8", "--no-pager")
	t.Logf("$ journalctl --user -u metnos-agent -n 8\n%s", j)
	c.dropIn("broken", "")
	c.must("systemctl", "--user", "reset-failed", "metnos-agent")
	c.must("systemctl", "--user", "start", "metnos-agent")
	t0 := time.Now()
	w.polledSince(t0, 60*time.Second)
}

// TestLogRotation: the agent's own log file stays bounded while it runs
// for days: it is rotated to client.log.1 when a line would take it past
// its limit, by the running agent, without a restart.
func TestLogRotation(t *testing.T) {
	c, w := installed(t, binDir)
	c.must("systemctl", "--user", "stop", "metnos-agent")
	// Just under the limit (5 MiB): the next lines go past it.
	logPath := home + "/.local/share/metnos/client.log"
	line := []byte(`{"level":"INFO","msg":"filler, as days of polls would leave"}` + "\n")
	var fill []byte
	for len(fill)+len(line) < 5<<20-256 {
		fill = append(fill, line...)
	}
	c.write(logPath, fill, 0o600)
	c.must("systemctl", "--user", "start", "metnos-agent")
	pid, restarts := c.mainPID("metnos-agent.service"), c.restarts()
	for i := range 3 {
		id := w.enqueue("echo_args", map[string]any{"n": i}, refserver.EnqueueOptions{})
		w.wait(id, 90*time.Second)
	}
	waitFor(t, "the running agent rotates its log", 60*time.Second, func() bool {
		_, err := c.readFile(logPath + ".1")
		return err == nil
	})
	old, _ := c.readFile(logPath + ".1")
	cur, _ := c.readFile(logPath)
	t.Logf("client.log.1: %d bytes; client.log: %d bytes", len(old), len(cur))
	if len(old) > 5<<20 || len(cur) > 64<<10 || len(cur) == 0 {
		t.Fatalf("after the rotation client.log.1 has %d bytes and client.log %d", len(old), len(cur))
	}
	if c.mainPID("metnos-agent.service") != pid || c.restarts() != restarts {
		t.Fatal("the log was rotated by a restart, not by the running agent")
	}
}
