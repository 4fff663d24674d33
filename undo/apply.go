package undo

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Report is what a local undo did.
type Report struct {
	InvocationID string
	DryRun       bool
	// Done are the steps done now (or, in a dry run, that would be).
	Done []string
	// Already counts the steps found already done.
	Already int
	// Conflicts are the steps left as they were, and why.
	Conflicts []Conflict
	// Unsupported are the steps no local undo can do.
	Unsupported []string
}

// ErrNotUndoable is returned for an entry a local undo cannot work on.
var ErrNotUndoable = errors.New("cannot be undone here")

// stepHook, when set (by tests), is called around each step: phase is
// "before", "linked" (a move or restore is in place under both names)
// or "after".
var stepHook func(item int, phase string)

func hook(i int, phase string) {
	if stepHook != nil {
		stepHook(i, phase)
	}
}

// Undo puts back the changes of one entry on this device: its steps in
// order, each checked against the disk first (see the package doc for
// what is guaranteed). history is the agent's backup blob folder now:
// blobs are read only from inside it. The journal records that the
// undo began and, at the end, what it put back and what it left.
func (j *Journal) Undo(id, history string, dryRun bool) (Report, error) {
	rep := Report{InvocationID: id, DryRun: dryRun}
	j.mu.Lock()
	e := j.byID[id]
	j.mu.Unlock()
	switch {
	case e == nil:
		return rep, fmt.Errorf("%s: no such change in the history journal (see `metnos-agent history`)", id)
	case e.Interrupted:
		return rep, fmt.Errorf("%s (%s): %w: the run was cut short by a crash and what it changed is not known", id, e.Executor, ErrNotUndoable)
	case !e.Finished:
		return rep, fmt.Errorf("%s (%s): %w: it is still running", id, e.Executor, ErrNotUndoable)
	case len(e.Reverse) == 0:
		return rep, fmt.Errorf("%s (%s): %w: the executor declares no reverse pattern", id, e.Executor, ErrNotUndoable)
	}
	if !dryRun {
		j.mu.Lock()
		err := j.write(record{Kind: kindUndoStarted, ID: id, By: ByLocal})
		j.mu.Unlock()
		if err != nil {
			return rep, err
		}
	}
	c := &confinement{roots: e.Roots, history: history, resolved: map[string]string{}}
	touched := map[string]bool{}
	gone := map[string]bool{} // in a dry run: what the steps before would have moved away
	var items []int
	for i, it := range e.Items {
		if it.Kind == Unsupported {
			rep.Unsupported = append(rep.Unsupported, it.Describe())
			continue
		}
		if _, ok := e.Undone[i]; ok {
			rep.Already++
			continue
		}
		st, why := e.check(i, gone)
		switch st {
		case done:
			rep.Already++
			items = append(items, i)
			continue
		case conflict:
			rep.Conflicts = append(rep.Conflicts, Conflict{Item: i, Path: it.target(), Why: why})
			continue
		}
		if err := c.check(it); err != nil {
			rep.Conflicts = append(rep.Conflicts, Conflict{Item: i, Path: it.target(), Why: err.Error()})
			continue
		}
		if dryRun {
			rep.Done = append(rep.Done, it.Describe())
			switch it.Kind {
			case MoveBack:
				gone[it.From] = true
			case RemoveFile, RemoveDir:
				gone[it.Path] = true
			}
			continue
		}
		hook(i, "before")
		if err := do(i, it); err != nil {
			rep.Conflicts = append(rep.Conflicts, Conflict{Item: i, Path: it.target(), Why: err.Error()})
			continue
		}
		hook(i, "after")
		rep.Done = append(rep.Done, it.Describe())
		items = append(items, i)
		touched[filepath.Dir(it.target())] = true
		if it.Kind == MoveBack {
			touched[filepath.Dir(it.From)] = true
		}
	}
	if dryRun {
		return rep, nil
	}
	for d := range touched {
		syncDir(d)
	}
	hook(-1, "end")
	j.mu.Lock()
	defer j.mu.Unlock()
	return rep, j.write(record{Kind: kindUndone, ID: id, Items: items, By: ByLocal, Conflicts: rep.Conflicts})
}

// target is the path a step writes or removes.
func (it Item) target() string {
	if it.Kind == MoveBack {
		return it.To
	}
	return it.Path
}

// do performs one pending step.
func do(i int, it Item) error {
	switch it.Kind {
	case MoveBack:
		return moveBack(i, it)
	case Restore:
		return restore(i, it)
	case RemoveFile:
		return os.Remove(it.Path)
	case RemoveDir:
		if err := os.Remove(it.Path); err != nil {
			return fmt.Errorf("%s: not removed: %w", it.Path, err)
		}
		return nil
	}
	return errors.New(it.Why)
}

// moveBack moves From to To without ever replacing a file at To: a
// hard link, then the removal of From (a crash between the two leaves
// both names of one file, which the next run finishes). A folder, or a
// file system without hard links, is renamed after checking To is free.
func moveBack(i int, it Item) error {
	if err := os.MkdirAll(filepath.Dir(it.To), 0o777); err != nil {
		return fmt.Errorf("making the folder to move %s back into: %w", it.From, err)
	}
	from, err := os.Lstat(it.From)
	if err != nil {
		return err
	}
	if to, err := os.Lstat(it.To); err == nil {
		if !os.SameFile(from, to) {
			return fmt.Errorf("%s is taken by another file: not replaced", it.To)
		}
	} else if from.IsDir() {
		return renameFree(it.From, it.To)
	} else if err := os.Link(it.From, it.To); err != nil {
		switch {
		case errors.Is(err, fs.ErrExist):
			return fmt.Errorf("%s is taken by another file: not replaced", it.To)
		case isCrossDevice(err):
			return fmt.Errorf("%s and %s are on different file systems: not moved back here", it.From, it.To)
		case errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EMLINK):
			return renameFree(it.From, it.To)
		}
		return fmt.Errorf("moving %s back: %w", it.From, err)
	}
	hook(i, "linked")
	if err := os.Remove(it.From); err != nil {
		return fmt.Errorf("moving %s back: removing the old name: %w", it.From, err)
	}
	return nil
}

// renameFree renames from to to when nothing is at to.
func renameFree(from, to string) error {
	if _, err := os.Lstat(to); err == nil {
		return fmt.Errorf("%s is taken: not replaced", to)
	}
	if err := os.Rename(from, to); err != nil {
		if isCrossDevice(err) {
			return fmt.Errorf("%s and %s are on different file systems: not moved back here", from, to)
		}
		return fmt.Errorf("moving %s back: %w", from, err)
	}
	return nil
}

// restore copies the blob to a temporary file beside Path, hashing it
// on the way, and links it into place only if the hash is the one the
// row recorded; the blob stays where it is.
func restore(i int, it Item) error {
	if len(it.BlobSHA256) != 64 {
		return fmt.Errorf("the row records no SHA-256 for %s: not restored", it.Blob)
	}
	if err := os.MkdirAll(filepath.Dir(it.Path), 0o777); err != nil {
		return fmt.Errorf("making the folder to restore %s into: %w", it.Path, err)
	}
	in, err := openNoFollow(it.Blob)
	if err != nil {
		return fmt.Errorf("the backup of %s is gone: %w", it.Path, err)
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("the backup %s is not a regular file: not restored", it.Blob)
	}
	tmp := filepath.Join(filepath.Dir(it.Path), "."+filepath.Base(it.Path)+".metnos-undo")
	mode := os.FileMode(0o600)
	if it.mode != nil {
		mode = os.FileMode(*it.mode) & os.ModePerm
	}
	os.Remove(tmp) // what a run killed here left
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("restoring %s: %w", it.Path, err)
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(out, h), in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && hex.EncodeToString(h.Sum(nil)) != it.BlobSHA256 {
		err = fmt.Errorf("the backup %s is corrupted (its SHA-256 is %s, the change recorded %s): not restored", it.Blob, hex.EncodeToString(h.Sum(nil)), it.BlobSHA256)
	}
	if err == nil {
		err = os.Chmod(tmp, mode)
	}
	if err == nil && it.mtimeNS != nil {
		atime := time.Unix(0, *it.mtimeNS)
		if it.atimeNS != nil {
			atime = time.Unix(0, *it.atimeNS)
		}
		err = os.Chtimes(tmp, atime, time.Unix(0, *it.mtimeNS))
	}
	if err == nil {
		hook(i, "linked")
		if err = os.Link(tmp, it.Path); errors.Is(err, fs.ErrExist) {
			err = fmt.Errorf("%s is taken by another file: not replaced (the backup stays at %s)", it.Path, it.Blob)
		} else if err != nil && !isCrossDevice(err) {
			err = renameFree(tmp, it.Path)
		}
	}
	os.Remove(tmp)
	return err
}

// confinement says where a local undo may act: inside the original
// invocation's write grants, and, for blobs, inside the history folder.
type confinement struct {
	roots   []string
	history string
	// resolved caches resolve's answers for folders: a large undo
	// checks thousands of files in a few folders.
	resolved map[string]string
}

// resolve is the package's resolve, cached for the folders of one undo.
func (c *confinement) resolve(p string) string {
	if r, ok := c.resolved[p]; ok {
		return r
	}
	r := resolve(p)
	c.resolved[p] = r
	return r
}

// check refuses a step that would act outside the folders its change
// was allowed to write, symbolic links resolved.
func (c *confinement) check(it Item) error {
	var paths []string
	switch it.Kind {
	case MoveBack:
		paths = []string{it.From, it.To}
	default:
		paths = []string{it.Path}
	}
	for _, p := range paths {
		if !c.inRoots(p) {
			return fmt.Errorf("%s is outside the folders the change was allowed to write: not touched", p)
		}
	}
	if it.Kind != Restore {
		return nil
	}
	if c.history == "" || !inside(filepath.Join(c.resolve(filepath.Dir(it.Blob)), filepath.Base(it.Blob)), c.resolve(c.history)) {
		return fmt.Errorf("the backup %s is not in this agent's history folder: not used", it.Blob)
	}
	return VerifyBlob(it.Blob, it.BlobSHA256)
}

// VerifyBlob checks that the backup blob at p (not a symbolic link) has
// the SHA-256 want, and says what is wrong otherwise.
func VerifyBlob(p, want string) error {
	f, err := openNoFollow(p)
	if err != nil {
		return fmt.Errorf("the backup %s cannot be read: %w", p, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("the backup %s is not a regular file: not used", p)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("the backup %s cannot be read: %w", p, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != strings.ToLower(want) {
		return fmt.Errorf("the backup %s is corrupted (its SHA-256 is %s, the change recorded %s): not restored", p, got, want)
	}
	return nil
}

// inRoots reports whether p, its folder's symbolic links resolved, lies
// in (or is) one of the roots.
func (c *confinement) inRoots(p string) bool {
	if !filepath.IsAbs(p) {
		return false
	}
	q := filepath.Join(c.resolve(filepath.Dir(p)), filepath.Base(p))
	for _, r := range c.roots {
		if root := c.resolve(r); inside(q, root) || q == root {
			return true
		}
	}
	return false
}

// resolve resolves the symbolic links of p's deepest existing folder
// and keeps the rest as named.
func resolve(p string) string {
	p = filepath.Clean(p)
	rest := ""
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(p, rest)
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}

// inside reports whether p lies strictly below dir.
func inside(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
