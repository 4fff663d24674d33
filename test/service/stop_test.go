//go:build linux

package service

import (
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// leftovers lists what a run could leave behind in the container:
// processes of ada's (but the user manager's own), run cgroups,
// scratch folders.
func (c *container) leftovers() []string {
	c.t.Helper()
	left := c.processes()
	out, _ := c.rootRun("find", "/sys/fs/cgroup", "-name", "metnos-run-*")
	out2, _ := c.rootRun("find", "/tmp", "/var/tmp", "/run/user", "-maxdepth", "2", "-name", "metnos-run-*")
	// A mount of a run's would be in its own namespace, gone with it; one
	// in the container's would show here.
	out3, _ := c.rootRun("grep", "-h", "metnos-run", "/proc/1/mountinfo")
	for _, l := range strings.Split(out+out2+out3, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "find:") {
			left = append(left, l)
		}
	}
	return left
}

// stopDuringRun starts a long run that writes, stops the agent with
// systemctl --user stop while it runs, and returns how long the stop
// took and the invocation.
func stopDuringRun(t *testing.T, c *container, w *world, tag string) (time.Duration, string) {
	t.Helper()
	work := home + "/work"
	c.mkdir(work)
	id := w.enqueue("touch_once", map[string]any{"folder": work, "tag": tag, "sleep_ms": 300000},
		refserver.EnqueueOptions{Reversibility: "revertible", DeadlineMS: 600000})
	waitFor(t, "touch_once starts", 90*time.Second, func() bool {
		return c.ranLines(work) > 0 && strings.Contains(string(must(c.readFile(work+"/ran.log"))), tag)
	})
	t0 := time.Now()
	out, err := c.as("systemctl", "--user", "stop", "metnos-agent")
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("systemctl --user stop: %v\n%s", err, out)
	}
	return took, id
}

// TestStopDuringLongRun: systemctl --user stop while an executor runs
// for minutes: the agent cuts the run at half its stop budget, delivers
// its result and exits within TimeoutStopSec, without systemd having to
// kill anything, and nothing of the run is left. The same stop under a
// TimeoutStopSec shorter than the agent's budget (a stop path that would
// ignore the unit's timeout) is killed by systemd and delivers nothing
// during the stop, which the checks above would catch.
func TestStopDuringLongRun(t *testing.T) {
	c, w := installed(t, binDir)
	took, id := stopDuringRun(t, c, w, "stop")
	t.Logf("systemctl --user stop took %s (TimeoutStopSec=20)", took.Round(100*time.Millisecond))
	info, ok := w.srv.Invocation(id)
	if !ok || info.ResultBody == nil {
		t.Fatal("the stop ended without the cut run's result reaching the server")
	}
	_, res := w.wait(id, time.Second)
	if res["error_class"] != "execution_outcome_unknown" || !strings.Contains(res["error"].(string), "asked to stop") {
		t.Fatalf("the cut run's result: %v", res)
	}
	if info.ResultPosts != 1 {
		t.Fatalf("the server got %d posts of the cut run's result, want 1", info.ResultPosts)
	}
	for _, l := range c.journal("metnos-agent.service") {
		if strings.Contains(l.Message, "timed out") || strings.Contains(l.Message, "Killing process") {
			t.Errorf("systemd had to kill during the stop: %s", l.Message)
		}
	}
	if left := c.leftovers(); len(left) != 0 {
		t.Errorf("the stop left %v", left)
	}
	j := c.must("journalctl", "--user", "-u", "metnos-agent", "-n", "6", "--no-pager")
	t.Logf("$ journalctl --user -u metnos-agent -n 6\n%s", j)
	t.Logf("$ metnos-agent status (stopped)\n%s", c.must("metnos-agent", "status"))

	// Started again, the run is not run again.
	c.must("systemctl", "--user", "start", "metnos-agent")
	echo := w.enqueue("echo_args", map[string]any{"after": "stop"}, refserver.EnqueueOptions{})
	w.wait(echo, 90*time.Second)
	if n := c.ranLines(home + "/work"); n != 1 {
		t.Fatalf("touch_once ran %d times, want once", n)
	}

	// The promise broken on purpose: systemd's timeout shorter than the
	// agent's budget.
	c.dropIn("shortstop", "TimeoutStopSec=4")
	took, id = stopDuringRun(t, c, w, "short")
	t.Logf("with TimeoutStopSec=4 and the agent's budget at 20 s, the stop took %s", took.Round(100*time.Millisecond))
	if info, _ := w.srv.Invocation(id); info.ResultBody != nil {
		t.Fatal("with systemd killing the agent at 4 s the cut run's result was delivered anyway: the stop check above proves nothing")
	}
	killed := false
	for _, l := range c.journal("metnos-agent.service") {
		if strings.Contains(l.Message, "timed out") {
			killed = true
		}
	}
	if !killed {
		t.Error("the journal does not say that systemd's stop timed out")
	}
	c.dropIn("shortstop", "")
	c.must("systemctl", "--user", "start", "metnos-agent")
	if _, res := w.wait(id, 90*time.Second); res["error_class"] != "execution_outcome_unknown" {
		t.Fatalf("after the killed stop, the next start reports %v", res)
	}
}
