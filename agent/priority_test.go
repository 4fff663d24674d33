package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/metnos/agent/sandbox"
)

// TestLogPriority: every run's priority goes to the debug log, what was
// not applied once per process to the info log, and nothing for a run
// that did not start.
func TestLogPriority(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := &sandbox.PriorityReport{Applied: []string{"nice 10", "io best-effort 7"}, Missing: []string{"cgroup io weight: test-only reason"}}
	logPriority(log, r)
	logPriority(log, r)
	logPriority(log, nil)
	out := b.String()
	if n := strings.Count(out, `msg=priority applied="nice 10, io best-effort 7" not_applied="cgroup io weight: test-only reason"`); n != 2 {
		t.Errorf("%d debug lines, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, `level=INFO msg="part of the executors' priority is not applied on this device" what="cgroup io weight: test-only reason"`); n != 1 {
		t.Errorf("%d info lines, want 1:\n%s", n, out)
	}
}
