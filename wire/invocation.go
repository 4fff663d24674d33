package wire

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Invocation is one invocation of a poll response (docs/protocol.md §7.1), parsed and
// type-checked. Raw keeps the object as decoded, for the signature.
type Invocation struct {
	ID             string
	TurnID         string
	Executor       string
	ManifestSHA256 string
	CodeSHA256     string
	Args           any
	Scope          string
	Reversibility  string
	Env            map[string]string
	DeadlineMS     int64
	ServerSig      string
	Raw            map[string]any
}

// ErrMalformed is wrapped by every error of [ParseInvocation].
var ErrMalformed = errors.New("wire: malformed invocation")

// ParseInvocation checks the shape of an invocation as [Decode] returns
// it (docs/protocol.md §7.2 step 1): the required string fields, env_injections values
// that are strings, an integer deadline ([DefaultDeadlineMS] when absent).
func ParseInvocation(v any) (Invocation, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Invocation{}, fmt.Errorf("%w: not an object", ErrMalformed)
	}
	inv := Invocation{Raw: m, Args: m["args"], DeadlineMS: DefaultDeadlineMS}
	str := func(k string, required bool, dst *string) error {
		x, present := m[k]
		if !present || x == nil {
			if required {
				return fmt.Errorf("%w: %s is missing", ErrMalformed, k)
			}
			return nil
		}
		s, ok := x.(string)
		if !ok {
			return fmt.Errorf("%w: %s is not a string", ErrMalformed, k)
		}
		*dst = s
		return nil
	}
	for _, f := range []struct {
		k   string
		req bool
		dst *string
	}{
		{"invocation_id", true, &inv.ID}, {"executor", true, &inv.Executor},
		{"manifest_sha256", true, &inv.ManifestSHA256}, {"code_sha256", true, &inv.CodeSHA256},
		{"server_sig", true, &inv.ServerSig}, {"turn_id", false, &inv.TurnID},
		{"scope", false, &inv.Scope}, {"reversibility", false, &inv.Reversibility},
	} {
		if err := str(f.k, f.req, f.dst); err != nil {
			return Invocation{}, err
		}
	}
	if e, present := m["env_injections"]; present && e != nil {
		em, ok := e.(map[string]any)
		if !ok {
			return Invocation{}, fmt.Errorf("%w: env_injections is not an object", ErrMalformed)
		}
		inv.Env = make(map[string]string, len(em))
		for k, x := range em {
			s, ok := x.(string)
			if !ok {
				return Invocation{}, fmt.Errorf("%w: env_injections[%q] is not a string", ErrMalformed, k)
			}
			inv.Env[k] = s
		}
	}
	if d, present := m["deadline_ms"]; present && d != nil {
		n, ok := d.(json.Number)
		if !ok {
			return Invocation{}, fmt.Errorf("%w: deadline_ms is not a number", ErrMalformed)
		}
		v, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return Invocation{}, fmt.Errorf("%w: deadline_ms %s is not an integer", ErrMalformed, n)
		}
		inv.DeadlineMS = v
	}
	return inv, nil
}

// Verify checks server_sig over the invocation's signed fields (docs/protocol.md §3.4)
// with the pinned server key.
func (inv Invocation) Verify(server ed25519.PublicKey) error {
	if err := VerifyCanonical(server, InvocationSigned(inv.Raw), inv.ServerSig); err != nil {
		return fmt.Errorf("invocation %s: %w", inv.ID, err)
	}
	return nil
}

var ()

// Freshness bounds of time-ordered ids (docs/protocol.md §6.4).
const (
	MaxIDAge    = 48 * time.Hour
	MaxIDFuture = 5 * time.Minute
)

// ValidID reports whether id has a shape the server can issue
// ([A-Za-z0-9._:-]{8,256}), whatever its time.
// (The server's own validator is the pattern ^[A-Za-z0-9._:-]{8,256}$;
// it is checked by hand, as a ledger of thousands of ids is read at
// every start.)
func ValidID(id string) bool {
	if len(id) < 8 || len(id) > 256 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// timedNS returns the issue time, in hex nanoseconds, of the server's
// usual id, inv-<16 hex ns><8 hex> (lower-case hex), and false for any
// other id.
func timedNS(id string) (string, bool) {
	if len(id) != 4+16+8 || id[:4] != "inv-" {
		return "", false
	}
	for i := 4; i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return id[4:20], true
}

// IssuedAt is the issue time an id carries (inv-<16 hex ns><8 hex>),
// and false for an id that carries none (a durable id).
func IssuedAt(id string) (time.Time, bool) {
	hex, ok := timedNS(id)
	if !ok {
		return time.Time{}, false
	}
	ns, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || ns > math.MaxInt64 {
		return time.Time{}, false
	}
	return time.Unix(0, int64(ns)), true
}

// CheckID accepts every id the server can produce ([A-Za-z0-9._:-]{8,256},
// durable ids included: docs/protocol.md §17.1) and applies the freshness window only to
// ids that carry their issue time (inv-<16 hex ns><8 hex>).
func CheckID(id string, now time.Time) error {
	if !ValidID(id) {
		return fmt.Errorf("wire: invocation id %q is not one the server can issue", id)
	}
	hex, ok := timedNS(id)
	if !ok {
		return nil
	}
	ns, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return fmt.Errorf("wire: invocation id %q: %w", id, err)
	}
	issued := time.Unix(0, int64(ns))
	switch {
	case now.Sub(issued) > MaxIDAge:
		return fmt.Errorf("wire: invocation %s was issued %s ago, more than %s: refusing a stale invocation", id, now.Sub(issued).Round(time.Second), MaxIDAge)
	case issued.Sub(now) > MaxIDFuture:
		return fmt.Errorf("wire: invocation %s is issued %s in the future (is this device's clock right?)", id, issued.Sub(now).Round(time.Second))
	}
	return nil
}
