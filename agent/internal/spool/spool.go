// Package spool is a device's write-ahead state for exactly-once
// execution and at-least-once delivery (docs/protocol.md §6), in <data_dir>/spool as
// the Rust client keeps it. Its folders and its ledger are the
// [layout.Layout]'s; the name of each file in them (<id>.json, or a
// digest of an id that is not a safe file name) is the package's own.
//
// What it guarantees: a STARTED marker is on disk before a run starts,
// a result body is on disk (fsynced) before it is reported spooled, and
// a crash at any point leaves a marker or a spooled result, never
// neither; [Spool.Recover] resolves what a crash left. What it does not:
// it never sends anything (delivery is the agent's), and it assumes one
// process at a time (the agent's lock file).
package spool

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/wire"
)

// Spool is the device's write-ahead state for exactly-once execution and
// at-least-once delivery (docs/protocol.md §6), in <data_dir>/spool as the Rust client
// keeps it: results/<id>.json (spooled bodies, sent byte for byte until
// accepted), started/<id>.json (the write-ahead marker), executed.log
// (one id a line, fsynced) and dead-results/.
type Spool struct {
	// results, started and dead are the folders of spooled results,
	// STARTED markers and refused results.
	results, started, dead string
	executed               map[string]bool
	log                    *os.File
}

// marker is a STARTED marker. CanWrite is this agent's addition: an
// executor that declared fs:write is never run again after a crash,
// whatever its reversibility says (a marker without it counts as true).
type marker struct {
	InvocationID   string `json:"invocation_id"`
	Reversibility  string `json:"reversibility"`
	StartedEpochMS int64  `json:"started_epoch_ms"`
	CanWrite       *bool  `json:"can_write,omitempty"`
}

// maxLedger is how many executed ids are kept in memory.
const maxLedger = 100000

var safeName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// fileName is the spool file name of an id: the id itself when it is a
// safe name (as the Rust client requires), else a digest of it, so that
// no id the server can issue is ever refused here.
func fileName(id string) string {
	if safeName.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "id-" + hex.EncodeToString(sum[:20])
}

// Open opens (creating) the spool in lay's data folder and loads the
// ledger.
func Open(lay layout.Layout) (*Spool, error) {
	s := &Spool{results: lay.SpoolResults(), started: lay.SpoolStarted(), dead: lay.SpoolDeadResults(), executed: map[string]bool{}}
	for _, d := range []string{s.results, s.started, s.dead} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("spool: %w", err)
		}
	}
	logPath := lay.Ledger()
	if f, err := os.Open(logPath); err == nil {
		sc := bufio.NewScanner(f)
		var ids []string
		for line := 1; sc.Scan(); line++ {
			id := strings.TrimSpace(sc.Text())
			if id == "" {
				continue
			}
			if !wire.ValidID(id) {
				f.Close()
				return nil, fmt.Errorf("spool: %s line %d: %q is not an invocation id; the ledger is damaged (move it away only if you accept that an old invocation could run again)", logPath, line, id)
			}
			ids = append(ids, id)
		}
		f.Close()
		if len(ids) > maxLedger {
			ids = ids[len(ids)-maxLedger:]
		}
		for _, id := range ids {
			s.executed[id] = true
		}
	}
	res, _ := filepath.Glob(filepath.Join(s.results, "*.json"))
	for _, p := range res {
		var r struct {
			ID string `json:"invocation_id"`
		}
		if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &r) == nil && r.ID != "" {
			s.executed[r.ID] = true
		}
	}
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s.log = f
	return s, nil
}

// Close closes the ledger.
func (s *Spool) Close() error { return s.log.Close() }

// Executed reports whether id has run on this device (or must be taken
// as having run).
func (s *Spool) Executed(id string) bool { return s.executed[id] }

// Start writes the STARTED marker, durably, before the sandbox starts.
func (s *Spool) Start(id, reversibility string, canWrite bool) error {
	m := marker{InvocationID: id, Reversibility: reversibility, StartedEpochMS: time.Now().UnixMilli(), CanWrite: &canWrite}
	b, _ := json.Marshal(m)
	if err := atomicfile.WriteFile(filepath.Join(s.started, fileName(id)+".json"), b, 0o600); err != nil {
		return err
	}
	// From here on this process never starts it again, whatever happens
	// to its result (a full disk must not mean a second run); the marker
	// decides after a restart.
	s.executed[id] = true
	return nil
}

// Finish spools the result body (durably), records id as executed and
// removes its STARTED marker, in that order: a crash at any point leaves
// either a marker (outcome unknown) or a spooled result, never neither.
// It returns the spooled result, as [Spool.Pending] would list it, for
// delivery. On an error the result may or may not be spooled.
func (s *Spool) Finish(id string, body []byte) (Spooled, error) {
	p := filepath.Join(s.results, fileName(id)+".json")
	if err := atomicfile.WriteFile(p, body, 0o600); err != nil {
		return Spooled{}, fmt.Errorf("spool: %w", err)
	}
	if err := s.record(id); err != nil {
		return Spooled{}, err
	}
	if err := os.Remove(filepath.Join(s.started, fileName(id)+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Spooled{}, fmt.Errorf("spool: %w", err)
	}
	return Spooled{ID: id, Body: body, path: p}, nil
}

func (s *Spool) record(id string) error {
	if _, err := s.log.WriteString(id + "\n"); err != nil {
		return fmt.Errorf("spool: ledger: %w", err)
	}
	if err := s.log.Sync(); err != nil {
		return fmt.Errorf("spool: ledger: %w", err)
	}
	s.executed[id] = true
	return nil
}

// Spooled is a result waiting for delivery.
type Spooled struct {
	ID   string
	Body []byte
	path string
}

// Pending lists the spooled results, to be sent with exactly these
// bytes until the server accepts them.
func (s *Spool) Pending() ([]Spooled, error) {
	paths, err := filepath.Glob(filepath.Join(s.results, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	var out []Spooled
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("spool: %w", err)
		}
		var r struct {
			ID string `json:"invocation_id"`
		}
		if json.Unmarshal(b, &r) != nil || r.ID == "" {
			continue
		}
		out = append(out, Spooled{ID: r.ID, Body: b, path: p})
	}
	return out, nil
}

// Delivered removes a result the server accepted.
func (s *Spool) Delivered(r Spooled) error {
	if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// DeadLetter moves a result the server refused for good (4xx but 408
// and 429) to dead-results/<id>.http-<status>.<nanos>.json.
func (s *Spool) DeadLetter(r Spooled, status int) error {
	dst := filepath.Join(s.dead, fmt.Sprintf("%s.http-%d.%d.json", fileName(r.ID), status, time.Now().UnixNano()))
	if err := os.Rename(r.path, dst); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// Expire removes the spooled results written before cut, delivered or
// not, and returns their files. Their ids stay executed.
func (s *Spool) Expire(cut time.Time) []string {
	old, _ := filepath.Glob(filepath.Join(s.results, "*.json"))
	var gone []string
	for _, p := range old {
		if fi, err := os.Stat(p); err == nil && fi.ModTime().Before(cut) {
			os.Remove(p)
			gone = append(gone, p)
		}
	}
	return gone
}

// Recover resolves the STARTED markers a crash left (docs/protocol.md §6, with
// the agent's stricter rule of docs/protocol.md §17): a marker whose result was spooled is
// dropped; a read-only invocation of an executor that cannot write is
// dropped (it may run again); any other gets an "outcome unknown"
// result spooled for deviceID and is recorded as executed, never re-run.
// It returns the ids reported as unknown.
func (s *Spool) Recover(deviceID string) ([]string, error) {
	paths, _ := filepath.Glob(filepath.Join(s.started, "*.json"))
	var unknown []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		var m marker
		if err != nil || json.Unmarshal(b, &m) != nil || m.InvocationID == "" {
			return unknown, fmt.Errorf("spool: STARTED marker %s is unreadable; an invocation may have been interrupted (inspect it, then remove it)", p)
		}
		spooled := fileExists(filepath.Join(s.results, fileName(m.InvocationID)+".json"))
		canWrite := m.CanWrite == nil || *m.CanWrite
		switch {
		case spooled || s.executed[m.InvocationID]:
			if !s.executed[m.InvocationID] {
				if err := s.record(m.InvocationID); err != nil {
					return unknown, err
				}
			}
		case m.Reversibility == "read_only" && !canWrite:
		default:
			r := result.Result{InvocationID: m.InvocationID, DeviceID: deviceID, Entries: []any{}, Sandbox: "unknown_after_restart",
				Payload:    map[string]any{"effect_status": "unknown", "recovery": "write_ahead_no_reexecution"},
				Error:      "the agent stopped while this invocation was running; it is not run again, and its effects are unknown",
				ErrorClass: wire.ClassExecutionOutcomeUnknown}
			body, err := r.Body()
			if err != nil {
				return unknown, err
			}
			if _, err := s.Finish(m.InvocationID, body); err != nil {
				return unknown, err
			}
			unknown = append(unknown, m.InvocationID)
			continue
		}
		if err := os.Remove(p); err != nil {
			return unknown, fmt.Errorf("spool: %w", err)
		}
	}
	return unknown, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Body returns the spooled result of an invocation, if it is still
// waiting for delivery.
func (s *Spool) Body(id string) ([]byte, bool) {
	b, err := os.ReadFile(filepath.Join(s.results, fileName(id)+".json"))
	return b, err == nil
}
