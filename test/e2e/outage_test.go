//go:build linux

package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// TestPathOutageRecovers: the network path to the server dies under a
// poll in flight (its bytes vanish, no connection is closed) and comes
// back a few seconds later, leaving the old connections dead. The agent
// must notice the dead connection and poll again on a new one well
// before the poll's old 40 s timeout, and say once that the server was
// unreachable and once that it is reachable again.
func TestPathOutageRecovers(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	// Once served, the agent is in its steady long-poll.
	w.wait(w.enqueue("echo_args", map[string]any{}, refserver.EnqueueOptions{}))
	opened := w.proxy.blackholeAtNextPoll()
	select {
	case <-opened:
	case <-time.After(60 * time.Second):
		t.Fatal("the agent sent no poll within 60 s")
	}
	died := time.Now()
	time.Sleep(3 * time.Second)
	w.proxy.restore()
	id := w.enqueue("echo_args", map[string]any{"after": "outage"}, refserver.EnqueueOptions{})
	w.wait(id)
	took := time.Since(died)
	t.Logf("served %s after the path died (3 s outage)", took.Round(100*time.Millisecond))
	// The old client waited the dead poll's whole timeout, block + 15 s
	// = 40 s, and then at least 0.75 s of backoff: 38 s leaves the new
	// one (block + 5 s, or sooner when a heartbeat finds the path dead)
	// a margin of several seconds.
	if took >= 38*time.Second {
		t.Errorf("the invocation was served %s after the path died: the poll on the dead connection was waited on for its whole timeout", took.Round(time.Second))
	}
	t.Logf("log: %s\nlog: %s", logLine(p, "server unreachable"), logLine(p, "server reachable again"))
	b, _ := os.ReadFile(p.log)
	log := string(b)
	down, up := strings.Count(log, "server unreachable"), strings.Count(log, "server reachable again")
	if down != 1 || up != 1 {
		t.Errorf("the log says %d times that the server is unreachable and %d times that it is reachable again, want once each", down, up)
	}
	if i, j := strings.Index(log, "server unreachable"), strings.Index(log, "server reachable again"); i < 0 || j < i {
		t.Error("the log does not say the server was unreachable before it says it is reachable again")
	}
}
