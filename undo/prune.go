package undo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// DefaultRetention is how long the journal keeps a change when no
// retention is set: a year.
const DefaultRetention = 365 * 24 * time.Hour

// Pruned is what [Journal.Prune] has removed from the journal, in all.
type Pruned struct {
	// Entries is how many changes were removed.
	Entries int `json:"entries"`
	// Before is the time of the newest record removed: every change
	// recorded before it is gone.
	Before time.Time `json:"before"`
	// RetentionDays is the retention that removed the last ones.
	RetentionDays int `json:"retention_days"`
}

// String says what was pruned: "12 older changes before 2025-01-31
// were pruned (retention 365 days)".
func (p Pruned) String() string {
	what := "changes"
	if p.Entries == 1 {
		what = "change"
	}
	return fmt.Sprintf("%d older %s before %s %s pruned (retention %d days)", p.Entries, what, p.Before.Local().Format(time.DateOnly),
		map[bool]string{true: "was", false: "were"}[p.Entries == 1], p.RetentionDays)
}

// PrunedFrom says what was pruned from the journal in dir; ok is false
// when nothing was.
func PrunedFrom(dir string) (p Pruned, ok bool, err error) {
	note, _, err := chainlog.Pruned(dir)
	if err != nil || note == nil {
		return p, false, err
	}
	if err := json.Unmarshal(note, &p); err != nil {
		return p, false, fmt.Errorf("history journal %s: what was pruned cannot be read: %w", dir, err)
	}
	return p, true, nil
}

// Prune removes from the journal the segments whose every record is
// older than retention (measured from now), oldest first, never the
// segment being written nor one holding an entry still running. The
// chain stays checkable: the journal's START file records the last
// line removed, which the first line kept must follow (chainlog
// DropBefore), with how many changes were removed and up to when, for
// `history` to say. The agent keeps the journal at least as long as
// the backup blobs (what the server's undo can still ask for). It
// returns what was removed now (zero when nothing was).
func (j *Journal) Prune(retention time.Duration, now time.Time) (Pruned, error) {
	var out Pruned
	if retention <= 0 {
		return out, nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.log == nil {
		return out, errors.New("history journal: opened read-only")
	}
	names, err := chainlog.Files(j.dir)
	if err != nil {
		return out, fmt.Errorf("history journal: %w", err)
	}
	running := map[string]bool{} // segments holding a running entry's begin
	for _, e := range j.entries {
		if !e.Finished && !e.Interrupted && len(e.recs) > 0 {
			running[e.recs[0].file] = true
		}
	}
	cut := now.Add(-retention)
	keep := 0 // the first segment kept
	var before time.Time
	for i := 0; i < len(names)-1 && !running[names[i]]; i++ {
		last, err := chainlog.LastLine(j.dir, names[i])
		if err != nil {
			return out, fmt.Errorf("history journal: %w", err)
		}
		var r record
		if last != nil && (json.Unmarshal(last, &r) != nil || !r.Time.Before(cut)) {
			break
		}
		keep = i + 1
		if !r.Time.IsZero() {
			before = r.Time
		}
	}
	if keep == 0 {
		return out, nil
	}
	for _, name := range names[:keep] {
		err := chainlog.ReadFile(j.dir, name, func(line []byte) error {
			if bytes.Contains(line, []byte(`"kind":"begin"`)) {
				out.Entries++
			}
			return nil
		})
		if err != nil {
			return Pruned{}, fmt.Errorf("history journal: %w", err)
		}
	}
	out.Before, out.RetentionDays = before, int(retention/(24*time.Hour))
	total := out
	if p, ok, _ := PrunedFrom(j.dir); ok {
		total.Entries += p.Entries
	}
	if err := j.log.DropBefore(names[keep], total); err != nil {
		return Pruned{}, fmt.Errorf("history journal: %w", err)
	}
	// What is in memory of the segments removed goes too.
	kept := j.entries[:0]
	for _, e := range j.entries {
		if len(e.recs) > 0 && e.recs[0].file < names[keep] {
			delete(j.byID, e.InvocationID)
			continue
		}
		kept = append(kept, e)
	}
	clear(j.entries[len(kept):])
	j.entries = kept
	return out, nil
}
