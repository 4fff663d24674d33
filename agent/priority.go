package agent

import (
	"log/slog"
	"strings"
	"sync"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/sandbox"
)

// PriorityOf is the executors' priority the owner's limits give:
// [priority] of the limits file, the default (cpu and io low) for what
// it leaves unset. The file's values are checked when it is read; one
// the sandbox would not take (which internal/config's checks rule out)
// gives the default rather than a run above it.
func PriorityOf(lim config.Limits) sandbox.Priority {
	p, err := sandbox.ParsePriority(lim.Priority.CPU, lim.Priority.IO, lim.Priority.CPUTimeS)
	if err != nil {
		return sandbox.DefaultPriority()
	}
	return p
}

// priorityNoted holds what of the executors' priority this process
// already said it could not apply: each once (every run's debug line
// says it again).
var priorityNoted sync.Map

// logPriority logs what of a run's priority was applied and what was not
// (sandbox.Output.Priority): at debug for every run, and once per
// process at info for each thing that was not.
func logPriority(log *slog.Logger, r *sandbox.PriorityReport) {
	if r == nil {
		return
	}
	log.Debug("priority", "applied", strings.Join(r.Applied, ", "), "not_applied", strings.Join(r.Missing, "; "))
	for _, m := range r.Missing {
		if _, seen := priorityNoted.LoadOrStore(m, true); !seen {
			log.Info("part of the executors' priority is not applied on this device", "what", m)
		}
	}
}
