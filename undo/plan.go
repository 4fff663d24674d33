package undo

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// ByLocal is what a local undo records as the one that undid an item.
const ByLocal = "local"

// The kinds of undo step.
const (
	// MoveBack moves the file at From back to To (swap_src_dst).
	MoveBack = "move_back"
	// Restore copies the backup blob back to Path (restore_blob_backup).
	Restore = "restore"
	// RemoveFile removes a file the change created (delete_created_paths).
	RemoveFile = "remove_file"
	// RemoveDir removes a folder the change created, when empty
	// (delete_created_dirs, delete_created_paths).
	RemoveDir = "remove_dir"
	// Unsupported is a reverse pattern, or a row, no local undo can do.
	Unsupported = "unsupported"
)

// Item is one step of an entry's undo.
type Item struct {
	Kind    string `json:"kind"`
	Pattern string `json:"pattern"`
	// Row is the index of the result row it comes from (-1 for a folder).
	Row int `json:"row"`
	// From and To: MoveBack moves From to To.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// Path: what Restore writes, RemoveFile and RemoveDir remove.
	Path string `json:"path,omitempty"`
	// Blob and BlobSHA256: the backup a Restore copies back.
	Blob       string `json:"blob,omitempty"`
	BlobSHA256 string `json:"blob_sha256,omitempty"`
	// Expect is the file MoveBack moves, RemoveFile removes, or a
	// Replace restore replaces, as the journal saw it after the change.
	Expect *Stat `json:"expect,omitempty"`
	// Replace marks the restore of a file overwritten in place: the
	// backup goes back over the file only while it is still what the
	// executor left (Expect, and ExpectSHA256 its SHA-256).
	Replace      bool   `json:"replace,omitempty"`
	ExpectSHA256 string `json:"expect_sha256,omitempty"`
	// After is the index of the MoveBack that must come first (a
	// restore into the place a moved file is moved out of), or -1.
	After int `json:"after"`
	// Why says why an Unsupported item cannot be done.
	Why string `json:"why,omitempty"`

	mode             *uint32
	mtimeNS, atimeNS *int64
}

// Describe is the item in a few words.
func (it Item) Describe() string {
	switch it.Kind {
	case MoveBack:
		return fmt.Sprintf("move %s back to %s", it.From, it.To)
	case Restore:
		if it.Replace {
			return fmt.Sprintf("put back the version of %s from before the run", it.Path)
		}
		return fmt.Sprintf("restore %s from its backup", it.Path)
	case RemoveFile:
		return fmt.Sprintf("remove the created file %s", it.Path)
	case RemoveDir:
		return fmt.Sprintf("remove the created folder %s", it.Path)
	}
	return fmt.Sprintf("%s: %s", it.Pattern, it.Why)
}

// Conflict is an item a local undo left as it was.
type Conflict struct {
	Item int    `json:"item"`
	Path string `json:"path"`
	Why  string `json:"why"`
}

// plan derives an entry's undo steps from its reverse patterns, in
// their order (as the server sends them), each pattern's rows newest
// first and folders deepest first, by the rules the server applies
// (metnos-protocol §6.7.1):
//
//   - swap_src_dst: every {src, dst} row is moved back;
//   - restore_blob_backup: every row naming a backup (blob_path,
//     prev_blob_path, blob_sha256, prev_blob_sha256) is restored at
//     its path, or its dst for a move over a file; a row naming none is
//     not this pattern's (a created or skipped file) and is skipped;
//   - delete_created_paths: every created row is removed by what it is
//     on the disk (a file or link unlinked, a folder only when empty),
//     files first, then those folders and dirs_created, deepest first;
//   - delete_created_dirs: dirs_created, deepest first, when empty;
//   - restore_trashed_files names Google Drive ids, not files of this
//     device: it has nothing to do here (the device's delete_files rows
//     are restored by restore_blob_backup).
func plan(patterns []string, rows []Row, dirs []string) []Item {
	var items []Item
	moveFrom := map[string]int{} // MoveBack's From → item
	// A pattern listed twice, or delete_created_paths with
	// delete_created_dirs, must not remove a folder twice. The
	// duplicates are dropped as the steps are made, never after: a
	// restore's After is a position in items.
	dirSeen := map[string]bool{}
	addDirs := func(its []Item) {
		for _, it := range its {
			if !dirSeen[it.Path] {
				dirSeen[it.Path] = true
				items = append(items, it)
			}
		}
	}
	// A file written several times in one run goes back to what it was
	// before the first write (the oldest row's blob), and one the run
	// made is only removed: the later rows of its path are passed over.
	firstWrite := map[string]int{}
	for i, r := range rows {
		if _, seen := firstWrite[r.Path]; r.Path != "" && !seen && (r.Created || r.overwrite()) {
			firstWrite[r.Path] = i
		}
	}
	for _, p := range patterns {
		switch p {
		case "swap_src_dst":
			for i := len(rows) - 1; i >= 0; i-- {
				r := rows[i]
				if r.Account || r.Src == "" || r.Dst == "" || r.Src == r.Dst {
					continue
				}
				moveFrom[r.Dst] = len(items)
				items = append(items, Item{Kind: MoveBack, Pattern: p, Row: i, From: r.Dst, To: r.Src, Expect: r.Now, After: -1})
			}
		case "restore_blob_backup":
			for i := len(rows) - 1; i >= 0; i-- {
				r := rows[i]
				if !r.hasBlob() || r.Account || (r.overwrite() && firstWrite[r.Path] != i) {
					continue
				}
				target := r.Path
				if target == "" {
					target = r.Dst // a move over a file: restored where it was
				}
				if target == "" {
					continue
				}
				after, ok := moveFrom[target]
				if !ok {
					after = -1
				}
				blob, sum := r.blob()
				it := Item{Kind: Restore, Pattern: p, Row: i, Path: target, Blob: blob, BlobSHA256: sum,
					After: after, mode: r.Mode, mtimeNS: r.MtimeNS, atimeNS: r.AtimeNS}
				if r.overwrite() {
					it.Replace, it.Expect, it.ExpectSHA256 = true, r.Now, r.NowSHA256
				}
				items = append(items, it)
			}
		case "delete_created_paths":
			var createdDirs []string
			rowOf := map[string]int{}
			for i := len(rows) - 1; i >= 0; i-- {
				r := rows[i]
				if !r.Created || r.Path == "" {
					continue
				}
				if r.Now != nil && r.Now.Kind == "dir" {
					createdDirs = append(createdDirs, r.Path)
					rowOf[r.Path] = i
					continue
				}
				items = append(items, Item{Kind: RemoveFile, Pattern: p, Row: i, Path: r.Path, Expect: r.Now, After: -1})
			}
			its := dirItems(p, append(createdDirs, dirs...))
			for k := range its {
				if i, ok := rowOf[its[k].Path]; ok {
					its[k].Row = i
				}
			}
			addDirs(its)
		case "delete_created_dirs":
			addDirs(dirItems(p, dirs))
		case "restore_trashed_files":
			// Google Drive's trash, by the ids its rows record: nothing
			// of this device's files.
		default:
			items = append(items, Item{Kind: Unsupported, Pattern: p, Row: -1, After: -1,
				Why: "not a pattern a device can undo by itself"})
		}
	}
	return items
}

// dirItems are the created folders, deepest first, each once.
func dirItems(pattern string, dirs []string) []Item {
	ds := slices.Clone(dirs)
	sort.Strings(ds)
	ds = slices.Compact(ds)
	sort.SliceStable(ds, func(i, j int) bool { return depth(ds[i]) > depth(ds[j]) })
	items := make([]Item, len(ds))
	for i, d := range ds {
		items[i] = Item{Kind: RemoveDir, Pattern: pattern, Row: -1, Path: d, After: -1}
	}
	return items
}

func depth(p string) int { return strings.Count(p, "/") + strings.Count(p, `\`) }

// Changes is what the run changed, in a few words, by what each row
// is: "3 files moved, 1 file overwritten, 5 folders made".
func (e *Entry) Changes() string {
	var moved, replaced, made, overwritten, deleted, removedDirs, other int
	dirs := len(e.DirsCreated)
	for _, r := range e.Rows {
		switch {
		case r.Src != "" && r.Dst != "" && r.hasBlob():
			replaced++
		case r.Src != "" && r.Dst != "":
			moved++
		case r.Created && r.Now != nil && r.Now.Kind == "dir":
			dirs++
		case r.Created:
			made++
		case r.overwrite():
			overwritten++
		case r.Removed && !r.hasBlob():
			removedDirs++
		case r.Removed:
			deleted++
		default:
			other++
		}
	}
	var parts []string
	add := func(n int, one, many string) {
		switch n {
		case 0:
		case 1:
			parts = append(parts, "1 "+one)
		default:
			parts = append(parts, fmt.Sprintf("%d %s", n, many))
		}
	}
	add(moved, "file moved", "files moved")
	add(replaced, "file moved over another (kept in a backup)", "files moved over others (kept in backups)")
	add(made, "file made", "files made")
	add(overwritten, "file overwritten (the old one kept in a backup)", "files overwritten (the old ones kept in backups)")
	add(deleted, "file deleted (kept in a backup)", "files deleted (kept in backups)")
	add(removedDirs, "folder removed", "folders removed")
	add(dirs, "folder made", "folders made")
	add(other, "other change", "other changes")
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, ", ")
}

// Summary is what undoing the entry would do, in a few words: "move 8
// files back, restore 1 file from its backup, remove 4 folders".
func (e *Entry) Summary() string {
	if !e.Finished {
		if e.Interrupted {
			return "nothing: the run was cut short and what it changed is not known"
		}
		return "nothing yet: still running"
	}
	if len(e.Reverse) == 0 {
		return "nothing: the executor declares no reverse pattern"
	}
	counts := map[string]int{}
	var unsupported []string
	for i, it := range e.Items {
		if _, done := e.Undone[i]; done {
			continue
		}
		if it.Kind == Unsupported {
			if !slices.Contains(unsupported, it.Pattern) {
				unsupported = append(unsupported, it.Pattern)
			}
			continue
		}
		counts[it.Kind]++
	}
	var parts []string
	add := func(kind, one, many string) {
		switch n := counts[kind]; n {
		case 0:
		case 1:
			parts = append(parts, one)
		default:
			parts = append(parts, fmt.Sprintf(many, n))
		}
	}
	add(MoveBack, "move 1 file back", "move %d files back")
	add(Restore, "restore 1 file from its backup", "restore %d files from their backups")
	add(RemoveFile, "remove 1 created file", "remove %d created files")
	add(RemoveDir, "remove 1 created folder", "remove %d created folders")
	s := strings.Join(parts, ", ")
	if s == "" {
		s = "nothing left to undo"
	}
	if len(unsupported) > 0 {
		s += "; not undoable here: " + strings.Join(unsupported, ", ")
	}
	return s
}

// same reports whether the file at p is still what want recorded.
func same(fi os.FileInfo, want *Stat) bool { return sameStat(stat(fi), want) }

// sameStat reports whether got is what want recorded.
func sameStat(got, want *Stat) bool { return got != nil && want != nil && *got == *want }

// status is an item's state on the disk now.
type status int

const (
	pending  status = iota // can be done
	done                   // already put back
	conflict               // cannot be done without replacing or losing something
)

// check looks at the disk: is the item done, can it be done, or is it
// in conflict (and why)? It reads but never changes anything. gone, in
// a dry run, holds the paths the steps before would have moved away.
//
// h hashes the files a restore would replace (nil: without limit).
func (e *Entry) check(i int, gone map[string]bool, h *hasher) (status, string) {
	it := e.Items[i]
	switch it.Kind {
	case MoveBack:
		from, ferr := os.Lstat(it.From)
		to, terr := os.Lstat(it.To)
		switch {
		case ferr == nil && terr == nil && os.SameFile(from, to):
			return pending, "" // a move cut short between its link and its removal
		case ferr == nil && terr == nil && same(to, it.Expect) && !same(from, it.Expect):
			return done, "" // moved back, and something else took its place since (a restore)
		case ferr == nil && terr == nil:
			return conflict, fmt.Sprintf("%s is taken by another file: not replaced (the moved file stays at %s)", it.To, it.From)
		case ferr == nil && !same(from, it.Expect):
			return conflict, fmt.Sprintf("%s changed since it was moved there (size or modification time): left where it is", it.From)
		case ferr == nil:
			return pending, ""
		case terr == nil && same(to, it.Expect):
			return done, ""
		case terr == nil:
			return conflict, fmt.Sprintf("%s is gone, and %s is another file", it.From, it.To)
		}
		return conflict, fmt.Sprintf("%s is gone (moved or removed since)", it.From)
	case Restore:
		if it.After >= i || (it.After >= 0 && e.Items[it.After].Kind != MoveBack) {
			// plan puts the move first; a journal that says otherwise
			// was not written by it.
			return conflict, fmt.Sprintf("the undo steps of %s are out of order: not restored", it.Path)
		}
		if _, undone := e.Undone[it.After]; it.After >= 0 && !undone {
			if st, _ := e.check(it.After, gone, h); st != done {
				return pending, "" // its place is freed by a move first
			}
		}
		fi, err := os.Lstat(it.Path)
		switch {
		case os.IsNotExist(err):
			return pending, ""
		case err != nil:
			return conflict, err.Error()
		}
		var sum string
		if fi.Mode().IsRegular() {
			sum = h.sum(it.Path, fi.Size())
		}
		switch {
		case sum != "" && sum == it.BlobSHA256:
			return done, ""
		case it.Replace && e.Recovered:
			return conflict, fmt.Sprintf("%s was looked at only when the agent started again after a crash, so a change made to it since the run cannot be told apart: not replaced", it.Path)
		case it.Replace && it.ExpectSHA256 == "":
			return conflict, fmt.Sprintf("what the run left at %s was not hashed when it was recorded (too much to hash at once), so a change since cannot be told apart: not replaced", it.Path)
		case it.Replace && sum != "" && same(fi, it.Expect) && sum == it.ExpectSHA256:
			return pending, "" // still what the executor wrote: the old bytes go back over it
		case it.Replace:
			return conflict, fmt.Sprintf("%s changed since the run wrote it: not replaced", it.Path)
		}
		return conflict, fmt.Sprintf("%s exists and is not the backed-up file: not replaced (the backup stays at %s)", it.Path, it.Blob)
	case RemoveFile, RemoveDir:
		fi, err := os.Lstat(it.Path)
		switch {
		case os.IsNotExist(err):
			return done, ""
		case err != nil:
			return conflict, err.Error()
		case it.Kind == RemoveFile && it.Expect == nil && fi.IsDir():
			// A created row the journal did not see after the run: by
			// what it is on the disk, a folder, removed only when empty.
		case it.Kind == RemoveFile && !same(fi, it.Expect):
			return conflict, fmt.Sprintf("%s changed since it was created: kept", it.Path)
		case it.Kind == RemoveFile && e.Recovered:
			return conflict, fmt.Sprintf("%s was looked at only when the agent started again after a crash, so a change made to it since the run cannot be told apart: kept", it.Path)
		case it.Kind == RemoveFile:
			return pending, ""
		case !fi.IsDir():
			return conflict, fmt.Sprintf("%s is no longer a folder: kept", it.Path)
		}
		if f, err := openNoFollow(it.Path); err == nil {
			names, _ := f.Readdirnames(-1)
			f.Close()
			for _, n := range names {
				if !gone[filepath.Join(it.Path, n)] {
					return conflict, fmt.Sprintf("%s is not empty: kept", it.Path)
				}
			}
		}
		return pending, ""
	}
	return conflict, it.Why
}

// sha256File is the hex SHA-256 of the regular file at p ("" if it is
// not one, or unreadable).
func sha256File(p string) string {
	s, _ := sha256FileMax(p, -1)
	return s
}

// hashedHook, when set (by tests), is told of each file hashed.
var hashedHook func(p string)

// sha256FileMax is sha256File reading at most max bytes (max < 0: no
// limit): "" for a file larger. n is how many bytes were read.
func sha256FileMax(p string, max int64) (sum string, n int64) {
	f, err := openBlob(p)
	if err != nil {
		return "", 0
	}
	defer f.Close()
	if hashedHook != nil {
		hashedHook(p)
	}
	h := sha256.New()
	var r io.Reader = f
	if max >= 0 {
		r = io.LimitReader(f, max+1)
	}
	n, err = io.Copy(h, r)
	if err != nil || (max >= 0 && n > max) {
		return "", n
	}
	return hex.EncodeToString(h.Sum(nil)), n
}
