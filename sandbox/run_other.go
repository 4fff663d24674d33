//go:build !linux && !windows && !darwin

package sandbox

import (
	"context"
	"fmt"
	"runtime"

	"github.com/metnos/agent/policy"
)

// Probe reports what this machine offers; only Linux has a backend yet.
func Probe(o Options) Caps { return Caps{OS: runtime.GOOS} }

func run(ctx context.Context, req Request) (Output, error) {
	return Output{Sandbox: "none", Policy: req.Policy.Fingerprint()},
		&RefusedError{Have: "none", Why: fmt.Sprintf("no sandbox backend for %s yet", runtime.GOOS)}
}

// planFor refuses everything: there is no backend here.
func planFor(c Caps, p policy.Policy, min policy.Level) Plan {
	why := fmt.Sprintf("no sandbox backend for %s yet", runtime.GOOS)
	return Plan{Sandbox: "none", Best: "none", Reason: why, Refused: why}
}

// networkNote says how a run of p planned as pl holds its network.
func networkNote(_ Caps, p policy.Policy, _ Plan) string {
	if p.Network {
		return "open: the host's network"
	}
	return "not cut: no sandbox on this system"
}
