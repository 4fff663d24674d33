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
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
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
	// size is the ledger's length up to its last whole line; torn says
	// that an append failed half-way and could not be cut back, so the
	// next one starts with a newline of its own.
	size int64
	torn bool
	// cut is the torn last line Open removed from the ledger.
	cut string
	// appends counts the ledger's appends since it was last compacted.
	appends int
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

// maxLedger is how many executed ids without an issue time (durable
// ids) are kept.
const maxLedger = 100000

// ledgerWindow is how long an executed id that carries its issue time
// is kept in the ledger: past [wire.MaxIDAge] the agent refuses the id
// before anything else ([wire.CheckID]), so it can never run again
// whether the ledger names it or not (the server itself stops handing an
// invocation out after a day). A day more covers a clock put back.
const ledgerWindow = wire.MaxIDAge + 24*time.Hour

// compactEvery is how many appends a running agent makes between two
// compactions of the ledger ([Spool.compact]).
var compactEvery = 1000

// safeName is unbounded; its user checks the length (128): a bounded
// repeat compiles to a program that long, at every start.
var safeName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_-]+$`) })

// fileName is the spool file name of an id: the id itself when it is a
// safe name (as the Rust client requires), else a digest of it, so that
// no id the server can issue is ever refused here.
func fileName(id string) string {
	if len(id) <= 128 && safeName().MatchString(id) {
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
	// What a crash during a compaction left beside the ledger.
	if old, _ := filepath.Glob(filepath.Join(filepath.Dir(logPath), ".ledger-*")); len(old) > 0 {
		for _, p := range old {
			os.Remove(p)
		}
	}
	ids, size, cut, err := readLedger(logPath)
	if err != nil {
		return nil, err
	}
	s.size, s.cut = size, cut
	kept := keep(ids, time.Now())
	for _, id := range kept {
		s.executed[id] = true
	}
	if len(kept) < len(ids) {
		// Best effort: a ledger that cannot be rewritten (a read-only
		// or full data folder) is used as it is.
		if f, n, err := rewriteLedger(logPath, kept); err == nil {
			f.Close()
			s.size = n
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

// readLedger reads the ids of the ledger at p, and cuts off a torn last
// line: one without its newline, which a crash in the middle of an
// append leaves (half an id, or a whole one whose newline did not
// make it). Such an id was never reported recorded: its result file
// or its STARTED marker is still there and decides ([Spool.Recover]),
// as if the append had not begun. Without the cut, the next id would
// be glued onto it ("…f0inv-18ed…") and neither would count. A damaged
// line before the last one is refused, not guessed at.
// It returns the ids, the ledger's length once cut and the line cut.
func readLedger(p string) (ids []string, size int64, cut string, err error) {
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, "", nil
	}
	if err != nil {
		return nil, 0, "", fmt.Errorf("spool: ledger: %w", err)
	}
	defer f.Close()
	r := bufio.NewReader(f)
	for line := 1; ; line++ {
		text, err := r.ReadString('\n')
		if err == io.EOF {
			if text == "" {
				break
			}
			if err := cutTo(p, size); err != nil {
				return nil, 0, "", fmt.Errorf("spool: %s ends with a line cut short (%q) that cannot be removed: %w; make the data folder writable, then start again", p, text, err)
			}
			cut = text
			break
		}
		if err != nil {
			return nil, 0, "", fmt.Errorf("spool: ledger %s: %w", p, err)
		}
		size += int64(len(text))
		id := strings.TrimSpace(text)
		if id == "" {
			continue
		}
		if !wire.ValidID(id) {
			return nil, 0, "", fmt.Errorf("spool: %s line %d: %q is not an invocation id; the ledger is damaged (move it away only if you accept that an old invocation could run again)", p, line, id)
		}
		ids = append(ids, id)
	}
	return ids, size, cut, nil
}

// cutTo truncates the file p to size bytes, durably.
func cutTo(p string, size int64) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Cut returns the torn last line [Open] removed from the ledger ("" when
// there was none), for the agent to log.
func (s *Spool) Cut() string { return s.cut }

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
// delivery. On an error (a full disk) it still returns the result, to
// be delivered from memory unless [Spooled.OnDisk]: the caller retries
// with Finish while it is not delivered, and with [Spool.Settle] once
// it is.
func (s *Spool) Finish(id string, body []byte) (Spooled, error) {
	r := Spooled{ID: id, Body: body}
	p := filepath.Join(s.results, fileName(id)+".json")
	if err := atomicfile.WriteFile(p, body, 0o600); err != nil {
		// WriteFile leaves no file when it fails.
		return r, fmt.Errorf("spool: the result of %s: %w", id, err)
	}
	r.path = p
	return r, s.Settle(id)
}

// Settle records id as executed in the ledger and removes its STARTED
// marker: the end of [Spool.Finish], on its own for a result delivered
// from memory because it could not be spooled. Once it succeeds, a
// restart neither runs id again nor reports it as outcome unknown.
func (s *Spool) Settle(id string) error {
	if err := s.record(id); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.started, fileName(id)+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// record appends id to the ledger, durably. An append that fails
// half-way (a full disk) is cut back, or else fenced: the next one
// starts with a newline, so that no id is ever glued onto half of
// another.
func (s *Spool) record(id string) error {
	line := id + "\n"
	if s.torn {
		line = "\n" + line
	}
	n, err := s.log.WriteString(line)
	switch {
	case n == len(line):
		s.size += int64(n)
		s.torn = false
		s.appends++
	case n > 0:
		s.torn = s.log.Truncate(s.size) != nil
	}
	if err == nil {
		err = s.log.Sync()
	}
	if err != nil {
		return fmt.Errorf("spool: recording %s in the ledger %s: %w", id, s.log.Name(), err)
	}
	s.executed[id] = true
	if s.appends >= compactEvery {
		s.appends = 0
		s.compact(time.Now())
	}
	return nil
}

// keep returns the ids of a ledger, oldest first, that are still
// needed at now: those issued within [ledgerWindow], and the newest
// [maxLedger] of those that carry no issue time. The window is counted
// back from now or from the newest issue time in the ledger, whichever
// is earlier: a device clock that jumps ahead does not drop ids the
// agent would still run once the clock is put right.
func keep(ids []string, now time.Time) []string {
	newest := time.Time{}
	for _, id := range ids {
		if at, ok := wire.IssuedAt(id); ok && at.After(newest) {
			newest = at
		}
	}
	if !newest.IsZero() && newest.Before(now) {
		now = newest
	}
	var out []string
	durable := 0
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		if at, ok := wire.IssuedAt(id); ok {
			if now.Sub(at) > ledgerWindow {
				continue
			}
		} else if durable++; durable > maxLedger {
			continue
		}
		out = append(out, id)
	}
	slices.Reverse(out)
	return out
}

// compact drops from the ledger, and from memory, the ids [keep] no
// longer needs, so that neither grows with how long the agent has run.
// The ledger is rewritten whole (atomically) and opened again; when
// that fails, the old one stays in use, whole.
func (s *Spool) compact(now time.Time) {
	var ids []string
	for id := range s.executed {
		ids = append(ids, id)
	}
	kept := keep(ids, now)
	if len(kept) == len(ids) {
		return
	}
	for _, id := range ids {
		delete(s.executed, id)
	}
	for _, id := range kept {
		s.executed[id] = true
	}
	path := s.log.Name()
	// The ledger holds only what is recorded; ids in memory only (a
	// STARTED marker, a result not recorded yet) stay out of it.
	onDisk, _, _, err := readLedger(path)
	if err != nil {
		return
	}
	kept = keep(onDisk, now)
	if len(kept) == len(onDisk) {
		return
	}
	f, n, err := rewriteLedger(path, kept)
	if err != nil {
		return
	}
	s.log.Close()
	s.log, s.size, s.torn = f, n, false
}

// rewriteLedger replaces the ledger at p by ids, durably, and returns
// it open for appending, with its length. The new ledger is written
// beside the old one, synced and opened before it is renamed into
// place, so that no append can go to the file it replaces; on an
// error the old one is left as it was.
func rewriteLedger(p string, ids []string) (*os.File, int64, error) {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(id)
		b.WriteByte('\n')
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".ledger-*")
	if err != nil {
		return nil, 0, err
	}
	_, err = f.WriteString(b.String())
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, err
	}
	atomicfile.SyncDir(filepath.Dir(p))
	if g, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
		f.Close()
		f = g
	}
	return f, int64(b.Len()), nil
}

// Spooled is a result waiting for delivery.
type Spooled struct {
	ID   string
	Body []byte
	path string // "" for a result kept in memory only
}

// OnDisk reports whether the result is in the spool's results folder
// (it is not when [Spool.Finish] could not write it).
func (r Spooled) OnDisk() bool { return r.path != "" }

// Pending lists the spooled results, to be sent with exactly these
// bytes until the server accepts them. A file that is not a readable
// result is skipped: [Spool.Salvage] reports it at the next start.
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

// Delivered removes a result the server accepted (nothing for one kept
// in memory only).
func (s *Spool) Delivered(r Spooled) error {
	if !r.OnDisk() {
		return nil
	}
	if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// DeadLetter moves a result the server refused for good (4xx but 408
// and 429) to dead-results/<id>.http-<status>.<nanos>.json.
func (s *Spool) DeadLetter(r Spooled, status int) error {
	dst := filepath.Join(s.dead, fmt.Sprintf("%s.http-%d.%d.json", fileName(r.ID), status, time.Now().UnixNano()))
	if !r.OnDisk() {
		if err := atomicfile.WriteFile(dst, r.Body, 0o600); err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		return nil
	}
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
			body, err := unknownResult(m.InvocationID, deviceID, "the agent stopped while this invocation was running")
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

// unknownResult is the "outcome unknown" result of an invocation that
// is never run again, for the reason given.
func unknownResult(id, deviceID, why string) ([]byte, error) {
	r := result.Result{InvocationID: id, DeviceID: deviceID, Entries: []any{}, Sandbox: "unknown_after_restart",
		Payload:    map[string]any{"effect_status": "unknown", "recovery": "write_ahead_no_reexecution"},
		Error:      why + "; it is not run again, and its effects are unknown",
		ErrorClass: wire.ClassExecutionOutcomeUnknown}
	return r.Body()
}

// Salvaged is a spooled result that could not be read (a crash or a
// disk error damaged it), moved to dead-results by [Spool.Salvage].
type Salvaged struct {
	// ID is its invocation, "" when neither the file's name nor what is
	// left of its bytes tells it.
	ID string
	// Dead is where its bytes are now, for inspection.
	Dead string
}

// idField finds the invocation id in what is left of a damaged result.
// idField is unbounded; its user checks the id's length (8 to 256).
var idField = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`"invocation_id"\s*:\s*"([A-Za-z0-9._:-]+)"`) })

// Salvage moves every spooled result that is not a readable result to
// dead-results/<name>.damaged.<nanos>.json and, when its invocation is
// known (the file is named by the id itself, or the bytes left name an
// id whose file it is), spools an "outcome unknown" result for deviceID
// in its place, as [Spool.Recover] does after a crash: the ledger says
// the invocation ran, so it is never run again, and without an answer
// the server would wait for its own timeout. Run it at start, after
// Recover; [Spool.Pending] skips a damaged file.
func (s *Spool) Salvage(deviceID string) ([]Salvaged, error) {
	paths, err := filepath.Glob(filepath.Join(s.results, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	var out []Salvaged
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return out, fmt.Errorf("spool: reading the spooled result %s: %w", p, err)
		}
		var r struct {
			ID string `json:"invocation_id"`
		}
		if json.Unmarshal(b, &r) == nil && r.ID != "" {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(p), ".json")
		var id string
		if m := idField().FindSubmatch(b); m != nil && len(m[1]) >= 8 && len(m[1]) <= 256 && fileName(string(m[1])) == name {
			id = string(m[1])
		} else if wire.ValidID(name) && fileName(name) == name && !digestName().MatchString(name) {
			id = name
		}
		dead := filepath.Join(s.dead, fmt.Sprintf("%s.damaged.%d.json", name, time.Now().UnixNano()))
		if err := os.Rename(p, dead); err != nil {
			return out, fmt.Errorf("spool: moving the damaged result %s to %s: %w", p, s.dead, err)
		}
		out = append(out, Salvaged{ID: id, Dead: dead})
		if id == "" {
			continue
		}
		body, err := unknownResult(id, deviceID, "the device's spooled result of this invocation was damaged before it was delivered")
		if err != nil {
			return out, err
		}
		if _, err := s.Finish(id, body); err != nil {
			// Put it back, for the next start to report.
			if os.Rename(dead, p) == nil {
				out = out[:len(out)-1]
			}
			return out, err
		}
	}
	return out, nil
}

// digestName is the file name of an id that is not a safe name.
var digestName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^id-[0-9a-f]{40}$`) })

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Body returns the spooled result of an invocation, if it is still
// waiting for delivery.
func (s *Spool) Body(id string) ([]byte, bool) {
	b, err := os.ReadFile(filepath.Join(s.results, fileName(id)+".json"))
	return b, err == nil
}
