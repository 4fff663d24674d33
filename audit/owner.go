package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// Events of the owner's that the log records beside the invocations.
const (
	// EventLimitsChanged is a change of the owner's limits file.
	EventLimitsChanged = "limits_changed"
	// EventRefused is an invocation the owner's limits refused before
	// it ran (its line is an invocation's, with "refused_by").
	EventRefused = "refused"
)

// Change is one setting of the owner's limits whose value changed,
// its values written as TOML writes them.
type Change struct {
	Key string `json:"key"`
	Old string `json:"old"`
	New string `json:"new"`
}

// LimitsChange is a change of the device owner's limits file, as
// [Log.WriteLimits] records it:
//
//	{"seq":13,"prev":"<64 hex>","time":"2026-12-02T08:20:00.000Z",
//	 "event":"limits_changed","file":"/home/ada/.config/metnos/limits.toml",
//	 "seen":"run","old_sha256":"<64 hex>","new_sha256":"<64 hex>",
//	 "changes":[{"key":"mode","old":"\"full\"","new":"\"readonly\""}],
//	 "in_force":true}
//
// (on one line).
type LimitsChange struct {
	// Time is when the change was seen; the zero Time means now.
	Time time.Time
	// File is the limits file.
	File string
	// Seen is when the agent saw it: "start" (a change made while no
	// agent ran) or "run" (while it ran).
	Seen string
	// OldSHA256 and NewSHA256 are the SHA-256 of the file before and
	// after, in hex ("" where there was no file).
	OldSHA256, NewSHA256 string
	// Changes are the settings whose values changed (none when only
	// comments or layout did).
	Changes []Change
	// InForce says the new file was put in force; Error says why it was
	// not (the limits in force stay the ones before).
	InForce bool
	Error   string
}

// limitsLine is a LimitsChange as written, after chainlog's seq and
// prev.
type limitsLine struct {
	Time      string   `json:"time"`
	Event     string   `json:"event"`
	File      string   `json:"file"`
	Seen      string   `json:"seen,omitempty"`
	OldSHA256 string   `json:"old_sha256"`
	NewSHA256 string   `json:"new_sha256"`
	Changes   []Change `json:"changes"`
	InForce   bool     `json:"in_force"`
	Error     string   `json:"error,omitempty"`
}

// WriteLimits appends the change c of the owner's limits file to the
// log, in the chain with the invocations, and returns once it is on
// disk.
func (l *Log) WriteLimits(c LimitsChange) error {
	if c.Time.IsZero() {
		c.Time = time.Now()
	}
	if c.Changes == nil {
		c.Changes = []Change{}
	}
	ln := limitsLine{Time: c.Time.UTC().Format(timeFormat), Event: EventLimitsChanged, File: c.File, Seen: c.Seen,
		OldSHA256: c.OldSHA256, NewSHA256: c.NewSHA256, Changes: c.Changes, InForce: c.InForce, Error: c.Error}
	if err := l.append(c.Time, ln); err != nil {
		return fmt.Errorf("writing the audit record of a change of %s: %w", c.File, err)
	}
	return nil
}

// OwnerEvent is a line of the log about the device owner's limits: a
// change of the limits file ([EventLimitsChanged]), or an invocation
// they refused ([EventRefused]).
type OwnerEvent struct {
	// Time is the line's time; Event its kind.
	Time  time.Time `json:"time"`
	Event string    `json:"event"`

	// File, Seen, OldSHA256, NewSHA256, Changes, InForce and Error are
	// a change's (see [LimitsChange]).
	File      string   `json:"file,omitempty"`
	Seen      string   `json:"seen,omitempty"`
	OldSHA256 string   `json:"old_sha256,omitempty"`
	NewSHA256 string   `json:"new_sha256,omitempty"`
	Changes   []Change `json:"changes,omitempty"`
	InForce   bool     `json:"in_force,omitempty"`
	Error     string   `json:"error,omitempty"`

	// InvocationID, TurnID, Executor and RefusedBy are a refused
	// invocation's.
	InvocationID string `json:"invocation_id,omitempty"`
	TurnID       string `json:"turn_id,omitempty"`
	Executor     string `json:"executor,omitempty"`
	RefusedBy    string `json:"refused_by,omitempty"`
}

// OwnerEvents reads the owner's events of the audit log in dir back,
// newest first: at most max of them (0: all), and none older than since
// (the zero time: from the start). A log that does not exist has none.
// It reads the log from its end, and only as far back as it must.
func OwnerEvents(dir string, since time.Time, max int) ([]OwnerEvent, error) {
	var out []OwnerEvent
	err := chainlog.ReadBack(dir, func(_ string, line []byte) (bool, error) {
		limits := bytes.Contains(line, []byte(`"event":"`+EventLimitsChanged+`"`))
		refused := bytes.Contains(line, []byte(`"refused_by":`))
		if !limits && !refused {
			if t, ok := lineTime(line); ok && !since.IsZero() && t.Before(since) {
				return false, nil
			}
			return true, nil
		}
		var e struct {
			OwnerEvent
			Time string `json:"time"`
		}
		if err := json.Unmarshal(line, &e); err != nil {
			return true, nil // not one of these after all; Verify judges the line
		}
		t, err := time.Parse(time.RFC3339Nano, e.Time)
		if err != nil {
			return true, nil
		}
		if !since.IsZero() && t.Before(since) {
			return false, nil
		}
		ev := e.OwnerEvent
		ev.Time = t
		if refused {
			ev.Event = EventRefused
		}
		out = append(out, ev)
		return max <= 0 || len(out) < max, nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return out, fmt.Errorf("reading the owner's events in the audit log %s: %w", dir, err)
	}
	return out, nil
}

// lineTime reads the "time" of a line without decoding the rest of it
// (chainlog's seq and prev come before it).
func lineTime(line []byte) (time.Time, bool) {
	const key = `"time":"`
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return time.Time{}, false
	}
	rest := line[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(rest[:j]))
	return t, err == nil
}
