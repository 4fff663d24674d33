package sandbox

import (
	"strings"

	"github.com/metnos/agent/policy"
)

// Plan is how Run would sandbox a Policy on this machine: the sandbox
// word and why not more. Doctor prints it for each profile. It is the
// same type on every system; each backend has its own planner (planFor,
// in its run_<os>.go), which Run follows too.
type Plan struct {
	// Sandbox is the word Run would report: "bwrap+landlock+seccomp" and
	// its weaker forms on Linux, "appcontainer", "job-object+low-integrity"
	// or "job-object" on Windows, "seatbelt" on macOS, "none".
	Sandbox string `json:"sandbox"`
	// Best is the word this machine could give with every layer it has.
	Best string `json:"best"`
	// Reason says why Sandbox is weaker than the full Linux sandbox
	// (bwrap+landlock+seccomp): what the machine lacks, what the backend
	// does not isolate, or what told the agent not to use a layer, and
	// what the run would share with the host (HostPIDs). On Windows and
	// macOS it is always set.
	Reason string `json:"reason,omitempty"`
	// Refused is set when Run would refuse this Policy here.
	Refused string `json:"refused,omitempty"`
	// Network says how the run's network would be held to the Policy:
	// open, cut (by what), or narrowed to named hosts through the
	// run's egress proxy (by what); "" when refused.
	Network string `json:"network,omitempty"`
	// lay is the Linux layers Run would apply (zero elsewhere).
	lay layers
	// win is the Windows rung Run would take (zero elsewhere).
	win winRung
}

// PlanFor returns how Run would sandbox p (with the agent-wide minimum
// min) on this machine with o, without running anything.
func PlanFor(o Options, p policy.Policy, min policy.Level) Plan {
	c := Probe(o)
	pl := planFor(c, p, min)
	if pl.Refused == "" {
		pl.Network = networkNote(c, p, pl)
	}
	return pl
}

// layers is one choice of the Linux backend's isolation layers.
type layers struct{ bwrap, landlock, seccomp bool }

func (l layers) word() string {
	var w []string
	if l.bwrap {
		w = append(w, "bwrap")
	}
	if l.landlock {
		w = append(w, "landlock")
	}
	if l.seccomp {
		w = append(w, "seccomp")
	}
	if len(w) == 0 {
		return "none"
	}
	return strings.Join(w, "+")
}

func (l layers) level() policy.Level {
	switch {
	case l.bwrap && l.landlock && l.seccomp:
		return policy.LevelFull
	case l.bwrap || l.landlock:
		return policy.LevelIsolated
	case l.seccomp:
		return policy.LevelContained
	}
	return policy.LevelNone
}
