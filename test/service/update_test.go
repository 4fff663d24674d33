//go:build linux

package service

import (
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/update"
)

// updateState is the agent's update record in the container.
func (c *container) updateState() update.State {
	c.t.Helper()
	st, err := update.LoadState(c.path(home + "/.local/share/metnos/agent-update.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	return st
}

func hasVersion(v string) func(map[string]any) bool {
	return func(p map[string]any) bool { s, _ := p["client_version"].(string); return strings.Contains(s, v) }
}

// TestUpdateUnderSystemd: a newer signed build published on the server
// is swapped in, the agent exits 0 and systemd starts the new binary,
// whose heartbeat shows the new version. Then a build that cannot reach
// a successful poll (the server answers it 500, here) fails its two
// starts on probation under systemd's restarts, is rolled back at the
// third, and the previous build, started by systemd, reports the
// rollback; the unit never hits its start limit on the way.
func TestUpdateUnderSystemd(t *testing.T) {
	v1, v2, v3 := build(t, "1.0.0"), build(t, "2.0.0"), build(t, "3.0.0")
	// A long-poll blocks 25 s without work, longer than the probation:
	// the test keeps work coming until the new build has confirmed.
	c, w := installed(t, v1, "METNOS_UPDATE_PROBATION_S=10")
	w.profile("version 1.0.0", 60*time.Second, hasVersion("1.0.0"))

	r0 := c.restarts()
	w.publish("1.1.0", v2)
	stop := w.wakeEvery(2 * time.Second)
	w.profile("version 2.0.0", 120*time.Second, hasVersion("2.0.0"))
	if r := c.restarts(); r != r0+1 {
		t.Fatalf("systemd restarted the agent %d times for the update, want once (the exit 0)", r-r0)
	}
	waitFor(t, "the new build confirms", 60*time.Second, func() bool { return c.updateState().Phase == update.PhaseNone })
	stop()
	if st := c.updateState(); st.Applied != "1.1.0" || st.Failed != nil {
		if st.Failed != nil {
			t.Logf("failed: %+v", *st.Failed)
		}
		t.Fatalf("update record after the update: %+v", st)
	}
	t.Logf("$ metnos-agent status (after the update)\n%s", c.must("metnos-agent", "status"))
	j := c.must("journalctl", "--user", "-u", "metnos-agent", "--no-pager", "--grep", "update|Started|Stopped|exited")
	t.Logf("$ journalctl --user -u metnos-agent --grep 'update|Started|Stopped|exited'\n%s", j)

	// A build that never reaches a successful poll.
	r1 := c.restarts()
	w.publish("1.2.0", v3)
	stop = w.wakeEvery(2 * time.Second)
	defer stop()
	waitFor(t, "the agent puts 1.2.0 on probation", 120*time.Second, func() bool {
		st := c.updateState()
		return st.Phase == update.PhaseProbation && st.Version == "1.2.0"
	})
	w.broken.Store(true)
	waitFor(t, "the failed build is rolled back", 180*time.Second, func() bool {
		st := c.updateState()
		return st.Phase == update.PhaseNone && st.Failed != nil && st.Failed.RolledBack
	})
	w.broken.Store(false)
	prof := w.profile("the rollback", 120*time.Second, func(p map[string]any) bool {
		s, _ := p["update"].(string)
		return strings.Contains(s, "rolled back")
	})
	if v, _ := prof["client_version"].(string); !strings.Contains(v, "2.0.0") {
		t.Fatalf("after the rollback the heartbeat's client_version is %q, want 2.0.0", v)
	}
	t.Logf("systemd restarted the agent %d times from the swap to the rollback; update: %v", c.restarts()-r1, prof["update"])
	if a := c.active(); a != "active" {
		t.Fatalf("after the rollback the unit is %s", a)
	}
	t.Logf("$ metnos-agent status (after the rollback)\n%s", c.must("metnos-agent", "status"))
}

// wakeEvery enqueues an echo every d until the returned func is called:
// a long-poll answers at once when there is work, and the agent acts on
// the answer's announced version, and confirms a build on probation.
func (w *world) wakeEvery(d time.Duration) func() {
	done := make(chan struct{})
	go func() {
		for {
			w.srv.Enqueue(w.device, "echo_args", map[string]any{"wake": time.Now().UnixNano()}, refserver.EnqueueOptions{})
			select {
			case <-done:
				return
			case <-time.After(d):
			}
		}
	}()
	var once bool
	return func() {
		if !once {
			once = true
			close(done)
		}
	}
}
