package changes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Layer is one folder a dry run put behind an overlay: the real folder
// (Lower), left as it was, and the overlay's upper layer (Upper), which
// holds what the run wrote in its stead.
//
// The overlay must have been mounted with the userxattr option (the
// only way a process without privileges in the initial user namespace
// can mount one, and the way package sandbox mounts it): an upper
// layer then marks a deleted entry with a whiteout, a character device
// 0/0 of the deleted name, and a folder whose entries below hide the
// lower folder's (it was deleted and made again) with the extended
// attribute user.overlay.opaque "y". Redirects (a folder of the lower
// layer renamed) are not made with userxattr: the overlay refuses such
// a rename (EXDEV), as between two file systems.
type Layer struct {
	Lower, Upper string
	// Unlisted keeps the layer's changes out of the list (the agent's
	// own folders); its files still count as names of a file with
	// several hard links.
	Unlisted bool
}

// FromLayers lists what the runs that wrote the upper layers of ls
// changed, as a real run would have changed the lower folders: each
// upper entry is compared with the lower entry of the same path, a
// whiteout deletes the lower entry (and all it held), and an opaque
// folder deletes every lower entry beneath it that the upper folder
// does not hold.
//
// A file written through one of its hard links is copied up alone, so
// its other names keep the old bytes in the layer; a real run changes
// the file under every name. So a file modified whose lower file has
// several links gets its other names beneath the lower folders listed
// modified too, with the same after, and LinksOutside counts the names
// found nowhere beneath them. The lower folders must not change while
// FromLayers reads them, and no process may still write the upper
// layers.
func FromLayers(ls []Layer) ([]Change, error) {
	var items []item
	touched := map[string]bool{}
	for _, l := range ls {
		w := &walker{lower: filepath.Clean(l.Lower), upper: filepath.Clean(l.Upper), listed: !l.Unlisted}
		if err := w.dir("", false); err != nil {
			return nil, fmt.Errorf("changes: reading the layer of %s: %w", l.Lower, err)
		}
		items = append(items, w.items...)
	}
	for _, it := range items {
		touched[it.c.Path] = true
	}
	items, err := hardLinks(ls, items, touched)
	if err != nil {
		return nil, err
	}
	var out []Change
	for _, it := range items {
		if it.listed {
			out = append(out, it.c)
		}
	}
	return Finish(out), nil
}

// item is one change with what the list leaves out: the lower entry it
// replaced, and whether its layer is listed.
type item struct {
	c      Change
	lower  Entry
	listed bool
}

// walker reads one layer.
type walker struct {
	lower, upper string
	listed       bool
	items        []item
}

func (w *walker) add(c Change, lower Entry) {
	w.items = append(w.items, item{c: c, lower: lower, listed: w.listed})
}

func join(root, rel string) string {
	if rel == "" {
		return root
	}
	return root + "/" + rel
}

// lowerEntry is the lower entry at rel, ok false when there is none (a
// folder on the way is missing, is a file or is a symbolic link: a
// snapshot walks through none of them either).
func (w *walker) lowerEntry(rel string) (Entry, bool, error) {
	e, err := lstat(join(w.lower, rel))
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		return Entry{}, false, nil
	case err != nil:
		return Entry{}, false, err
	}
	return e, true, nil
}

// upperEntry is the upper entry at rel, and whether it is a whiteout.
// The upper layer is the caller's (a dry run's scratch folder): a file
// or folder the run left unreadable to its owner is made readable
// first, its mode read before.
func (w *walker) upperEntry(rel string) (Entry, bool, error) {
	p := join(w.upper, rel)
	e, st, err := lstatRaw(p)
	if err != nil {
		return Entry{}, false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
		return e, true, nil
	}
	if e.Kind == File && e.State.SHA256 == "" && st.Mode&0o400 == 0 {
		if err := unix.Fchmodat(unix.AT_FDCWD, p, st.Mode&0o7777|0o400, 0); err == nil {
			if again, _, err := lstatRaw(p); err == nil {
				e.State.SHA256 = again.State.SHA256
			}
		}
	}
	return e, false, nil
}

// readUpperDir lists an upper folder, making it readable to its owner
// first when the run left it not.
func readUpperDir(p string) ([]string, error) {
	names, err := readNames(p)
	if errors.Is(err, fs.ErrPermission) {
		if unix.Fchmodat(unix.AT_FDCWD, p, 0o700, 0) == nil {
			names, err = readNames(p)
		}
	}
	return names, err
}

// readNames lists the folder p, following no symbolic link on the
// way.
func readNames(p string) ([]string, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return f.Readdirnames(-1)
}

// opaque reports whether the upper folder p hides the lower folder's
// entries: user.overlay.opaque "y" (trusted.overlay.opaque, which a
// mount without userxattr would write, is read too).
func opaque(p string) bool {
	buf := make([]byte, 8)
	for _, attr := range []string{"user.overlay.opaque", "trusted.overlay.opaque"} {
		if n, err := unix.Lgetxattr(p, attr, buf); err == nil && string(buf[:n]) == "y" {
			return true
		}
	}
	return false
}

// dir compares the upper folder at rel with the lower entry of that
// path; hidden says that an upper folder above is opaque, so that the
// lower entries beneath rel are hidden whatever rel's own mark.
func (w *walker) dir(rel string, hidden bool) error {
	names, err := readUpperDir(join(w.upper, rel))
	if err != nil {
		return err
	}
	hidden = hidden || opaque(join(w.upper, rel))
	held := map[string]bool{}
	for _, name := range names {
		r := name
		if rel != "" {
			r = rel + "/" + name
		}
		held[name] = true
		u, whiteout, err := w.upperEntry(r)
		if err != nil {
			return err
		}
		l, hasLower, err := w.lowerEntry(r)
		if err != nil {
			return err
		}
		p := join(w.lower, r)
		switch {
		case whiteout:
			if hasLower {
				if err := w.deletedTree(r, l); err != nil {
					return err
				}
			}
			continue
		case !hasLower:
			w.add(created(p, u), Entry{})
		case l.Kind != u.Kind:
			if err := w.deletedTree(r, l); err != nil {
				return err
			}
			w.add(created(p, u), Entry{})
		case !same(l, u):
			w.add(modified(p, l, u), l)
		}
		if u.Kind == Dir {
			// A folder that is new, or replaced a file, hides nothing
			// below it but what the lower layer does not have.
			if err := w.dir(r, hidden || !hasLower || l.Kind != Dir); err != nil {
				return err
			}
		}
	}
	if rel == "" {
		u, _, err := w.upperEntry("")
		if err != nil {
			return err
		}
		if l, ok, err := w.lowerEntry(""); err != nil {
			return err
		} else if ok && l.Kind == Dir && !same(l, u) {
			w.add(modified(w.lower, l, u), l)
		}
	}
	if !hidden {
		return nil
	}
	l, ok, err := w.lowerEntry(rel)
	if err != nil || !ok || l.Kind != Dir {
		return err
	}
	lower, err := readNames(join(w.lower, rel))
	if err != nil {
		return err
	}
	for _, name := range lower {
		if held[name] {
			continue
		}
		r := name
		if rel != "" {
			r = rel + "/" + name
		}
		e, ok, err := w.lowerEntry(r)
		if err != nil {
			return err
		}
		if ok {
			if err := w.deletedTree(r, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// deletedTree adds the lower entry e at rel, and all it holds, as
// deleted.
func (w *walker) deletedTree(rel string, e Entry) error {
	w.add(deleted(join(w.lower, rel), e), e)
	if e.Kind != Dir {
		return nil
	}
	names, err := readNames(join(w.lower, rel))
	if err != nil {
		return err
	}
	for _, name := range names {
		r := rel + "/" + name
		c, ok, err := w.lowerEntry(r)
		if err != nil {
			return err
		}
		if ok {
			if err := w.deletedTree(r, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// hardLinks adds, for each file modified whose lower file has several
// links, its other names beneath the lower folders as modified (unless
// the run changed them itself: touched), and counts in LinksOutside the
// names found nowhere beneath them.
func hardLinks(ls []Layer, items []item, touched map[string]bool) ([]item, error) {
	type key struct{ dev, ino uint64 }
	want := map[key]bool{}
	for _, it := range items {
		if it.c.Op == Modified && it.c.Kind == File && it.lower.Nlink > 1 {
			want[key{it.lower.Dev, it.lower.Ino}] = true
		}
	}
	if len(want) == 0 {
		return items, nil
	}
	names := map[key][]string{}
	listed := map[string]bool{}
	for _, l := range ls {
		root := filepath.Clean(l.Lower)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrPermission) {
					return fs.SkipDir
				}
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			// Only the inode is wanted: no file is read (lstat hashes).
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return nil
			}
			if k := (key{uint64(st.Dev), st.Ino}); want[k] {
				names[k] = append(names[k], p)
				listed[p] = !l.Unlisted
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("changes: looking for the other names of the files modified in %s: %w", root, err)
		}
	}
	n := len(items)
	for i := 0; i < n; i++ {
		it := items[i]
		if it.c.Op != Modified || it.c.Kind != File || it.lower.Nlink <= 1 {
			continue
		}
		k := key{it.lower.Dev, it.lower.Ino}
		found := names[k]
		outside := int(it.lower.Nlink) - len(found)
		if outside < 0 {
			outside = 0
		}
		items[i].c.LinksOutside = outside
		for _, q := range found {
			if q == it.c.Path || touched[q] {
				continue
			}
			touched[q] = true
			bs, as := *it.c.Before, *it.c.After
			items = append(items, item{c: Change{Op: Modified, Path: q, Kind: File, Before: &bs, After: &as, LinksOutside: outside}, lower: it.lower, listed: listed[q]})
		}
	}
	return items, nil
}
