//go:build !linux && !windows && !darwin

package sandbox

import (
	"context"
	"fmt"
	"runtime"

	"github.com/metnos/agent/policy"
)

// Probe reports what this machine offers; only Linux has a backend yet.
func Probe() Caps { return Caps{OS: runtime.GOOS} }

func run(ctx context.Context, req Request) (Output, error) {
	return Output{Sandbox: "none", Policy: req.Policy.Fingerprint()},
		&RefusedError{Have: "none", Why: fmt.Sprintf("no sandbox backend for %s yet", runtime.GOOS)}
}

// Plan is how Run would sandbox a Policy on this machine.
type Plan struct {
	Sandbox string `json:"sandbox"`
	Best    string `json:"best"`
	Reason  string `json:"reason,omitempty"`
	Refused string `json:"refused,omitempty"`
}

// PlanFor returns how Run would sandbox p on this machine.
func PlanFor(p policy.Policy, min policy.Level) Plan {
	why := fmt.Sprintf("no sandbox backend for %s yet", runtime.GOOS)
	return Plan{Sandbox: "none", Best: "none", Reason: why, Refused: why}
}
