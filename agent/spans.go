package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/metnos/agent/sandbox"
)

// spans times the steps of one invocation's handling, for the debug
// log: where the time between the poll's answer and the spooled result
// goes.
type spans struct {
	start, last time.Time
	names       []string
	took        []time.Duration
}

func newSpans() *spans {
	now := time.Now()
	return &spans{start: now, last: now}
}

// mark ends the step name, which began at the previous mark (or at the
// start).
func (s *spans) mark(name string) {
	if s == nil {
		return
	}
	now := time.Now()
	s.names = append(s.names, name)
	s.took = append(s.took, now.Sub(s.last))
	s.last = now
}

// log writes one debug line: each step's milliseconds, in order, the
// total, then the sandbox's own stages when t is not nil.
func (s *spans) log(log *slog.Logger, t *sandbox.Timing) {
	if s == nil || !log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := make([]any, 0, 2*len(s.names)+18)
	for i, n := range s.names {
		attrs = append(attrs, n+"_ms", ms(s.took[i]))
	}
	attrs = append(attrs, "total_ms", ms(s.last.Sub(s.start)))
	if t != nil {
		attrs = append(attrs, "sandbox_prepare_ms", ms(t.Prepare), "sandbox_setup_ms", ms(t.Setup),
			"sandbox_bwrap_ms", ms(t.Bwrap), "sandbox_shim_ms", ms(t.Shim),
			"sandbox_landlock_ms", ms(t.Landlock), "sandbox_seccomp_ms", ms(t.Seccomp),
			"sandbox_command_ms", ms(t.Command), "sandbox_finish_ms", ms(t.Finish))
	}
	log.Debug("timing", attrs...)
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
