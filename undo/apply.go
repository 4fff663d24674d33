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
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/metnos/agent/internal/fspath"
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
// "before", "written" (a restore's temporary file is complete, not yet
// in place), "after", or, once at the end (item -1), "end".
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
	e, err := j.find(id)
	if err == nil && e != nil {
		err = j.resolve(e)
	}
	j.mu.Unlock()
	switch {
	case err != nil:
		return rep, err
	case e == nil:
		if p, ok, _ := PrunedFrom(j.dir); ok {
			return rep, fmt.Errorf("%s: no such change in the history journal (see `metnos-agent history`); %s", id, p)
		}
		return rep, fmt.Errorf("%s: no such change in the history journal (see `metnos-agent history`)", id)
	case e.Interrupted:
		return rep, fmt.Errorf("%s (%s): %w: the run was cut short by a crash and what it changed is not known", id, e.Executor, ErrNotUndoable)
	case !e.Finished:
		return rep, fmt.Errorf("%s (%s): %w: it is still running", id, e.Executor, ErrNotUndoable)
	case len(e.Reverse) == 0:
		return rep, fmt.Errorf("%s (%s): %w: the executor declares no reverse pattern", id, e.Executor, ErrNotUndoable)
	}
	if err := j.intact(e); err != nil {
		return rep, err
	}
	if !dryRun {
		j.mu.Lock()
		err := j.write(record{Kind: kindUndoStarted, ID: id, By: ByLocal})
		j.mu.Unlock()
		if err != nil {
			return rep, err
		}
	}
	c := &confinement{roots: e.Roots, masks: e.Masks, history: history, dryRun: dryRun, resolved: map[string]string{},
		opened: map[string]*os.Root{}, dirs: map[string]*os.File{}}
	defer c.close()
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
		// Outside the grants or masked: refused before the disk is
		// looked at (the journal did not look there after the run).
		if err := c.confined(it); err != nil {
			rep.Conflicts = append(rep.Conflicts, Conflict{Item: i, Path: it.target(), Why: err.Error()})
			continue
		}
		st, why := e.check(i, gone, nil)
		switch st {
		case done:
			rep.Already++
			items = append(items, i)
			continue
		case conflict:
			if it.Kind == Restore && it.Replace {
				why += c.keepBeside(i, it, dryRun)
			}
			rep.Conflicts = append(rep.Conflicts, Conflict{Item: i, Path: it.target(), Why: why})
			continue
		}
		if it.Kind == Restore {
			blob, err := c.findBlob(it)
			if err != nil {
				rep.Conflicts = append(rep.Conflicts, Conflict{Item: i, Path: it.target(), Why: err.Error()})
				continue
			}
			it.Blob = blob
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
		if err := c.do(i, it); err != nil {
			rep.Conflicts = append(rep.Conflicts, Conflict{Item: i, Path: it.target(), Why: err.Error()})
			continue
		}
		hook(i, "after")
		rep.Done = append(rep.Done, it.Describe())
		items = append(items, i)
	}
	if dryRun {
		return rep, nil
	}
	// The renames reach the disk before the journal says they were made.
	for _, d := range c.dirs {
		d.Sync()
	}
	hook(-1, "end")
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.write(record{Kind: kindUndone, ID: id, Items: items, By: ByLocal, Conflicts: rep.Conflicts}); err != nil {
		return rep, fmt.Errorf("%s: the steps reported were done, but recording them failed, so the history still shows the change as not undone; once the journal is writable, run the undo again (it finds them done): %w", id, err)
	}
	return rep, nil
}

// beside is where a local undo keeps the version of a file from before
// a run, when the file changed since and is not replaced: "notes.txt"
// gives "notes (before the change).txt".
func beside(p string) string {
	ext := filepath.Ext(p)
	if ext == filepath.Base(p) {
		ext = "" // ".bashrc"
	}
	return strings.TrimSuffix(p, ext) + " (before the change)" + ext
}

// keepBeside restores, for an overwritten file that changed since the
// run, the version from before the run next to it ([beside]), so that
// both are kept, and says so in a few words to add to the conflict.
func (c *confinement) keepBeside(i int, it Item, dryRun bool) string {
	side := it
	side.Path, side.Replace, side.Expect, side.ExpectSHA256 = beside(it.Path), false, nil, ""
	fi, err := os.Lstat(side.Path)
	switch {
	case err == nil && fi.Mode().IsRegular() && sha256File(side.Path) == it.BlobSHA256:
		return "; the version from before the run is beside it, " + side.Path
	case err == nil:
		return fmt.Sprintf("; the version from before the run stays in its backup %s (%s is taken)", it.Blob, side.Path)
	}
	blob, err := c.findBlob(it)
	if err == nil {
		side.Blob = blob
		err = c.check(side)
	}
	if err == nil && dryRun {
		return "; the version from before the run would be kept beside it, " + side.Path
	}
	if err == nil {
		err = c.restore(i, side)
	}
	if err != nil {
		return fmt.Sprintf("; the version from before the run could not be kept beside it (%v)", err)
	}
	return "; the version from before the run is kept beside it, " + side.Path
}

// findBlob finds the backup a restore copies back, as the server does:
// the blob the row names, else one named by its SHA-256 in the history
// folder. A row whose blob is gone cannot be restored: an error.
func (c *confinement) findBlob(it Item) (string, error) {
	_, inHistory := historyRel(c.history, it.Blob)
	if inHistory {
		if _, err := os.Lstat(it.Blob); err == nil {
			return it.Blob, nil
		}
	}
	if len(it.BlobSHA256) == 64 && c.history != "" {
		if err := historyNotLink(c.history); err != nil {
			return "", err
		}
		if c.blobs == nil {
			c.blobs = map[string]string{}
			filepath.WalkDir(c.history, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.Type().IsRegular() && len(d.Name()) >= 64 {
					if k := strings.ToLower(d.Name()[:64]); c.blobs[k] == "" {
						c.blobs[k] = p
					}
				}
				return nil
			})
		}
		if p := c.blobs[it.BlobSHA256]; p != "" {
			return p, nil
		}
	}
	switch {
	case it.Blob != "" && !inHistory:
		return "", fmt.Errorf("the backup %s is not in this agent's history folder %s, and no backup with its SHA-256 is: %s is not restored", it.Blob, c.history, it.Path)
	case it.Blob != "":
		return "", fmt.Errorf("the backup %s is gone: %s cannot be restored", it.Blob, it.Path)
	}
	return "", fmt.Errorf("no backup with SHA-256 %s in %s: %s cannot be restored", it.BlobSHA256, c.history, it.Path)
}

// target is the path a step writes or removes.
func (it Item) target() string {
	if it.Kind == MoveBack {
		return it.To
	}
	return it.Path
}

// do performs one pending step, every path opened through the grant
// it lies in.
func (c *confinement) do(i int, it Item) error {
	switch it.Kind {
	case MoveBack:
		from, err := c.open(it.From, false)
		if err != nil {
			return err
		}
		to, err := c.open(it.To, true)
		if err != nil {
			return err
		}
		// The file must still be the one the journal saw (checked again
		// through the folder just opened).
		if st, err := lstatAt(from); err != nil || !sameStat(st, it.Expect) {
			return fmt.Errorf("%s changed since it was moved there: left where it is", it.From)
		}
		if sameFileAt(from, to) {
			// A move by link and unlink that a crash cut between the
			// two: the file is already at To; drop the old name.
			return unlinkAt(from, false)
		}
		return renameNoReplace(from, to)
	case Restore:
		return c.restore(i, it)
	case RemoveFile:
		pl, err := c.open(it.Path, false)
		if err != nil {
			return err
		}
		st, err := lstatAt(pl)
		switch {
		case err == nil && it.Expect == nil && st.Kind == "dir":
			if err := unlinkAt(pl, true); err != nil {
				return fmt.Errorf("%s: not removed: %w", it.Path, err)
			}
			return nil
		case err != nil || !sameStat(st, it.Expect):
			return fmt.Errorf("%s changed since it was created: kept", it.Path)
		}
		return unlinkAt(pl, false)
	case RemoveDir:
		pl, err := c.open(it.Path, false)
		if err != nil {
			return err
		}
		if err := unlinkAt(pl, true); err != nil {
			return fmt.Errorf("%s: not removed: %w", it.Path, err)
		}
		return nil
	}
	return errors.New(it.Why)
}

// restore opens the blob once (from the history folder, no link on the
// way), hashes it whole, and only when the hash is the one the row
// recorded copies that same open file to a temporary file beside Path,
// hashing it again on the way, and renames it into place, never over a
// file; the blob stays where it is. No byte of a blob reaches the
// user's folder before its hash matched.
func (c *confinement) restore(i int, it Item) error {
	if len(it.BlobSHA256) != 64 {
		return fmt.Errorf("the row records no SHA-256 for %s: not restored", it.Blob)
	}
	in, err := openHistoryBlob(c.history, it.Blob)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := verifyOpen(in, it.Blob, it.BlobSHA256); err != nil {
		return err
	}
	to, err := c.open(it.Path, true)
	if err != nil {
		return err
	}
	// A short name of the undo's own, the same for the same target, so
	// that a run killed here leaves something the next run removes (and
	// nothing a user could have named so).
	sum := sha256.Sum256([]byte(it.Path))
	tmpName := ".metnos-undo-" + hex.EncodeToString(sum[:8]) + ".tmp"
	tmp := place{dir: to.dir, name: tmpName, path: filepath.Join(filepath.Dir(it.Path), tmpName)}
	unlinkAt(tmp, false) // what a run killed here left
	out, err := createAt(tmp)
	if err != nil {
		return fmt.Errorf("restoring %s: %w", it.Path, err)
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(out, h), in)
	if err == nil && hex.EncodeToString(h.Sum(nil)) != it.BlobSHA256 {
		err = fmt.Errorf("the backup %s is corrupted (its SHA-256 is %s, the change recorded %s): not restored", it.Blob, hex.EncodeToString(h.Sum(nil)), it.BlobSHA256)
	}
	// The row's mode and times, else the blob's: the shims copy a
	// file's mode and times to its blob (shutil.copy2 upstream).
	mode, mtime, atime := os.FileMode(0o600), it.mtimeNS, it.atimeNS
	if fi, serr := in.Stat(); serr == nil {
		mode = fi.Mode().Perm()
		if mtime == nil {
			ns := fi.ModTime().UnixNano()
			mtime, atime = &ns, &ns
		}
	}
	if it.mode != nil {
		mode = os.FileMode(*it.mode) & os.ModePerm
	}
	if err == nil {
		err = out.Chmod(mode)
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && mtime != nil {
		at := *mtime
		if atime != nil {
			at = *atime
		}
		err = chtimesAt(tmp, time.Unix(0, at), time.Unix(0, *mtime))
	}
	if err == nil {
		hook(i, "written")
		if it.Replace {
			// Only over the file the executor left, looked at again
			// through the folder just opened.
			switch st, serr := lstatAt(to); {
			case errors.Is(serr, fs.ErrNotExist):
				err = renameNoReplace(tmp, to) // removed since: put back
			case serr != nil || !sameStat(st, it.Expect):
				err = fmt.Errorf("%s changed since the run wrote it: not replaced", it.Path)
			default:
				err = renameReplace(tmp, to)
			}
		} else {
			err = renameNoReplace(tmp, to)
		}
	}
	if err != nil {
		unlinkAt(tmp, false)
	}
	return err
}

// place is one entry a step acts on: its folder, opened through the
// grant (Unix; nil on Windows) and kept open for the whole undo, and its
// name in it.
type place struct {
	dir  *os.File
	name string
	path string // for messages, and the entry itself on Windows
}

// confinement says where a local undo may act: inside the original
// invocation's write grants but not under its masks, and, for blobs,
// inside the history folder.
type confinement struct {
	roots   []string
	masks   []string
	history string
	dryRun  bool
	// resolved caches resolve's answers for folders: a large undo
	// checks thousands of files in a few folders.
	resolved map[string]string
	opened   map[string]*os.Root
	dirs     map[string]*os.File // folders opened, by root and relative path
	blobs    map[string]string   // the history folder's files by the SHA-256 they are named by
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

func (c *confinement) close() {
	for _, r := range c.opened {
		r.Close()
	}
	for _, d := range c.dirs {
		d.Close()
	}
}

// check refuses a step that would act outside the folders its change
// was allowed to write, symbolic links resolved, or on a masked path;
// for a restore, a blob outside the history folder or corrupted.
func (c *confinement) check(it Item) error {
	if err := c.confined(it); err != nil {
		return err
	}
	if it.Kind != Restore {
		return nil
	}
	if !c.dryRun {
		// The restore opens, hashes and copies the blob itself.
		if _, ok := historyRel(c.history, it.Blob); !ok {
			return fmt.Errorf("the backup %s is not in this agent's history folder %s: not used", it.Blob, c.history)
		}
		return nil
	}
	return CheckBlob(c.history, it.Blob, it.BlobSHA256)
}

// confined refuses a step whose paths lie outside the grants or on,
// under or holding a mask.
func (c *confinement) confined(it Item) error {
	var paths []string
	switch it.Kind {
	case MoveBack:
		paths = []string{it.From, it.To}
	default:
		paths = []string{it.Path}
	}
	for _, p := range paths {
		if _, _, _, err := c.locate(p); err != nil {
			return err
		}
	}
	return nil
}

// CheckBlob checks a backup blob before it is restored: p must be a
// clean path inside history, reached from it with no symbolic link on
// the way (history itself not a link), a regular file, and have the
// SHA-256 want.
func CheckBlob(history, p, want string) error {
	f, err := openHistoryBlob(history, p)
	if err != nil {
		return err
	}
	defer f.Close()
	return verifyOpen(f, p, want)
}

// historyRel is p relative to the history folder, when p is a clean
// path that lies in it as named, or under the history folder with the
// links of the folders above it resolved. Links below the history
// folder are not resolved: opening refuses them.
func historyRel(history, p string) (string, bool) {
	if history == "" || !clean(p) {
		return "", false
	}
	for _, h := range []string{filepath.Clean(history), resolve(history)} {
		if fspath.Inside(p, h) {
			if rel, err := filepath.Rel(h, p); err == nil && filepath.IsLocal(rel) {
				return rel, true
			}
		}
	}
	return "", false
}

// historyNotLink refuses a history folder that is a symbolic link: it
// lies in a folder executors can write, so the link may be theirs.
func historyNotLink(history string) error {
	if fi, err := os.Lstat(history); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("the history folder %s is a symbolic link, which an executor could have made: no backup is read from it (make it a real folder holding the backups)", history)
	}
	return nil
}

// openHistoryBlob opens the backup p for reading, from the history
// folder down with no symbolic link in any component (the history
// folder itself included), without blocking on a FIFO, and only if it
// is a regular file.
func openHistoryBlob(history, p string) (*os.File, error) {
	rel, ok := historyRel(history, p)
	if !ok {
		return nil, fmt.Errorf("the backup %s is not in this agent's history folder %s: not used", p, history)
	}
	if err := historyNotLink(history); err != nil {
		return nil, err
	}
	base := filepath.Clean(history)
	if !fspath.Inside(p, base) {
		base = resolve(history)
	}
	f, err := openUnder(base, rel, p)
	if err != nil {
		return nil, fmt.Errorf("the backup %s cannot be read (no link is followed in the history folder): %w", p, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("the backup %s is not a regular file: not used", p)
	}
	return f, nil
}

// verifyOpen hashes the open blob f whole, compares with want, and
// rewinds it for the copy.
func verifyOpen(f *os.File, p, want string) error {
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("the backup %s cannot be read: %w", p, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != strings.ToLower(want) {
		return fmt.Errorf("the backup %s is corrupted (its SHA-256 is %s, the change recorded %s): not restored", p, got, want)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("the backup %s cannot be read again: %w", p, err)
	}
	return nil
}

// clean reports whether p is absolute and already in its clean form:
// no "..", ".", doubled or trailing separators, which the kernel would
// read otherwise than a lexical check does (a link followed by ".."
// leaves the folder it seems to be in).
func clean(p string) bool {
	return filepath.IsAbs(p) && filepath.Clean(p) == p && filepath.Base(p) != string(filepath.Separator)
}

// locate finds the grant p lies strictly inside and p's folder
// relative to it, symbolic links resolved. A path equal to a grant is
// refused when the grant is a folder (the run could not move or remove
// it either); a grant that is one file (or a file's place) is acted on
// by that one name, in its folder. A masked path is refused.
func (c *confinement) locate(p string) (root, relDir string, fileGrant bool, err error) {
	if !clean(p) {
		return "", "", false, fmt.Errorf("%q is not a clean absolute path: not touched", p)
	}
	parent := filepath.Dir(p)
	if err := c.unmasked(p, filepath.Join(c.resolve(parent), filepath.Base(p))); err != nil {
		return "", "", false, err
	}
	for _, r := range c.roots {
		rr := c.resolve(r)
		for _, q := range []string{p, filepath.Join(c.resolve(parent), filepath.Base(p))} {
			if q != rr && q != filepath.Clean(r) {
				continue
			}
			if fi, err := os.Stat(rr); err == nil && fi.IsDir() {
				return "", "", false, fmt.Errorf("%s is a granted folder itself, which the run could not move or remove either: not touched", p)
			}
			return filepath.Dir(rr), ".", true, nil
		}
	}
	for _, r := range c.roots {
		rr := c.resolve(r)
		for _, dir := range []string{parent, c.resolve(parent)} {
			if dir == rr || fspath.Inside(dir, rr) {
				rel, _ := filepath.Rel(rr, dir)
				return rr, rel, false, nil
			}
		}
	}
	return "", "", false, fmt.Errorf("%s is outside the folders the change was allowed to write: not touched", p)
}

// unmasked refuses paths that are, or lie under, or hold a masked path
// (moving a folder that holds ~/.ssh moves ~/.ssh), compared without
// case where the file systems usually ignore it (macOS, Windows).
func (c *confinement) unmasked(paths ...string) error {
	for _, m := range c.masks {
		for _, mm := range []string{m, c.resolve(m)} {
			for _, p := range paths {
				switch {
				case withinFold(p, mm):
					return fmt.Errorf("%s is hidden from executors (under %s): not touched", p, m)
				case withinFold(mm, p):
					return fmt.Errorf("%s holds %s, which is hidden from executors: not touched", p, m)
				}
			}
		}
	}
	return nil
}

// withinFold is within, without case on macOS and Windows.
func withinFold(p, dir string) bool {
	if runtime.GOOS == "darwin" || runtime.GOOS == "windows" {
		p, dir = strings.ToLower(p), strings.ToLower(dir)
	}
	return fspath.Within(p, dir)
}

// open opens p's folder through an os.Root of its grant (making the
// folder when create is set), then checks where that folder really is:
// inside the grant, and the entry neither masked nor holding a mask.
// So no link, even one swapped in after the check or made by an
// earlier step of this undo, leads a step elsewhere.
func (c *confinement) open(p string, create bool) (place, error) {
	rr, rel, fileGrant, err := c.locate(p)
	if err != nil {
		return place{}, err
	}
	root := c.opened[rr]
	if root == nil {
		if root, err = os.OpenRoot(rr); err != nil {
			return place{}, fmt.Errorf("opening the folder %s: %w", rr, err)
		}
		c.opened[rr] = root
	}
	if create && rel != "." {
		if err := root.MkdirAll(rel, 0o777); err != nil {
			return place{}, fmt.Errorf("making the folder of %s: %w", p, err)
		}
	}
	key := rr + "\x00" + rel
	pl, ok := place{dir: c.dirs[key], name: filepath.Base(p), path: p}, c.dirs[key] != nil
	if !ok {
		if pl, err = openPlace(root, rel, filepath.Base(p), p); err != nil {
			return place{}, err
		}
		if pl.dir != nil {
			c.dirs[key] = pl.dir
		}
	}
	real, err := realDir(pl)
	if err != nil {
		return place{}, fmt.Errorf("finding where the folder of %s is: %w", p, err)
	}
	full := filepath.Join(real, pl.name)
	switch {
	case fileGrant && full != filepath.Join(rr, filepath.Base(p)):
		return place{}, fmt.Errorf("%s is not where the grant is: not touched", p)
	case !fileGrant && !fspath.Inside(full, rr):
		return place{}, fmt.Errorf("%s is really %s, outside the folders the change was allowed to write: not touched", p, full)
	}
	if fileGrant {
		if !slices.ContainsFunc(c.roots, func(r string) bool { return c.resolve(r) == full }) {
			return place{}, fmt.Errorf("%s is not a granted file: not touched", p)
		}
	}
	return pl, c.unmasked(full)
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

// openBlob opens a file for reading (to hash it): not through a link,
// without blocking on a FIFO, and only if it is a regular file.
func openBlob(p string) (*os.File, error) {
	f, err := openNoFollow(p)
	if err != nil {
		return nil, fmt.Errorf("the backup %s cannot be read: %w", p, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("the backup %s is not a regular file: not used", p)
	}
	return f, nil
}
