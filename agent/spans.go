package agent

import (
	"context"
	"log/slog"
	"time"
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

// log writes one debug line: each step's milliseconds, in order, and
// the total.
func (s *spans) log(log *slog.Logger) {
	if s == nil || !log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := make([]any, 0, 2*len(s.names)+2)
	for i, n := range s.names {
		attrs = append(attrs, n+"_ms", ms(s.took[i]))
	}
	attrs = append(attrs, "total_ms", ms(s.last.Sub(s.start)))
	log.Debug("timing", attrs...)
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
