package undo

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/metnos/agent/internal/fspath"
)

// DefaultQuotaPercent is the share of the space free to blobs (free
// space plus what blobs use now) that backup blobs may use when no
// quota is set.
const DefaultQuotaPercent = 10

// Expiry says which backup blobs [Journal.Expire] removes.
type Expiry struct {
	// History is the blob folder, <user data>/_history, holding one
	// folder a turn.
	History string
	// Retention is how long a turn's blobs are kept (30 days, as the
	// Rust client).
	Retention time.Duration
	// Quota caps the blobs' total size in bytes: above 0 it is that;
	// 0 means DefaultQuotaPercent of the free space plus the blobs';
	// below 0, no cap.
	Quota int64
	// Now is the time retention is measured from (zero: now).
	Now time.Time
}

// Expired is one turn folder removed.
type Expired struct {
	Dir    string
	Reason string // "retention" or "quota"
	Bytes  int64
	// IDs are the entries whose blobs these were; Lost those of them
	// still within retention and not undone, whose undo now cannot
	// restore the files their blobs kept.
	IDs, Lost []string
}

// turnDir is one folder of History.
type turnDir struct {
	name  string
	bytes int64
	age   time.Time // the newest of its own time, its blob folder's, its entries'
	fsAge time.Time // the newest of its own time and its blob folder's
	ids   []string
	open  []string // ids not fully undone
}

// Expire removes the turn folders of x.History past retention, then,
// while the blobs are over the quota, more of them: first those whose
// changes are all undone (or unknown to the journal), then the oldest;
// never the newest one. Each removal is recorded in the journal, with
// the changes whose undo it costs. Symbolic links are never followed:
// executors write the history folder, and nothing there is trusted.
func (j *Journal) Expire(x Expiry) ([]Expired, error) {
	if x.Now.IsZero() {
		x.Now = time.Now()
	}
	fi, err := os.Lstat(x.History)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("backup blobs: %w", err)
	case fi.Mode()&os.ModeSymlink != 0:
		// An executor put a link there: remove the link, not its target.
		os.Remove(x.History)
		return nil, fmt.Errorf("backup blobs: %s was a symbolic link (an executor made it?): the link was removed, not what it pointed to", x.History)
	case !fi.IsDir():
		return nil, nil
	}
	root, err := os.OpenRoot(x.History)
	if err != nil {
		return nil, fmt.Errorf("backup blobs: %w", err)
	}
	defer root.Close()
	turns, err := j.turns(root, x.History)
	if err != nil {
		return nil, err
	}
	// The entries in memory (the newest) say which changes use which
	// folder; before a folder is removed, the whole journal is read for
	// those it holds, so that an old change is never missed.
	j.mu.Lock()
	attribute(turns, x.History, j.entries)
	for i := range turns {
		// A folder a whole read found younger than its files say.
		if a := j.turnAge[turns[i].name]; a.After(turns[i].age) {
			turns[i].age = a
		}
	}
	j.mu.Unlock()
	scanned := false
	full := func(ts []turnDir) error {
		if scanned {
			return nil
		}
		scanned = true
		dirs := make([]string, len(ts))
		for i, t := range ts {
			dirs[i] = filepath.Join(x.History, t.name)
		}
		es, err := j.scan(func(e *Entry) bool { return slices.ContainsFunc(dirs, e.usesTurn) })
		if err != nil {
			return err
		}
		j.mu.Lock()
		for i, e := range es {
			if m := j.byID[e.InvocationID]; m != nil {
				es[i] = m // the one in memory may know more
			}
		}
		j.mu.Unlock()
		for i := range ts {
			ts[i].ids, ts[i].open, ts[i].age = nil, nil, ts[i].fsAge
		}
		attribute(ts, x.History, es)
		j.mu.Lock()
		j.turnAge = map[string]time.Time{}
		for _, t := range ts {
			if t.age.After(t.fsAge) {
				j.turnAge[t.name] = t.age // not read whole again for it
			}
		}
		j.mu.Unlock()
		return nil
	}
	var out []Expired
	remove := func(t turnDir, reason string, lost []string) error {
		if err := root.RemoveAll(t.name); err != nil {
			return fmt.Errorf("backup blobs: removing %s: %w", filepath.Join(x.History, t.name), err)
		}
		ex := Expired{Dir: filepath.Join(x.History, t.name), Reason: reason, Bytes: t.bytes, IDs: t.ids, Lost: lost}
		out = append(out, ex)
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.log == nil {
			return nil
		}
		return j.write(record{Kind: kindExpired, Dir: ex.Dir, Reason: reason, Bytes: t.bytes, IDs: t.ids, Lost: lost})
	}
	cut := x.Now.Add(-x.Retention)
	if x.Retention > 0 && slices.ContainsFunc(turns, func(t turnDir) bool { return t.age.Before(cut) }) {
		if err := full(turns); err != nil {
			return nil, err
		}
	}
	var kept []turnDir
	var total int64
	for _, t := range turns {
		if x.Retention > 0 && t.age.Before(cut) {
			if err := remove(t, "retention", nil); err != nil {
				return out, err
			}
			continue
		}
		kept = append(kept, t)
		total += t.bytes
	}
	quota := x.Quota
	if quota == 0 {
		free, err := freeBytes(x.History)
		if err != nil {
			return out, fmt.Errorf("backup blobs: the free space of %s: %w", x.History, err)
		}
		quota = (free + total) * DefaultQuotaPercent / 100
	}
	if quota < 0 || total <= quota || len(kept) < 2 {
		return out, nil
	}
	if err := full(kept); err != nil {
		return out, err
	}
	// Oldest first, those whose undo needs nothing first of all; the
	// newest turn is kept.
	sort.SliceStable(kept, func(a, b int) bool { return kept[a].age.Before(kept[b].age) })
	candidates := slices.Clone(kept[:len(kept)-1])
	sort.SliceStable(candidates, func(a, b int) bool { return len(candidates[a].open) == 0 && len(candidates[b].open) > 0 })
	for _, t := range candidates {
		if total <= quota {
			break
		}
		if err := remove(t, fmt.Sprintf("quota: blobs used %d bytes, more than the %d allowed", total, quota), t.open); err != nil {
			return out, err
		}
		total -= t.bytes
	}
	return out, nil
}

// turns lists History's folders with their size and age on the disk.
func (j *Journal) turns(root *os.Root, history string) ([]turnDir, error) {
	ents, err := fs.ReadDir(root.FS(), ".")
	if err != nil {
		return nil, fmt.Errorf("backup blobs: %w", err)
	}
	var turns []turnDir
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		t := turnDir{name: e.Name()}
		fs.WalkDir(root.FS(), e.Name(), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			if d.IsDir() && info.ModTime().After(t.age) {
				t.age = info.ModTime()
			}
			if info.Mode().IsRegular() {
				t.bytes += info.Size()
			}
			return nil
		})
		t.fsAge = t.age
		turns = append(turns, t)
	}
	return turns, nil
}

// attribute adds to each turn folder the entries that kept blobs in it.
func attribute(turns []turnDir, history string, entries []*Entry) {
	for i := range turns {
		t := &turns[i]
		dir := filepath.Join(history, t.name)
		for _, en := range entries {
			if !en.usesTurn(dir) {
				continue
			}
			t.ids = append(t.ids, en.InvocationID)
			if en.Ended.After(t.age) {
				t.age = en.Ended
			}
			if !en.Interrupted && en.left() > 0 {
				t.open = append(t.open, en.InvocationID)
			}
		}
	}
}

// usesTurn reports whether the entry kept blobs in the turn folder dir.
func (e *Entry) usesTurn(dir string) bool {
	for _, r := range e.Rows {
		if b, _ := r.blob(); b != "" && fspath.Inside(filepath.Clean(b), dir) {
			return true
		}
	}
	return false
}
