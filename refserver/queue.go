package refserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/metnos/agent/wire"
)

// Invocation states.
const (
	StateQueued    = "queued"
	StateDelivered = "delivered"
	StateDone      = "done"
	StateFailed    = "failed"
	StateExpired   = "expired"
)

// EnqueueOptions are the optional fields of an invocation.
type EnqueueOptions struct {
	// ID is the invocation id. "": inv-<16 hex ns><8 hex> as the real
	// server makes them. Tests may pass durable ids such as
	// "inv-durable-<32 hex>"; any id must match [A-Za-z0-9._:-]{8,256}.
	ID string
	// TurnID correlates the invocation with a turn ("" = none).
	TurnID string
	// Reversibility is "read_only" (default) or "revertible".
	Reversibility string
	// Scope defaults to "device".
	Scope string
	// Env becomes env_injections.
	Env map[string]string
	// DeadlineMS is the wall-clock limit; 0 = 60000.
	DeadlineMS int64
	// ExecutionContext is signed when not nil (durable workloads).
	ExecutionContext map[string]any
}

// InvocationInfo is the server's view of one invocation.
type InvocationInfo struct {
	ID            string
	State         string // queued, delivered, done, failed, expired
	DeviceID      string
	Executor      string
	TurnID        string
	Reversibility string
	DeadlineMS    int64
	Args          any // as the device decodes it (numbers are json.Number)
	// Object is the invocation exactly as poll delivers it, server_sig
	// included. Do not modify it.
	Object map[string]any
	// ResultBody is the raw body of the first accepted result; nil
	// before one arrives.
	ResultBody []byte
	// ResultPosts counts every result POST for this invocation that
	// passed the signature checks, accepted or ignored.
	ResultPosts int
	// ResultBodies are the bodies of those posts, in order: a device
	// re-sending a spooled result must send the same bytes each time.
	ResultBodies [][]byte
	// Deliveries counts how many times poll handed it out.
	Deliveries  int
	EnqueuedAt  time.Time
	DeliveredAt time.Time // last delivery; zero if never delivered
	// ResultAt is when the first accepted result arrived (the
	// server's "completed"); zero before one.
	ResultAt time.Time
	// Undone is set once [Server.Undo] enqueued its reverse calls.
	Undone bool
}

type invocation struct {
	InvocationInfo
	seq int
}

// Enqueue queues an invocation of executor for a device and returns its
// id. manifest_sha256 and code_sha256 come from the loaded executor; the
// invocation is signed over the fields of docs/protocol.md §3.4. args is a JSON-like Go
// value (map[string]any, []any, string, int, int64, json.Number, bool,
// nil, or anything encoding/json turns into those); it is round-tripped
// through JSON so that what is signed is what the device decodes. Floats
// are refused, as the protocol cannot sign them: the error wraps
// [wire.ErrNotCanonical].
func (s *Server) Enqueue(deviceID, executor string, args any, o EnqueueOptions) (string, error) {
	decoded, err := jsonValue(args)
	if err != nil {
		return "", fmt.Errorf("refserver: enqueue %s on device %s: args: %w", executor, deviceID, err)
	}
	var ctxv any
	if o.ExecutionContext != nil {
		if ctxv, err = jsonValue(o.ExecutionContext); err != nil {
			return "", fmt.Errorf("refserver: enqueue %s on device %s: execution_context: %w", executor, deviceID, err)
		}
	}
	if o.Scope == "" {
		o.Scope = "device"
	}
	if o.Reversibility == "" {
		o.Reversibility = "read_only"
	}
	if o.DeadlineMS == 0 {
		o.DeadlineMS = wire.DefaultDeadlineMS
	}
	if o.DeadlineMS < 0 {
		return "", fmt.Errorf("refserver: enqueue %s on device %s: deadline_ms %d must be positive", executor, deviceID, o.DeadlineMS)
	}
	env := map[string]any{}
	for k, v := range o.Env {
		env[k] = v
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.devices[deviceID]; !ok {
		return "", fmt.Errorf("refserver: enqueue %s: device %s is not paired (register it first)", executor, deviceID)
	}
	ex, ok := s.executors[executor]
	if !ok {
		return "", fmt.Errorf("refserver: enqueue on device %s: executor %s is not loaded (put it in Config.Executors)", deviceID, executor)
	}
	id := o.ID
	now := s.now()
	if id == "" {
		id = s.newIDLocked(now)
	} else if !wire.ValidID(id) {
		return "", fmt.Errorf("refserver: enqueue %s on device %s: id %q must match [A-Za-z0-9._:-]{8,256}", executor, deviceID, id)
	}
	if _, dup := s.invs[id]; dup {
		return "", fmt.Errorf("refserver: enqueue %s on device %s: invocation %s already exists", executor, deviceID, id)
	}
	obj := map[string]any{
		"invocation_id":   id,
		"turn_id":         o.TurnID,
		"executor":        executor,
		"manifest_sha256": ex.manifestSHA,
		"code_sha256":     ex.codeSHA,
		"args":            decoded,
		"scope":           o.Scope,
		"reversibility":   o.Reversibility,
		"env_injections":  env,
		"deadline_ms":     o.DeadlineMS,
	}
	if ctxv != nil {
		obj["execution_context"] = ctxv
	}
	sig, err := wire.SignCanonical(s.key, wire.InvocationSigned(obj))
	if err != nil {
		return "", fmt.Errorf("refserver: enqueue %s on device %s: signing: %w", executor, deviceID, err)
	}
	obj["server_sig"] = sig
	inv := &invocation{seq: len(s.order), InvocationInfo: InvocationInfo{
		ID: id, State: StateQueued, DeviceID: deviceID, Executor: executor, TurnID: o.TurnID,
		Reversibility: o.Reversibility, DeadlineMS: o.DeadlineMS, Args: decoded, Object: obj, EnqueuedAt: now,
	}}
	s.invs[id] = inv
	s.order = append(s.order, inv)
	s.notifyLocked()
	s.log.Info("refserver: enqueued", "invocation_id", id, "device_id", deviceID, "executor", executor)
	return id, nil
}

// newIDLocked makes inv-<16 hex ns><8 hex>, strictly increasing even
// when the clock does not move.
func (s *Server) newIDLocked(now time.Time) string {
	ns := now.UnixNano()
	if ns <= s.lastNS {
		ns = s.lastNS + 1
	}
	s.lastNS = ns
	var r [4]byte
	rand.Read(r[:])
	return fmt.Sprintf("inv-%016x%s", ns, hex.EncodeToString(r[:]))
}

// jsonValue round-trips v through JSON with exact numbers, refusing
// floats anywhere in it.
func jsonValue(v any) (any, error) {
	if hasFloat(reflect.ValueOf(v)) {
		return nil, fmt.Errorf("%w: a float cannot be signed: pass integers (or json.Number) only", wire.ErrNotCanonical)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	d, err := wire.Decode(b)
	if err != nil {
		return nil, err
	}
	if _, err := wire.Canonical(d); err != nil {
		return nil, err
	}
	return d, nil
}

func hasFloat(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		return true
	case reflect.Interface, reflect.Pointer:
		return !v.IsNil() && hasFloat(v.Elem())
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if hasFloat(v.Index(i)) {
				return true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if hasFloat(it.Value()) {
				return true
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && hasFloat(v.Field(i)) {
				return true
			}
		}
	}
	return false
}

// Invocation returns the server's view of an invocation.
func (s *Server) Invocation(id string) (InvocationInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inv, ok := s.invs[id]
	if !ok {
		return InvocationInfo{}, false
	}
	return inv.InvocationInfo, true
}

// Invocations returns every invocation in the order it was enqueued.
func (s *Server) Invocations() []InvocationInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]InvocationInfo, len(s.order))
	for i, inv := range s.order {
		out[i] = inv.InvocationInfo
	}
	return out
}

// Wait blocks until the invocation is done or failed, or ctx ends.
func (s *Server) Wait(ctx context.Context, id string) (InvocationInfo, error) {
	for {
		s.mu.Lock()
		inv, ok := s.invs[id]
		var info InvocationInfo
		if ok {
			info = inv.InvocationInfo
		}
		ch := s.changed
		s.mu.Unlock()
		if !ok {
			return InvocationInfo{}, fmt.Errorf("refserver: waiting for invocation %s: no such invocation", id)
		}
		if info.State == StateDone || info.State == StateFailed {
			return info, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return info, fmt.Errorf("refserver: waiting for invocation %s (state %s): %w", id, info.State, ctx.Err())
		}
	}
}

// ExpireOlderThan marks queued and delivered invocations enqueued more
// than d ago as expired (the server's TTL reaper): they are never
// delivered again, though a late result is still accepted. It returns
// how many it expired.
func (s *Server) ExpireOlderThan(d time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	cut := s.now().Add(-d)
	n := 0
	for _, inv := range s.order {
		if (inv.State == StateQueued || inv.State == StateDelivered) && inv.EnqueuedAt.Before(cut) {
			inv.State = StateExpired
			n++
		}
	}
	if n > 0 {
		s.notifyLocked()
	}
	return n
}

// claimLocked hands out the lowest eligible invocation for a device
// after cursor (docs/protocol.md §5.3), or nil.
func (s *Server) claimLocked(deviceID, cursor string, now time.Time) *invocation {
	var best *invocation
	for _, inv := range s.order {
		if inv.DeviceID != deviceID || inv.ID <= cursor {
			continue
		}
		eligible := inv.State == StateQueued
		if inv.State == StateDelivered {
			limit := time.Duration(inv.DeadlineMS)*time.Millisecond + s.grace
			eligible = now.Sub(inv.DeliveredAt) > limit
		}
		if eligible && (best == nil || inv.ID < best.ID) {
			best = inv
		}
	}
	if best != nil {
		best.State = StateDelivered
		best.DeliveredAt = now
		best.Deliveries++
		s.notifyLocked()
	}
	return best
}

// TamperInvocation lets a test change an invocation after it was
// signed, as a network attacker would: f edits the object poll will
// deliver (server_sig included). It reports whether the id is known.
func (s *Server) TamperInvocation(id string, f func(obj map[string]any)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	inv, ok := s.invs[id]
	if ok {
		f(inv.Object)
	}
	return ok
}
