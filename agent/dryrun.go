package agent

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/wire"
)

// Dry runs (docs/dryrun.md): an invocation whose arguments carry
// "dry_run": true, and, in the owner's preview mode, every invocation whose
// executor may write, runs with every folder it may write behind a
// copy-on-write layer that is thrown away; its result carries what it
// would have changed in payload.dry_run. Nothing of it is journaled.

// Why an invocation runs as a dry run: payload.dry_run.asked_by.
const (
	dryByArgs    = "arguments"
	dryByPreview = "preview"
)

// dryRunAsked reports whether the arguments ask for a dry run: a
// top-level "dry_run" that is true (an executor that honours it reads
// the same key).
func dryRunAsked(args any) bool {
	m, ok := args.(map[string]any)
	if !ok {
		return false
	}
	b, ok := m["dry_run"].(bool)
	return ok && b
}

// mayWrite reports whether a run of p may write anything but the
// agent's own folders.
func mayWrite(p policy.Policy) bool {
	return p.RootWritable || len(writeRoots(p)) > 0
}

// dryRunOf decides whether the invocation runs dry with the policy p,
// and notes why in inv.dryBy ("" for a real run).
func (a *Agent) dryRunOf(inv *invocation, p policy.Policy) bool {
	switch {
	case dryRunAsked(inv.Args):
		inv.dryBy = dryByArgs
	case inv.preview && mayWrite(p):
		inv.dryBy = dryByPreview
	default:
		inv.dryBy = ""
	}
	return inv.dryBy != ""
}

// withDryRun is the payload of a dry run: {"ok": false, "dry_run":
// {...}}, where dry_run holds what the run would have changed, why it
// ran dry, whether the executor said it succeeded (dry_run.ok) and the
// executor's whole payload (dry_run.executor), as it would have said it
// for real.
//
// Nothing of the executor's own keys is left at the top: every key of
// a file executor's payload (ok, ok_count, results, created_count,
// dirs_created, _undo...) claims a change, and the real Metnos server
// reads them so — it records an undo entry for a result whose merged
// payload has a true ok, a non-zero ok_count or any results, and its
// undo then deletes or moves back what the dry run never made (a file
// the user made since, under the same name). A payload ok of false,
// with no ok_count and no results, is what it reads as "nothing
// changed", and is what happened.
func withDryRun(payload any, ok bool, d *sandbox.DryRun, by string) (any, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("the dry run's changes: %w", err)
	}
	v, err := wire.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("the dry run's changes: %w", err)
	}
	dr := v.(map[string]any)
	dr["asked_by"] = by
	dr["ok"] = ok
	if payload != nil {
		dr["executor"] = payload
	}
	return map[string]any{"ok": false, "dry_run": dr}, nil
}

// dryRunRefused is the result of a dry run the sandbox refused because
// it cannot make the layer here: the invocation is refused, as one that
// fails the device's checks is (error_class invocation_refused), and
// its payload's dry_run says why, applied false. It did not run.
func dryRunRefused(executor, by string, err error) result.Result {
	why := err.Error()
	var re *sandbox.RefusedError
	if errors.As(err, &re) {
		why = re.Why
	}
	return result.Result{Entries: []any{}, Sandbox: "none",
		Payload:    map[string]any{"dry_run": map[string]any{"applied": false, "asked_by": by, "refused": why}},
		Error:      fmt.Sprintf("refused by the device: executor %s not run: %v", executor, err),
		ErrorClass: wire.ClassInvocationRefused}
}
