package cli

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/lockfile"
)

// TestLiveStatus: status says whether the running agent's heartbeats
// are answered, from the file the agent rewrites after each, and only
// for the agent that holds the lock.
func TestLiveStatus(t *testing.T) {
	lay := layout.Layout{Data: t.TempDir()}
	running := 0
	beat := liveStatusWriter(lay, "http://metnos:8765", slog.New(slog.DiscardHandler), func() (int, int) { return running, 4 })
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
	if got := show(me); !strings.Contains(got, "runs:        0 in flight (at most 4 at once") {
		t.Fatalf("no run: %q", got)
	}
	running = 3
	beat(nil)
	if got := show(me); !strings.Contains(got, "runs:        3 in flight (at most 4 at once") {
		t.Fatalf("three runs: %q", got)
	}
	beat(errors.New("503"))
	if got := show(me); !strings.Contains(got, "polls:       failing since") {
		t.Fatalf("after a heartbeat that failed again: %q", got)
	}
	if got := show(me + 1); got != "" {
		t.Fatalf("for another process than the one that wrote it: %q", got)
	}
}

// TestWhoamiRuns: whoami says how many invocations the running agent
// (the one that holds the run lock) had in flight at its last
// heartbeat, and nothing when no agent runs.
func TestWhoamiRuns(t *testing.T) {
	lay := layout.Layout{Data: t.TempDir()}
	show := func() string {
		var b bytes.Buffer
		printRuns(&b, lay)
		return b.String()
	}
	beat := liveStatusWriter(lay, "http://metnos:8765", slog.New(slog.DiscardHandler), func() (int, int) { return 2, 4 })
	beat(nil)
	if got := show(); got != "" {
		t.Fatalf("no agent holds the lock: %q", got)
	}
	held, err := lockfile.Lock(lay.Lock())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if got := show(); runtime.GOOS != "windows" && !strings.Contains(got, "runs:                2 in flight, at most 4 at once") {
		t.Fatalf("an agent holds the lock: %q", got)
	}
}
