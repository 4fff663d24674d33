// Package result is the message a device POSTs to /agent/result
// (docs/protocol.md §9.2): how an executor's stdout maps to it, the results the device
// makes itself (timeout, device error, outcome unknown), and the exact
// bytes it is sent as.
//
// A body is compact JSON with sorted keys and no HTML escaping, never
// over [MaxResultBytes]: the server verifies the raw bytes. The package
// neither spools nor sends a result; see the agent's spool for that.
package result

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/wire"
)

// MaxResultBytes is the server's limit on a result body (docs/protocol.md §17.4).
const MaxResultBytes = 4 << 20

// Result is the message POSTed to /agent/result (docs/protocol.md §9.2).
type Result struct {
	InvocationID string
	DeviceID     string
	OK           bool
	Entries      any
	NProcessed   int64
	ElapsedMS    int64
	// Sandbox is the word sandbox.Run reported (or "none",
	// "unknown_after_restart").
	Sandbox string
	// SandboxDowngradeReason is set when the isolation applied is
	// weaker than the machine's best or than the manifest asked.
	SandboxDowngradeReason string
	Payload                any
	Error                  string
	ErrorClass             string

	// Policy is the fingerprint of the sandbox Policy the run had, for
	// the audit log; it is not sent.
	Policy string
}

// FromStdout maps an executor's stdout to a Result (docs/protocol.md §9.1): stdout must
// be one JSON value; ok, entries (or results), ok_count (or
// n_processed), error and error_class are read from it when it is an
// object, and payload is the whole value. A stdout that is not JSON is
// a device_error.
func FromStdout(stdout []byte) Result {
	v, err := wire.Decode(bytes.TrimSpace(stdout))
	if err != nil {
		return DeviceError(fmt.Errorf("the executor's output is not one JSON value: %w", err))
	}
	r := Result{Payload: v, Entries: []any{}}
	m, _ := v.(map[string]any)
	if b, ok := m["ok"].(bool); ok {
		r.OK = b
	}
	switch {
	case m["entries"] != nil:
		r.Entries = m["entries"]
	case m["results"] != nil:
		r.Entries = m["results"]
	}
	count, present := m["ok_count"]
	if !present {
		count, present = m["n_processed"]
	}
	n, isInt := int64(0), false
	if num, ok := count.(json.Number); present && ok {
		if x, err := strconv.ParseInt(string(num), 10, 64); err == nil {
			n, isInt = x, true
		}
	}
	if !isInt {
		if list, ok := r.Entries.([]any); ok {
			n = int64(len(list))
		}
	}
	r.NProcessed = n
	if s, ok := m["error"].(string); ok {
		r.Error = s
	}
	if s, ok := m["error_class"].(string); ok {
		r.ErrorClass = s
	}
	return r
}

// FromOutput is [FromStdout] for a run whose stdout the sandbox may
// have cut at limit bytes (truncated): a cut stdout is not read at all
// (its end is missing, so it is neither one JSON value nor the whole
// answer), and the result is a device_error that says the executor
// named went over the limit, with the limit.
func FromOutput(executor string, stdout []byte, truncated bool, limit int64) Result {
	if !truncated {
		return FromStdout(stdout)
	}
	return DeviceError(fmt.Errorf("executor %s wrote more than %s to stdout (the sandbox's output limit): its output was cut there and not read", executor, sandbox.FormatBytes(limit)))
}

// Timeout is the result of a run the deadline killed (docs/protocol.md §9.1).
func Timeout(sandboxWord string) Result {
	return Result{Entries: []any{}, Payload: map[string]any{}, Sandbox: sandboxWord,
		Error: "deadline exceeded", ErrorClass: wire.ClassTimeout}
}

// CPUTimeExceeded is the result of a run its CPU-time limit ended
// (sandbox.Output.CPUTimeExceeded): like [Timeout], error_class
// "timeout", with an error that says which limit it was, limit being
// the processor time each process of the run had (each process of the
// tree on Linux and macOS, the whole run on Windows).
func CPUTimeExceeded(sandboxWord, executor string, limit time.Duration) Result {
	return Result{Entries: []any{}, Payload: map[string]any{}, Sandbox: sandboxWord,
		Error: fmt.Sprintf("CPU time limit exceeded: executor %s used the %d s of processor time it may use, and was stopped", executor, int64(math.Ceil(limit.Seconds()))), ErrorClass: wire.ClassTimeout}
}

// CutAtStop is the result of a run the agent cut short because it was
// asked to stop and the stop budget its service manager gives it ran
// low (docs/protocol.md §7.2): ok false, no entries, why as its error.
// For an executor that writes (writes), what it changed is not known:
// error_class "execution_outcome_unknown" and the payload of an outcome
// unknown after a crash, its recovery "cut_at_stop"; for one that writes
// nothing, "interrupted" and an empty payload. sandboxWord is the run's.
func CutAtStop(sandboxWord string, writes bool, why string) Result {
	r := Result{Entries: []any{}, Payload: map[string]any{}, Sandbox: sandboxWord,
		Error: why, ErrorClass: wire.ClassInterrupted}
	if writes {
		r.Payload = map[string]any{"effect_status": "unknown", "recovery": "cut_at_stop"}
		r.ErrorClass = wire.ClassExecutionOutcomeUnknown
	}
	return r
}

// DeviceError is the result of anything that failed on the device
// before or around the run (docs/protocol.md §9.1): fetch, verification, sandbox,
// non-JSON output.
func DeviceError(err error) Result {
	return Result{Entries: []any{}, Payload: map[string]any{}, Sandbox: "none",
		Error: err.Error(), ErrorClass: wire.ClassDeviceError}
}

// Body encodes the result as the bytes to sign and send: compact JSON
// with sorted keys, no HTML escaping (the server verifies the raw
// bytes, floats in the payload included). A body over [MaxResultBytes]
// has its payload and entries dropped and says so in error and
// error_class ("result_too_large"), rather than being refused by the
// server and lost.
func (r Result) Body() ([]byte, error) {
	_, b, _, err := r.Encode()
	return b, err
}

// Encode is [Result.Body], and also returns the Result the body is the
// encoding of (sent) and whether it is r cut to fit under
// [MaxResultBytes]. What the device records of the result (its log
// line, its audit line, its history journal entry) is sent, not r: a
// cut result says ok false and error_class "result_too_large", with
// its entries and payload dropped and n_processed 0, whatever r said.
// r itself is left as it is: its payload is still the executor's whole
// output (the history journal reads the rows of what the run changed
// from it).
func (r Result) Encode() (sent Result, body []byte, cut bool, err error) {
	b, err := r.marshal()
	if err != nil || len(b) <= MaxResultBytes {
		return r, b, false, err
	}
	size := len(b)
	r.OK, r.Entries, r.Payload, r.NProcessed = false, []any{}, map[string]any{}, 0
	r.Error = fmt.Sprintf("the result was %d bytes, over the server's %d-byte limit: its payload was dropped on the device", size, MaxResultBytes)
	r.ErrorClass = wire.ClassResultTooLarge
	b, err = r.marshal()
	return r, b, true, err
}

// marshal is the body of r as it is, however large.
func (r Result) marshal() ([]byte, error) {
	m := map[string]any{
		"invocation_id": r.InvocationID,
		"device_id":     r.DeviceID,
		"ok":            r.OK,
		"entries":       r.Entries,
		"n_processed":   r.NProcessed,
		"elapsed_ms":    r.ElapsedMS,
		"sandbox":       r.Sandbox,
		"payload":       r.Payload,
	}
	if r.SandboxDowngradeReason != "" {
		m["sandbox_downgrade_reason"] = r.SandboxDowngradeReason
	}
	if r.Error != "" {
		m["error"] = r.Error
	}
	if r.ErrorClass != "" {
		m["error_class"] = r.ErrorClass
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("result of %s: %w", r.InvocationID, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
