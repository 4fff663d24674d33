package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/lockfile"
)

// The grant ledger: every access-control entry an AppContainer run adds
// is recorded, durably, before it is applied, and removed after the run;
// whatever a killed agent left is removed at the next start. The ledger
// is a folder of records, one per run in progress, and a lock that turns
// every change of it (and of the entries it lists) into one at a time.
//
// What it guarantees, for the entries it lists:
//
//   - An entry is applied only once its record is on the disk (written
//     whole and synced): a kill at any point leaves every entry it added
//     listed in a record.
//   - Removing is idempotent, and it removes only what a record lists
//     for this device's container SID, matching its rights and
//     inheritance: an entry that was on the path before the run (the
//     owner's, or another tool's) is marked as such and kept.
//   - Two runs that need the same entry share it: it is removed when the
//     last record that lists it goes, not before.
//   - A record whose process is gone (a kill, a crash, a power cut) is
//     undone by [grantLedger.recover], which run, doctor and uninstall
//     call; a record of a process still running is left to it.

// aclOps is how the ledger reads and changes a path's access-control
// list: the Windows backend's calls, or a test's stand-in.
type aclOps interface {
	// has reports whether path's list holds, not inherited, the entry
	// e for sid.
	has(path, sid string, e ace) (bool, error)
	// add adds the entry e for sid to path's list.
	add(path, sid string, e ace) error
	// remove removes from path's list the entries for sid that match e
	// (its rights and inheritance) and are not inherited, leaving every
	// other; a path that is gone is no error.
	remove(path, sid string, e ace) error
}

// grantLedger is the ledger in dir for the entries of the container sid.
type grantLedger struct {
	dir string
	sid string
	ops aclOps
	// self is this process, as records name it.
	self procID
	// alive reports whether the process of a record still runs.
	alive func(procID) bool
	log   *slog.Logger
}

// procID names a process across pid reuse: its pid and the time it was
// created (in the system's own unit).
type procID struct {
	PID     int   `json:"pid"`
	Created int64 `json:"created"`
}

// ledgerEntry is one entry a record lists.
type ledgerEntry struct {
	ace
	// Before is true when the entry was on the path before this run and
	// no record listed it: it is not the agent's to remove.
	Before bool `json:"before,omitempty"`
}

// ledgerRecord is the record of one run: its process, its container's
// SID and the entries it applies.
type ledgerRecord struct {
	Proc    procID        `json:"proc"`
	SID     string        `json:"sid"`
	Entries []ledgerEntry `json:"entries"`
	// name is the record's file name.
	name string
}

// ledgerLock is the name of the ledger's lock file; records are named
// after their run and end in ".json".
const ledgerLock = "LOCK"

// entryKey identifies an entry across records.
func entryKey(sid string, e ace) string {
	return sid + "|" + winKey(e.Path) + "|" + string(e.Rights) + "|" + fmt.Sprint(e.Inherit)
}

// lock takes the ledger's lock, waiting for another run or process
// that holds it.
func (l *grantLedger) lock() (*lockfile.Held, error) {
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: the grant ledger %s: %w", l.dir, err)
	}
	h, err := lockfile.LockWait(filepath.Join(l.dir, ledgerLock))
	if err != nil {
		return nil, fmt.Errorf("sandbox: the grant ledger %s: %w", l.dir, err)
	}
	return h, nil
}

// records reads every record of the ledger; one that cannot be read is
// an error (never skipped: its entries would stay).
func (l *grantLedger) records() ([]ledgerRecord, error) {
	des, err := os.ReadDir(l.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: the grant ledger %s: %w", l.dir, err)
	}
	var out []ledgerRecord
	for _, de := range des {
		name := de.Name()
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(l.dir, name))
		if err != nil {
			return nil, fmt.Errorf("sandbox: the grant ledger's record %s: %w", filepath.Join(l.dir, name), err)
		}
		var r ledgerRecord
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("sandbox: the grant ledger's record %s is not whole (%w): the entries it lists were never applied, since a record is written whole before any; remove it", filepath.Join(l.dir, name), err)
		}
		r.name = name
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// listed counts, for each entry key, the records among rs that list it
// as the agent's own (not Before).
func listed(rs []ledgerRecord) map[string]int {
	n := map[string]int{}
	for _, r := range rs {
		for _, e := range r.Entries {
			if !e.Before {
				n[entryKey(r.SID, e.ace)]++
			}
		}
	}
	return n
}

// grantSet is the entries one run applied; release removes them.
type grantSet struct {
	l   *grantLedger
	rec ledgerRecord
}

// apply records the entries es of the run id, then applies them. On
// an error it takes back what it applied and removes the record.
func (l *grantLedger) apply(id string, es []ace) (*grantSet, error) {
	h, err := l.lock()
	if err != nil {
		return nil, err
	}
	defer h.Release()
	rs, err := l.records()
	if err != nil {
		return nil, err
	}
	others := listed(rs)
	rec := ledgerRecord{Proc: l.self, SID: l.sid, name: id + ".json"}
	for _, e := range es {
		on, err := l.ops.has(e.Path, l.sid, e)
		if err != nil {
			return nil, fmt.Errorf("sandbox: reading the access list of %s: %w", e.Path, err)
		}
		rec.Entries = append(rec.Entries, ledgerEntry{ace: e, Before: on && others[entryKey(l.sid, e)] == 0})
	}
	if err := l.write(rec); err != nil {
		return nil, err
	}
	g := &grantSet{l: l, rec: rec}
	for i, e := range rec.Entries {
		if e.Before {
			continue
		}
		if err := l.ops.add(e.Path, l.sid, e.ace); err != nil {
			err = fmt.Errorf("sandbox: granting the container %s on %s: %w", e.Rights, e.Path, err)
			g.rec.Entries = rec.Entries[:i+1]
			if uerr := l.undo(g.rec, others); uerr != nil {
				return nil, errors.Join(err, uerr)
			}
			return nil, err
		}
	}
	return g, nil
}

// write puts the record rec on the disk, whole and synced.
func (l *grantLedger) write(rec ledgerRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	p := filepath.Join(l.dir, rec.name)
	if err := atomicfile.WriteFile(p, b, 0o600); err != nil {
		return fmt.Errorf("sandbox: the grant ledger's record %s: %w", p, err)
	}
	return nil
}

// undo removes the entries of rec that no other record lists (others:
// the counts of every other record), then the record.
func (l *grantLedger) undo(rec ledgerRecord, others map[string]int) error {
	var errs []error
	for _, e := range rec.Entries {
		if e.Before || others[entryKey(rec.SID, e.ace)] > 0 {
			continue
		}
		if err := l.ops.remove(e.Path, rec.SID, e.ace); err != nil {
			errs = append(errs, fmt.Errorf("sandbox: removing the container's %s entry from %s: %w", e.Rights, e.Path, err))
		}
	}
	if len(errs) > 0 {
		// The record stays, for the next start to try again.
		return errors.Join(errs...)
	}
	p := filepath.Join(l.dir, rec.name)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sandbox: the grant ledger's record %s: %w", p, err)
	}
	atomicfile.SyncDir(l.dir)
	return nil
}

// release removes the entries of the run, but those another record
// still lists.
func (g *grantSet) release() error {
	l := g.l
	h, err := l.lock()
	if err != nil {
		return err
	}
	defer h.Release()
	rs, err := l.records()
	if err != nil {
		return err
	}
	var others []ledgerRecord
	for _, r := range rs {
		if r.name != g.rec.name {
			others = append(others, r)
		}
	}
	return l.undo(g.rec, listed(others))
}

// recover removes the entries of every record whose process is gone,
// and the records: what an agent killed during a run left. It returns
// how many records it undid.
func (l *grantLedger) recover() (int, error) {
	if _, err := os.Stat(l.dir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	h, err := l.lock()
	if err != nil {
		return 0, err
	}
	defer h.Release()
	rs, err := l.records()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		if r.Proc == l.self || l.alive(r.Proc) {
			continue
		}
		rest := append(append([]ledgerRecord(nil), rs[:i]...), rs[i+1:]...)
		if err := l.undo(r, listed(rest)); err != nil {
			errs = append(errs, err)
			continue
		}
		if l.log != nil {
			l.log.Warn("sandbox: removed the access entries a run cut short had left", "record", r.name, "pid", r.Proc.PID, "entries", len(r.Entries))
		}
		rs, i, n = rest, i-1, n+1
	}
	return n, errors.Join(errs...)
}
