package undo

import (
	"path/filepath"
	"slices"

	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/wire"
)

// recognise marks undone the items of earlier entries that e's run put
// back, looking only at the entries whose paths e's rows, created
// folders or arguments name, and hashing with h only files inside their
// grants. Only the entries in memory are looked at: the newest ones
// ([window]) and those still running, so that its cost does not grow
// with the history. A change older than that put back by a run is not
// marked undone by it: a local undo of it finds its steps already done
// (each step looks at the disk first), and says so. j.mu is held.
func (j *Journal) recognise(e *Entry, args any, busy []string, h *hasher) ([]string, error) {
	paths := map[string]bool{}
	add := func(p string) {
		if p != "" {
			paths[filepath.Clean(p)] = true
		}
	}
	for _, r := range e.Rows {
		add(r.Src)
		add(r.Dst)
		add(r.Path)
	}
	for _, d := range e.DirsCreated {
		add(d)
	}
	wire.WalkStrings(args, func(s string) {
		if filepath.IsAbs(s) {
			add(s)
		}
	})
	if len(paths) == 0 {
		return nil, nil
	}
	// What e deleted, rather than moved: a created file or folder that
	// is gone counts as undone only if e removed it (a later move of it
	// is not its undo).
	deleted := map[string]bool{}
	movedAway := map[string]bool{}
	for _, r := range e.Rows {
		if r.Src != "" {
			movedAway[filepath.Clean(r.Src)] = true
		}
	}
	for _, r := range e.Rows {
		if r.Path != "" && r.Src == "" && r.Dst == "" && !r.Created && !r.Skipped && r.PrevBlobPath == "" {
			deleted[filepath.Clean(r.Path)] = true
		}
	}
	wire.WalkStrings(args, func(s string) {
		if filepath.IsAbs(s) && !movedAway[filepath.Clean(s)] {
			deleted[filepath.Clean(s)] = true
		}
	})
	var marked []string
	for _, other := range j.entries {
		if other == e {
			break // only the entries before it
		}
		if !other.Finished || other.left() == 0 || !other.touches(paths) || j.resolve(other) != nil {
			continue
		}
		c := &confinement{roots: other.Roots, masks: other.Masks, resolved: map[string]string{}}
		var items []int
		for i, it := range other.Items {
			if _, ok := other.Undone[i]; ok || it.Kind == Unsupported {
				continue
			}
			if (it.Kind == RemoveFile || it.Kind == RemoveDir) && !deleted[filepath.Clean(it.Path)] {
				continue
			}
			if slices.ContainsFunc(busy, func(b string) bool { return fspath.Within(filepath.Clean(it.target()), b) }) {
				continue // another run still going may be putting it back
			}
			if _, _, _, err := c.locate(it.target()); err != nil {
				continue // a local undo would not touch it either: not looked at
			}
			if st, _ := other.check(i, nil, h); st == done {
				items = append(items, i)
			}
		}
		if len(items) == 0 {
			continue
		}
		if err := j.write(record{Kind: kindUndone, ID: other.InvocationID, Items: items, By: e.InvocationID}); err != nil {
			return marked, err
		}
		marked = append(marked, other.InvocationID)
	}
	return marked, nil
}

// touches reports whether one of the entry's steps names one of paths.
func (e *Entry) touches(paths map[string]bool) bool {
	for _, it := range e.Items {
		for _, p := range []string{it.From, it.To, it.Path, it.Blob} {
			if p != "" && paths[filepath.Clean(p)] {
				return true
			}
		}
	}
	return false
}
