package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// DefaultRetention is how long the audit log keeps a day's file when no
// retention is set: a year.
const DefaultRetention = 365 * 24 * time.Hour

// Pruned is what [Log.Prune] has removed from the log, in all (it is
// what the log's START file records, for [PrunedFrom] to read).
type Pruned struct {
	// Lines is how many lines (one per invocation) were removed.
	Lines int64 `json:"lines"`
	// Files is how many day files were removed.
	Files int `json:"files"`
	// Before is the first day kept (YYYY-MM-DD, UTC): the lines of the
	// days before it are gone.
	Before string `json:"before"`
	// RetentionDays is the retention that removed the last ones.
	RetentionDays int `json:"retention_days"`
}

// String says what was pruned: "1234 older lines, of the days before
// 2025-12-03, were pruned (retention 365 days)".
func (p Pruned) String() string {
	what, verb := "lines", "were"
	if p.Lines == 1 {
		what, verb = "line", "was"
	}
	return fmt.Sprintf("%d older %s, of the days before %s, %s pruned (retention %d days)", p.Lines, what, p.Before, verb, p.RetentionDays)
}

// PrunedFrom says what was pruned from the audit log in dir; ok is false
// when nothing was.
func PrunedFrom(dir string) (p Pruned, ok bool, err error) {
	note, _, err := chainlog.Pruned(dir)
	if err != nil || note == nil {
		return p, false, err
	}
	if err := json.Unmarshal(note, &p); err != nil {
		return p, false, fmt.Errorf("audit log %s: what was pruned cannot be read: %w", dir, err)
	}
	return p, true, nil
}

// Prune removes from the log the day files of the days that ended more
// than retention before now (by UTC day: a file is removed whole, once
// its whole day is past the retention), never the file holding the
// last line. A file holds no line later than its day, so no line
// younger than the retention is removed. The chain stays checkable:
// the log's START file records the last line removed, which the first
// line kept must follow (chainlog DropBefore), with how many lines were
// removed and of the days before which one, for [Verify]'s callers to
// say ([PrunedFrom]). It returns what was removed now (zero when
// nothing was). A retention of 0 or less removes nothing.
func (l *Log) Prune(retention time.Duration, now time.Time) (Pruned, error) {
	var out Pruned
	if retention <= 0 {
		return out, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	names, err := chainlog.Files(l.dir)
	if err != nil {
		return out, fmt.Errorf("pruning the audit log %s: %w", l.dir, err)
	}
	cutDay := now.Add(-retention).UTC().Format(dayFormat) + chainlog.Ext
	last, _ := l.log.End() // the file of the last line, never removed
	keep := 0              // the first file kept
	for keep < len(names) && names[keep] < cutDay && names[keep] < last {
		keep++
	}
	if keep == 0 || keep == len(names) {
		return out, nil
	}
	first, err := firstSeq(l.dir, names[keep])
	if err != nil {
		return out, fmt.Errorf("pruning the audit log %s: %w", l.dir, err)
	}
	if first <= 1 {
		// The files before it hold no line (a file begun and never
		// written): nothing to account for, and nothing worth removing.
		return out, nil
	}
	prev, wasPruned, err := PrunedFrom(l.dir)
	if err != nil {
		return out, err
	}
	total := Pruned{
		Lines:         first - 1, // lines are numbered from 1
		Files:         prev.Files,
		Before:        strings.TrimSuffix(names[keep], chainlog.Ext),
		RetentionDays: int(retention / (24 * time.Hour)),
	}
	for _, n := range names[:keep] {
		if !wasPruned || n >= prevStart(prev) {
			total.Files++ // not one a crash left behind after it was counted
		}
	}
	if err := l.log.DropBefore(names[keep], total); err != nil {
		return Pruned{}, fmt.Errorf("pruning the audit log: %w", err)
	}
	out = total
	out.Lines -= prev.Lines
	out.Files -= prev.Files
	return out, nil
}

// prevStart is the name of the first file the last prune kept.
func prevStart(p Pruned) string { return p.Before + chainlog.Ext }

// firstSeq is the number of the first complete line of the log file
// name in dir (0 when it has none).
func firstSeq(dir, name string) (int64, error) {
	var seq int64
	stop := errors.New("stop")
	err := chainlog.ReadFile(dir, name, func(line []byte) error {
		var v struct {
			Seq int64 `json:"seq"`
		}
		if json.Unmarshal(line, &v) == nil {
			seq = v.Seq
		}
		return stop
	})
	if err != nil && !errors.Is(err, stop) {
		return 0, err
	}
	return seq, nil
}
