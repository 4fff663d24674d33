// Package changes lists what a run changed beneath some folders, in one
// form whether it is read from the upper layer of an overlay the run
// wrote into (a dry run: [FromLayers], Linux) or from two snapshots of
// the folders taken before and after a real run ([Snapshot], [Diff]).
// The two agree: for the same run, the list a dry run's layer gives is
// the list the snapshots of a real run give (package sandbox's tests
// prove it case by case).
//
// What is compared, for every path beneath the folders (the folders
// themselves included): its kind (file, folder, symbolic link, other),
// its permission bits (with the set-user-ID, set-group-ID and sticky
// bits), and for a file its size and SHA-256, for a link its target. A
// path whose kind changed is listed twice, deleted then created.
// Timestamps, owners, extended attributes and the number of hard links
// are not compared: a file only touched, or opened for writing and
// left as it was, is not a change. A folder deleted with what it held
// lists every entry it held.
//
// A deleted file and a created file with the same size and SHA-256 (not
// empty) are taken for one file renamed: one entry, op "renamed", with
// the old path in From. Pairs are made in path order when several files
// share one content. Folders and links are never paired: a folder
// renamed shows as the old folder deleted and the new one created, and
// the files in it as renamed. The list is sorted by path, deleted
// before created at one path.
package changes

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
)

// Op is what happened to a path.
type Op string

// The ops of a [Change].
const (
	Created  Op = "created"
	Modified Op = "modified"
	Deleted  Op = "deleted"
	Renamed  Op = "renamed"
)

// Kind is what a path is: "file", "dir", "symlink" or "other" (a named
// pipe, a socket, a device).
type Kind string

// The kinds of a [Change].
const (
	File    Kind = "file"
	Dir     Kind = "dir"
	Symlink Kind = "symlink"
	Other   Kind = "other"
)

// State is what a path was (a Change's Before) or would be (its After).
type State struct {
	// Size is a file's size in bytes; nil for anything else.
	Size *int64 `json:"size,omitempty"`
	// SHA256 is a file's SHA-256, in hex; "" for anything else, and
	// for a file this process could not read.
	SHA256 string `json:"sha256,omitempty"`
	// Mode is the permission bits, with the set-user-ID (04000),
	// set-group-ID (02000) and sticky (01000) bits, in octal: "0644".
	// Empty for a symbolic link.
	Mode string `json:"mode,omitempty"`
	// Target is a symbolic link's target; "" for anything else.
	Target string `json:"target,omitempty"`
}

// Change is one path's change.
type Change struct {
	// Op is created, modified, deleted or renamed.
	Op Op `json:"op"`
	// Path is the path, absolute: for a renamed file, its new path.
	Path string `json:"path"`
	// From is a renamed file's old path; "" otherwise.
	From string `json:"from,omitempty"`
	// Kind is what the path is (for deleted, what it was).
	Kind Kind `json:"kind"`
	// Before is what the path was, nil when it was created; After what
	// it is or would be, nil when it was deleted.
	Before *State `json:"before,omitempty"`
	After  *State `json:"after,omitempty"`
	// LinksOutside, for a file modified in a dry run, counts the names
	// of the same file (hard links) that lie outside the folders
	// listed: a real run changes the file under those names too.
	LinksOutside int `json:"links_outside,omitempty"`
}

// Entry is one path of a [Snapshot]: its kind and state, and the
// identity of the file (device, inode, link count), which the list
// itself does not compare.
type Entry struct {
	Kind  Kind
	State State
	Dev   uint64
	Ino   uint64
	Nlink uint64
}

// same reports whether a and b are the same as far as a change goes:
// kind, mode, and content or target.
func same(a, b Entry) bool {
	if a.Kind != b.Kind || a.State.Mode != b.State.Mode || a.State.Target != b.State.Target || a.State.SHA256 != b.State.SHA256 {
		return false
	}
	if (a.State.Size == nil) != (b.State.Size == nil) {
		return false
	}
	return a.State.Size == nil || *a.State.Size == *b.State.Size
}

// Snapshot is every path beneath the folders it was taken of, by
// absolute path.
type Snapshot map[string]Entry

// Take snapshots each root (a folder or a file, absolute) and all it
// holds, following no symbolic link: a link is recorded as a link. A
// root that does not exist adds nothing.
func Take(roots ...string) (Snapshot, error) {
	s := Snapshot{}
	for _, root := range roots {
		root = filepath.Clean(root)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == root && errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			e, err := lstat(p)
			if err != nil {
				return err
			}
			s[p] = e
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("changes: snapshot of %s: %w", root, err)
		}
	}
	return s, nil
}

// Diff lists what changed from before to after, for every path either
// holds, paired and sorted as the package doc says.
func Diff(before, after Snapshot) []Change {
	var out []Change
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			out = append(out, deleted(p, b))
		case a.Kind != b.Kind:
			out = append(out, deleted(p, b), created(p, a))
		case !same(a, b):
			out = append(out, modified(p, b, a))
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			out = append(out, created(p, a))
		}
	}
	return Finish(out)
}

func created(p string, a Entry) Change {
	st := a.State
	return Change{Op: Created, Path: p, Kind: a.Kind, After: &st}
}

func deleted(p string, b Entry) Change {
	st := b.State
	return Change{Op: Deleted, Path: p, Kind: b.Kind, Before: &st}
}

func modified(p string, b, a Entry) Change {
	bs, as := b.State, a.State
	return Change{Op: Modified, Path: p, Kind: a.Kind, Before: &bs, After: &as}
}

// opOrder sorts the changes of one path: deleted first.
var opOrder = map[Op]int{Deleted: 0, Renamed: 1, Modified: 2, Created: 3}

// Finish pairs the deleted and created files of cs into renames and
// sorts the list (see the package doc). Diff and FromLayers end with
// it; it is exported for the lists made some other way.
func Finish(cs []Change) []Change {
	// Sorted first, so that pairs are made in path order.
	sortChanges(cs)
	key := func(c Change, s *State) string {
		if c.Kind != File || s == nil || s.Size == nil || *s.Size == 0 || s.SHA256 == "" {
			return ""
		}
		return fmt.Sprintf("%d:%s", *s.Size, s.SHA256)
	}
	gone := map[string][]int{}
	for i, c := range cs {
		if c.Op == Deleted {
			if k := key(c, c.Before); k != "" {
				gone[k] = append(gone[k], i)
			}
		}
	}
	drop := map[int]bool{}
	for i, c := range cs {
		if c.Op != Created {
			continue
		}
		k := key(c, c.After)
		if k == "" || len(gone[k]) == 0 {
			continue
		}
		j := gone[k][0]
		gone[k] = gone[k][1:]
		cs[i] = Change{Op: Renamed, Path: c.Path, From: cs[j].Path, Kind: File, Before: cs[j].Before, After: c.After}
		drop[j] = true
	}
	out := cs[:0]
	for i, c := range cs {
		if !drop[i] {
			out = append(out, c)
		}
	}
	sortChanges(out)
	return out
}

func sortChanges(cs []Change) {
	slices.SortStableFunc(cs, func(a, b Change) int {
		if c := cmp.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return cmp.Compare(opOrder[a.Op], opOrder[b.Op])
	})
}

// Relative returns cs with every path made relative to root (with a
// leading "/", root itself "/"): for comparing the lists of two trees
// that hold the same files in different places.
func Relative(cs []Change, root string) []Change {
	rel := func(p string) string {
		if p == "" {
			return ""
		}
		r := strings.TrimPrefix(p, root)
		if r == "" {
			return "/"
		}
		return r
	}
	out := make([]Change, len(cs))
	for i, c := range cs {
		c.Path, c.From = rel(c.Path), rel(c.From)
		out[i] = c
	}
	return out
}

// hashFile returns the hex SHA-256 of what r holds.
func hashFile(r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
