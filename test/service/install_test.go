//go:build linux

package service

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// TestInstallBootUninstall: ada pairs with a join link and --install in
// a login session; the unit is enabled and running, linger is on, status
// says so, the service's agent runs executors under every layer, and
// its log reaches the journal a line an event at the right priority.
// Powered off and booted again, with nobody logging in, the agent polls
// again with its pairing and ledger; without linger it would not (the
// same boot with linger turned off shows it). uninstall leaves no unit,
// no wants-link, no process; --purge refuses while an agent runs, then
// removes key, pairing and caches.
func TestInstallBootUninstall(t *testing.T) {
	c := newContainer(t)
	w := newWorld(t)
	c.installAgent(binDir)
	c.login()

	out := c.must("metnos-agent", "pair", "--install", w.join())
	t.Logf("$ metnos-agent pair --install LINK\n%s", out)
	w.paired()
	if got := strings.TrimSpace(c.must("systemctl", "--user", "is-enabled", "metnos-agent")); got != "enabled" {
		t.Fatalf("after pair --install the unit is %q, want enabled", got)
	}
	if _, err := os.Stat(c.path("/var/lib/systemd/linger/" + user)); err != nil {
		t.Fatalf("pair --install did not turn linger on: %v", err)
	}
	w.polledSince(time.Time{}, 60*time.Second)
	waitFor(t, "status says the device polls", 60*time.Second, func() bool {
		out, _ := c.as("metnos-agent", "status")
		return strings.Contains(out, "polls:       yes")
	})
	status := c.must("metnos-agent", "status")
	t.Logf("$ metnos-agent status\n%s", status)
	for _, want := range []string{"installed:   yes", "enabled:     yes", "running:     yes (process", "supervisor says: active", "linger:      yes", "rust client: none"} {
		if !strings.Contains(status, want) {
			t.Errorf("status does not say %q", want)
		}
	}

	// The service's own runs keep every layer of the sandbox: the unit's
	// hardening takes none from them.
	id := w.enqueue("echo_args", map[string]any{"hello": "service"}, refserver.EnqueueOptions{})
	_, res := w.wait(id, 90*time.Second)
	if res["ok"] != true || res["sandbox"] != fullSandbox {
		t.Fatalf("echo_args under the service: ok=%v sandbox=%v, want true and %s (%v)", res["ok"], res["sandbox"], fullSandbox, res["sandbox_downgrade_reason"])
	}
	checkJournal(t, c)

	// Power off, boot, and nobody logs in: linger starts ada's manager,
	// and it the agent, with the same pairing and ledger.
	c.reboot()
	w.polledSince(c.booted, 60*time.Second)
	if got := strings.TrimSpace(c.must("systemctl", "--user", "is-active", "metnos-agent")); got != "active" {
		t.Fatalf("after the boot the agent is %q", got)
	}
	if devs := w.srv.Devices(); len(devs) != 1 || devs[0].ID != w.device {
		t.Fatalf("after the boot the server knows %v, want the one device %s", devs, w.device)
	}
	id2 := w.enqueue("echo_args", map[string]any{"after": "boot"}, refserver.EnqueueOptions{})
	if _, res := w.wait(id2, 90*time.Second); res["ok"] != true {
		t.Fatalf("echo_args after the boot: %v", res)
	}
	if info, _ := w.srv.Invocation(id); info.Deliveries != 1 || info.ResultPosts != 1 {
		t.Fatalf("the invocation before the boot was delivered %d times and answered %d, want once each", info.Deliveries, info.ResultPosts)
	}
	waitFor(t, "status says the device polls after the boot", 60*time.Second, func() bool {
		out, _ := c.as("metnos-agent", "status")
		return strings.Contains(out, "polls:       yes")
	})
	t.Logf("$ metnos-agent status (after the boot)\n%s", c.must("metnos-agent", "status"))
	t.Logf("$ journalctl --user -u metnos-agent -b\n%s", c.must("journalctl", "--user", "-u", "metnos-agent", "-b", "--no-pager"))

	// The same boot without linger: the agent does not start until ada
	// logs in. (This is what an install that forgot linger would give.)
	c.root("loginctl", "disable-linger", user)
	c.reboot()
	c.root("systemctl", "is-system-running", "--wait")
	if out, _ := c.rootRun("systemctl", "is-active", fmt.Sprintf("user@%d.service", uid)); strings.TrimSpace(out) == "active" {
		t.Fatal("without linger, ada's user manager started at boot anyway: the linger check above proves nothing")
	}
	if p := c.processes(); len(p) != 0 {
		t.Fatalf("without linger and without a login, ada runs %v", p)
	}
	c.root("loginctl", "enable-linger", user)
	c.login()
	waitFor(t, "the agent runs again once linger is back", 60*time.Second, func() bool {
		out, _ := c.as("systemctl", "--user", "is-active", "metnos-agent")
		return strings.TrimSpace(out) == "active"
	})

	// Uninstall leaves no unit, no wants-link and no process; the key
	// and pairing stay.
	out = c.must("metnos-agent", "uninstall")
	t.Logf("$ metnos-agent uninstall\n%s", out)
	for _, p := range []string{home + "/.config/systemd/user/metnos-agent.service", home + "/.config/systemd/user/default.target.wants/metnos-agent.service"} {
		if _, err := os.Lstat(c.path(p)); err == nil {
			t.Errorf("uninstall left %s", p)
		}
	}
	if p := c.processes(); len(p) != 0 {
		t.Errorf("after uninstall ada still runs %v", p)
	}
	if got, _ := c.as("systemctl", "--user", "is-active", "metnos-agent"); strings.TrimSpace(got) == "active" {
		t.Error("after uninstall systemd still runs metnos-agent")
	}
	if _, err := os.Stat(c.path(home + "/.local/share/metnos/state.json")); err != nil {
		t.Fatalf("uninstall without --purge lost the pairing: %v", err)
	}
	t.Logf("$ metnos-agent status (after uninstall)\n%s", c.must("metnos-agent", "status"))

	// --purge refuses while an agent runs (one started by hand), then
	// removes the data and the caches.
	c.must("systemd-run", "--user", "--unit=by-hand", "--", home+"/.local/bin/metnos-agent", "run")
	waitFor(t, "the agent run by hand takes the lock", 30*time.Second, func() bool {
		out, _ := c.as("metnos-agent", "status")
		return strings.Contains(out, "running:     yes")
	})
	out, err := c.as("metnos-agent", "uninstall", "--purge")
	if err == nil || !strings.Contains(out, "still holds") {
		t.Fatalf("uninstall --purge while an agent runs: %v\n%s", err, out)
	}
	if _, err := os.Stat(c.path(home + "/.local/share/metnos/key")); err != nil {
		t.Fatalf("the refused purge removed the key: %v", err)
	}
	c.must("systemctl", "--user", "stop", "by-hand")
	out = c.must("metnos-agent", "uninstall", "--purge")
	t.Logf("$ metnos-agent uninstall --purge\n%s", out)
	for _, d := range []string{home + "/.local/share/metnos", home + "/.cache/metnos"} {
		if _, err := os.Stat(c.path(d)); !os.IsNotExist(err) {
			t.Errorf("uninstall --purge left %s (%v)", d, err)
		}
	}
}

// checkJournal: the agent's start is in the journal at info, with the
// sandbox it found; every line is one event with a priority of its own.
func checkJournal(t *testing.T, c *container) {
	t.Helper()
	lines := c.journal("metnos-agent.service")
	var running *journalLine
	prios := map[string]int{}
	for i, l := range lines {
		prios[l.Priority]++
		if strings.Contains(l.Message, "agent running") {
			running = &lines[i]
		}
	}
	if running == nil {
		t.Fatalf("the journal has no \"agent running\" line of the agent; it has %d lines", len(lines))
	}
	t.Logf("journal: %q at priority %s; lines by priority: %v", running.Message, running.Priority, prios)
	if !strings.Contains(running.Message, "sandbox="+fullSandbox) {
		t.Errorf("the service's agent says at start %q: want sandbox=%s", running.Message, fullSandbox)
	}
	if running.Priority != "6" {
		t.Errorf("the start line is at priority %s, want 6 (info)", running.Priority)
	}
}
