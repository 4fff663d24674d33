package agent

import (
	"bytes"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/metnos/agent/sandbox"
)

// TestSpans: the debug line names each step in order with its time, and
// the total is their sum; nothing is logged above debug, and a nil
// spans is a no-op.
func TestSpans(t *testing.T) {
	var buf bytes.Buffer
	s := newSpans()
	s.mark("verify")
	time.Sleep(2 * time.Millisecond)
	s.mark("sandbox_run")
	s.log(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &sandbox.Timing{Setup: 3 * time.Millisecond})
	line := buf.String()
	if !regexp.MustCompile(`(?m)` + `msg=timing verify_ms=[0-9.]+ sandbox_run_ms=[0-9.]+ total_ms=[0-9.]+ sandbox_prepare_ms=0 sandbox_setup_ms=3 sandbox_bwrap_ms=0 sandbox_shim_ms=0 sandbox_landlock_ms=0 sandbox_seccomp_ms=0 sandbox_command_ms=0 sandbox_finish_ms=0$`).MatchString(line) {
		t.Fatalf("timing line %q", line)
	}
	if s.took[1] < 2*time.Millisecond || s.last.Sub(s.start) != s.took[0]+s.took[1] {
		t.Fatalf("spans %v, total %v", s.took, s.last.Sub(s.start))
	}
	buf.Reset()
	s.log(slog.New(slog.NewTextHandler(&buf, nil)), nil)
	if buf.Len() != 0 {
		t.Fatalf("logged at info: %q", buf.String())
	}
	var none *spans
	none.mark("x")
	none.log(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), nil)
}
