package cli

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/layout"
)

// TestLiveStatus: status says whether the running agent's heartbeats
// are answered, from the file the agent rewrites after each, and only
// for the agent that holds the lock.
func TestLiveStatus(t *testing.T) {
	lay := layout.Layout{Data: t.TempDir()}
	beat := liveStatusWriter(lay, "http://metnos:8765", slog.New(slog.DiscardHandler))
	me := os.Getpid()
	show := func(pid int) string {
		var b bytes.Buffer
		printLiveStatus(&b, lay, pid, time.Now())
		return b.String()
	}
	if got := show(me); got != "" {
		t.Fatalf("before any heartbeat: %q", got)
	}
	beat(errors.New("connection refused"))
	if got := show(me); !strings.Contains(got, "polls:       not answered yet: connection refused") {
		t.Fatalf("after a failed heartbeat: %q", got)
	}
	beat(nil)
	if got := show(me); !strings.Contains(got, "polls:       yes, the server answered") || !strings.Contains(got, "server:      http://metnos:8765") {
		t.Fatalf("after an answered heartbeat: %q", got)
	}
	beat(errors.New("503"))
	if got := show(me); !strings.Contains(got, "polls:       failing since") {
		t.Fatalf("after a heartbeat that failed again: %q", got)
	}
	if got := show(me + 1); got != "" {
		t.Fatalf("for another process than the one that wrote it: %q", got)
	}
}
