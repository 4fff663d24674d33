package refserver

import (
	"fmt"
	"sort"

	"github.com/metnos/agent/wire"
)

// UndoPlan is what [Server.Undo] did.
type UndoPlan struct {
	// Undone lists the invocations reversed, newest first.
	Undone []string `json:"undone"`
	// Calls are the reverse calls, in the order they were enqueued.
	Calls []Call `json:"calls"`
	// IDs are the enqueued invocation ids, one per call.
	IDs []string `json:"invocation_ids"`
	// Unsupported lists the patterns that could not be translated (the
	// undo of those effects fails honestly).
	Unsupported []string `json:"unsupported"`
	// Skipped lists done invocations of the turn whose executor declares
	// no reverse_pattern, and dry runs (payload.dry_run.applied false,
	// docs/dryrun.md): nothing to undo remotely.
	Skipped []string `json:"skipped"`
}

// Undo reverses a turn on a device as Metnos's undo_last_turn does for
// device effects (docs/protocol.md §10.1): for every done invocation of turnID on deviceID
// not undone yet, newest first, it translates its executor's
// reverse_pattern and its result's payload with [ReverseCalls] and
// enqueues each call on the same device as an ordinary signed
// invocation: reversibility "read_only", no turn_id, no env, and a
// deadline of [ScaledDeadlineMS], unless o says otherwise (o.ID is
// ignored: every call gets a fresh id). The reversed invocations are
// marked undone. Undoing a call whose executor is not loaded is an error.
func (s *Server) Undo(deviceID, turnID string, o EnqueueOptions) (UndoPlan, error) {
	type todo struct {
		id       string
		patterns []string
		payload  map[string]any
	}
	var work []todo
	plan := UndoPlan{Calls: []Call{}, IDs: []string{}, Unsupported: []string{}, Skipped: []string{}, Undone: []string{}}
	s.mu.Lock()
	if _, ok := s.devices[deviceID]; !ok {
		s.mu.Unlock()
		return plan, fmt.Errorf("refserver: undo turn %q: device %s is not paired", turnID, deviceID)
	}
	var invs []*invocation
	for _, inv := range s.order {
		if inv.DeviceID == deviceID && inv.TurnID == turnID && inv.State == StateDone && !inv.Undone {
			invs = append(invs, inv)
		}
	}
	sort.SliceStable(invs, func(i, j int) bool { return invs[i].seq > invs[j].seq })
	for _, inv := range invs {
		ex, ok := s.executors[inv.Executor]
		if !ok {
			s.mu.Unlock()
			return plan, fmt.Errorf("refserver: undo turn %q: invocation %s ran executor %s, which is not loaded: cannot read its reverse_pattern", turnID, inv.ID, inv.Executor)
		}
		payload := resultPayload(inv.ResultBody)
		if len(ex.reversePattern) == 0 || dryRun(payload) {
			// A dry run changed nothing: its rows ("created": true...)
			// are what the executor did in a layer thrown away.
			plan.Skipped = append(plan.Skipped, inv.ID)
			continue
		}
		work = append(work, todo{inv.ID, ex.reversePattern, payload})
	}
	s.mu.Unlock()

	for _, t := range work {
		calls, unsupported := ReverseCalls(t.patterns, t.payload)
		plan.Unsupported = append(plan.Unsupported, unsupported...)
		for _, c := range calls {
			co := o
			co.ID = ""
			if co.DeadlineMS == 0 {
				co.DeadlineMS = ScaledDeadlineMS(c.Args)
			}
			id, err := s.Enqueue(deviceID, c.Executor, c.Args, co)
			if err != nil {
				return plan, fmt.Errorf("refserver: undo of invocation %s: %w", t.id, err)
			}
			plan.Calls = append(plan.Calls, c)
			plan.IDs = append(plan.IDs, id)
		}
		s.mu.Lock()
		s.invs[t.id].Undone = true
		s.mu.Unlock()
		plan.Undone = append(plan.Undone, t.id)
	}
	s.log.Info("refserver: undo", "device_id", deviceID, "turn_id", turnID, "calls", len(plan.IDs), "unsupported", len(plan.Unsupported))
	return plan, nil
}

// resultPayload is the payload object of a stored result body ({} when
// absent or not an object).
func resultPayload(body []byte) map[string]any {
	v, err := wire.Decode(body)
	if err != nil {
		return map[string]any{}
	}
	m, _ := v.(map[string]any)
	p, ok := m["payload"].(map[string]any)
	if !ok {
		return map[string]any{}
	}
	return p
}

// dryRun reports whether a result's payload is a dry run's: its
// dry_run.applied is false (docs/protocol.md §9.4).
func dryRun(payload map[string]any) bool {
	d, ok := payload["dry_run"].(map[string]any)
	if !ok {
		return false
	}
	applied, ok := d["applied"].(bool)
	return ok && !applied
}
