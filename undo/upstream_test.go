package undo

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// fixture is one run of an upstream Metnos file executor, recorded by
// testdata/upstream/record.py: the folder before and after it, the
// backup blobs it kept, and its output.
type fixture struct {
	Executor string               `json:"executor"`
	Reverse  []string             `json:"reverse_patterns"`
	Args     any                  `json:"args"`
	Before   map[string]fileState `json:"before"`
	After    map[string]fileState `json:"after"`
	Blobs    map[string]fileState `json:"blobs"`
	Result   map[string]any       `json:"result"`
}

// fileState is a file (its bytes in base64, mode, mtime) or a folder.
type fileState struct {
	Dir     bool   `json:"dir,omitempty"`
	B64     string `json:"b64,omitempty"`
	Mode    uint32 `json:"mode"`
	MtimeNS int64  `json:"mtime_ns,omitempty"`
}

// upstream is a world laid out as a recorded upstream run left it.
type upstream struct {
	root, folder, history string
	fx                    fixture
	j                     *Journal
}

// replay lays out the fixture's "after" and its blobs in a new folder
// and journals its run as the agent does (Begin, then Finish with the
// executor's output, once the run is over).
func replay(t *testing.T, name string) (*upstream, string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "upstream", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{root: t.TempDir()}
	u.folder, u.history = filepath.Join(u.root, "d"), filepath.Join(u.root, "hist")
	raw = bytes.ReplaceAll(raw, []byte("@ROOT@"), []byte(u.root))
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&u.fx); err != nil {
		t.Fatal(err)
	}
	lay(t, u.root, u.fx.After)
	lay(t, u.root, u.fx.Blobs)
	if u.j, err = Open(filepath.Join(u.root, "journal")); err != nil {
		t.Fatal(err)
	}
	id := "inv-" + name
	if err := u.j.Begin(Begin{InvocationID: id, TurnID: "turn-rec", Executor: u.fx.Executor, Reverse: u.fx.Reverse,
		Roots: []string{u.folder}, History: u.history}); err != nil {
		t.Fatal(err)
	}
	if _, err := u.j.Finish(id, Outcome{OK: true, Payload: u.fx.Result, Args: u.fx.Args}); err != nil {
		t.Fatal(err)
	}
	return u, id
}

// lay writes the files and folders of a snapshot under root.
func lay(t *testing.T, root string, files map[string]fileState) {
	t.Helper()
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range files {
			if !yield(k) {
				return
			}
		}
	})
	for _, rel := range names {
		f, p := files[rel], filepath.Join(root, rel)
		if f.Dir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, _ := base64.StdEncoding.DecodeString(f.B64)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, os.FileMode(f.Mode))
		if f.MtimeNS != 0 {
			os.Chtimes(p, time.Unix(0, f.MtimeNS), time.Unix(0, f.MtimeNS))
		}
	}
}

// state reads the folder back as a snapshot (relative to root).
func (u *upstream) state(t *testing.T) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	filepath.Walk(u.folder, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == u.folder {
			return err
		}
		rel, _ := filepath.Rel(u.root, p)
		if fi.IsDir() {
			out[rel] = fileState{Dir: true}
			return nil
		}
		b, _ := os.ReadFile(p)
		out[rel] = fileState{B64: base64.StdEncoding.EncodeToString(b), Mode: uint32(fi.Mode().Perm()), MtimeNS: fi.ModTime().UnixNano()}
		return nil
	})
	return out
}

// same compares two snapshots: every file byte for byte, with its mode
// and modification time, and the same folders.
func sameState(t *testing.T, got, want map[string]fileState) {
	t.Helper()
	for rel, w := range want {
		g, ok := got[rel]
		switch {
		case !ok:
			t.Errorf("%s: missing", rel)
		case w.Dir != g.Dir:
			t.Errorf("%s: folder %v, want %v", rel, g.Dir, w.Dir)
		case !w.Dir && (g.B64 != w.B64 || g.Mode != w.Mode || g.MtimeNS != w.MtimeNS):
			t.Errorf("%s: %s %o %d, want %s %o %d", rel, g.B64, g.Mode, g.MtimeNS, w.B64, w.Mode, w.MtimeNS)
		}
	}
	for rel := range got {
		if _, ok := want[rel]; !ok {
			t.Errorf("%s: there, and was not before", rel)
		}
	}
}

// TestUpstreamRowsAreUndoneLocally: for every row shape the upstream
// file executors write (metnos-protocol §6.7.1), recorded from the
// executors themselves, a local undo puts the folder back as it was,
// byte for byte, with modes and times, and says so truthfully.
func TestUpstreamRowsAreUndoneLocally(t *testing.T) {
	for _, tt := range []struct {
		name    string
		summary string
		changes string
	}{
		{"write_files", "restore 1 file from its backup, remove 1 created file, remove 2 created folders",
			"1 file made, 1 file overwritten (the old one kept in a backup), 2 folders made"},
		{"move_files", "move 1 file back, remove 2 created folders", "1 file moved, 2 folders made"},
		{"move_files_overwrite", "move 1 file back, restore 1 file from its backup", "1 file moved over another (kept in a backup)"},
		{"create_dirs", "remove 3 created folders", "3 folders made"},
		{"delete_files", "restore 2 files from their backups", "2 files deleted (kept in backups)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u, id := replay(t, tt.name)
			e, _ := u.j.Entry(id)
			if got := e.Summary(); got != tt.summary {
				t.Errorf("undo would: %q, want %q", got, tt.summary)
			}
			if got := e.Changes(); got != tt.changes {
				t.Errorf("changes: %q, want %q", got, tt.changes)
			}
			rep, err := u.j.Undo(id, u.history, false)
			if err != nil || len(rep.Conflicts) > 0 || len(rep.Unsupported) > 0 {
				t.Fatalf("undo: %+v, %v", rep, err)
			}
			sameState(t, u.state(t), u.fx.Before)
			if e, _ := u.j.Entry(id); e.State() != "undone" {
				t.Errorf("state after the undo: %s", e.State())
			}
		})
	}
	t.Run("delete_dirs is not reversible", func(t *testing.T) {
		u, id := replay(t, "delete_dirs")
		_, err := u.j.Undo(id, u.history, false)
		if !errors.Is(err, ErrNotUndoable) {
			t.Fatalf("undo of delete_dirs: %v", err)
		}
		if e, _ := u.j.Entry(id); e.State() == "undone" || e.Changes() != "1 folder removed" {
			t.Fatalf("state %s, changes %q", e.State(), e.Changes())
		}
	})
}

// TestAnOverwriteEditedSinceIsKeptWithTheOldVersionBeside: a file
// write_files overwrote, then edited by the user, is not replaced: the
// version from before the run is put beside it, the conflict reported,
// and the entry not marked undone; the rest of the undo is done.
func TestAnOverwriteEditedSinceIsKeptWithTheOldVersionBeside(t *testing.T) {
	u, id := replay(t, "write_files")
	old := filepath.Join(u.folder, "old.txt")
	if err := os.WriteFile(old, []byte("the user's own edit\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	dry, err := u.j.Undo(id, u.history, true)
	if err != nil || len(dry.Conflicts) != 1 || !strings.Contains(dry.Conflicts[0].Why, "would be kept beside") {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	rep, err := u.j.Undo(id, u.history, false)
	if err != nil || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "changed since the run wrote it") {
		t.Fatalf("undo: %+v %v", rep, err)
	}
	if b, _ := os.ReadFile(old); string(b) != "the user's own edit\n" {
		t.Fatalf("the edited file was replaced: %q", b)
	}
	side := filepath.Join(u.folder, "old (before the change).txt")
	if b, err := os.ReadFile(side); err != nil || string(b) != "the old text\n" {
		t.Fatalf("the version before the run, beside it: %q %v (%s)", b, err, rep.Conflicts[0].Why)
	}
	if _, err := os.Lstat(filepath.Join(u.folder, "new")); err == nil {
		t.Error("the created folders stay after the undo")
	}
	if e, _ := u.j.Entry(id); e.State() != "partly-undone" || len(e.Conflicts) != 1 {
		t.Fatalf("state %s, conflicts %v", e.State(), e.Conflicts)
	}
	// Again: the same conflict, nothing more written.
	rep, err = u.j.Undo(id, u.history, false)
	if err != nil || len(rep.Conflicts) != 1 || len(rep.Done) != 0 {
		t.Fatalf("second undo: %+v %v", rep, err)
	}
	if ents, _ := os.ReadDir(u.folder); len(ents) != 4 { // old, old (before…), same, empty
		t.Fatalf("left in the folder: %v", ents)
	}
}

// TestBlobsAreFoundAsTheServerFindsThem: a row's named blob that is
// gone is looked up by its SHA-256 under the history folder; with no
// blob at all, the restore is a failure, reported, and nothing else is
// lost.
func TestBlobsAreFoundAsTheServerFindsThem(t *testing.T) {
	u, id := replay(t, "move_files_overwrite")
	blobs, _ := filepath.Glob(filepath.Join(u.history, "turn-rec", "blob", "*.bin"))
	if len(blobs) != 1 {
		t.Fatalf("blobs: %v", blobs)
	}
	moved := filepath.Join(u.history, "elsewhere", filepath.Base(blobs[0]))
	os.MkdirAll(filepath.Dir(moved), 0o700)
	if err := os.Rename(blobs[0], moved); err != nil {
		t.Fatal(err)
	}
	rep, err := u.j.Undo(id, u.history, false)
	if err != nil || len(rep.Conflicts) != 0 {
		t.Fatalf("undo with the blob found by its hash: %+v %v", rep, err)
	}
	sameState(t, u.state(t), u.fx.Before)

	u, id = replay(t, "write_files")
	blobs, _ = filepath.Glob(filepath.Join(u.history, "turn-rec", "blob", "*.bin"))
	os.Remove(blobs[0])
	rep, err = u.j.Undo(id, u.history, false)
	if err != nil || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "is gone") {
		t.Fatalf("undo with the blob gone: %+v %v", rep, err)
	}
	if b, _ := os.ReadFile(filepath.Join(u.folder, "old.txt")); string(b) != "new text\n" {
		t.Fatalf("old.txt: %q", b)
	}
	if e, _ := u.j.Entry(id); e.State() == "undone" {
		t.Fatal("marked undone with a file not restored")
	}
}

// TestUndoRefusesRecordsThatFailTheChain: a journal edited after a
// change was recorded makes a local undo of that change refuse, naming
// the records; an entry recorded wholly before the edit is still
// undone.
func TestUndoRefusesRecordsThatFailTheChain(t *testing.T) {
	w := newWorld(t)
	a := w.write("a.txt", "alpha")
	first := w.deleteWithBlob(a)
	b := w.write("b.txt", "bravo")
	second := w.deleteWithBlob(b)
	p := filepath.Join(w.j.Dir(), journalFile)
	raw, _ := os.ReadFile(p)
	edited := bytes.Replace(raw, []byte(`"path":"`+b+`"`), []byte(`"path":"`+w.folder+`/evil.txt"`), 1)
	if bytes.Equal(edited, raw) {
		t.Fatal("nothing edited")
	}
	os.WriteFile(p, edited, 0o600)
	j, err := Open(w.j.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		_, err := j.Undo(second, w.history, dry)
		if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), p) {
			t.Fatalf("undo of the edited record (dry run %v): %v", dry, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(w.folder, "evil.txt")); err == nil {
		t.Fatal("the edited record was acted on")
	}
	if rep, ids, err := j.Untrusted(); err != nil || rep.OK() || !slices.Equal(ids, []string{second}) {
		t.Fatalf("untrusted: %v %v %v", rep, ids, err)
	}
	if rep, err := j.Undo(first, w.history, false); err != nil || len(rep.Done) != 1 {
		t.Fatalf("undo of the entry before the edit: %+v %v", rep, err)
	}
}

// TestATamperedTailIsRefused: a journal ending in bytes that are not a
// record cut short by a crash is not opened (nothing undone, the file
// left as it is); a record cut short is dropped and the undo runs.
func TestATamperedTailIsRefused(t *testing.T) {
	w := newWorld(t)
	a := w.write("a.txt", "alpha")
	id := w.deleteWithBlob(a)
	p := filepath.Join(w.j.Dir(), journalFile)
	raw, _ := os.ReadFile(p)

	os.WriteFile(p, append(slices.Clone(raw), "\x00\x01\xfe\xff garbage"...), 0o600)
	if _, err := Open(w.j.Dir()); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("open with a binary tail: %v", err)
	}
	if rep, _ := chainlog.Verify(w.j.Dir()); rep.OK() {
		t.Fatalf("verify with a binary tail: %v", rep)
	}
	if _, err := os.Lstat(a); err == nil {
		t.Fatal("restored")
	}

	last := raw[bytes.LastIndexByte(raw[:len(raw)-1], '\n')+1:]
	var seq struct{ Seq int64 }
	json.Unmarshal(last, &seq)
	torn := append(slices.Clone(raw), []byte(`{"seq":`+jsonInt(seq.Seq+1)+`,"prev":"`+chainlog.Hash(last)+`","kind":"undo_st`)...)
	os.WriteFile(p, torn, 0o600)
	j, err := Open(w.j.Dir())
	if err != nil {
		t.Fatalf("open with a torn record: %v", err)
	}
	if rep, err := j.Undo(id, w.history, false); err != nil || len(rep.Done) != 1 {
		t.Fatalf("undo after a torn record: %+v %v", rep, err)
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestLastPassesOverEntriesInConflict: --last does not pick, again and
// again, an entry a local undo left in conflict: the one before it is
// reachable, and the one in conflict is named.
func TestLastPassesOverEntriesInConflict(t *testing.T) {
	w := newWorld(t)
	a := w.write("a.txt", "alpha")
	older := w.deleteWithBlob(a)
	b := w.write("b.txt", "bravo")
	newer := w.deleteWithBlob(b)
	w.write("b.txt", "someone else's b") // its place is taken: a conflict
	if e, skipped, ok := w.j.Last(); !ok || e.InvocationID != newer || len(skipped) != 0 {
		t.Fatalf("--last: %s %v %v", e.InvocationID, skipped, ok)
	}
	if rep, _ := w.j.Undo(newer, w.history, false); len(rep.Conflicts) != 1 {
		t.Fatalf("undo of the newer: %+v", rep)
	}
	e, skipped, ok := w.j.Last()
	if !ok || e.InvocationID != older || len(skipped) != 1 || skipped[0] != newer {
		t.Fatalf("--last after a conflict: %s, skipped %v, %v", e.InvocationID, skipped, ok)
	}
}

// TestAFileWrittenTwiceInOneRun goes back to what it was before the
// first write; one made then written over is removed.
func TestAFileWrittenTwiceInOneRun(t *testing.T) {
	w := newWorld(t)
	p := w.write("notes.txt", "first")
	q := filepath.Join(w.folder, "made.txt")
	before := w.snapshot()
	id := w.run("write_files", []string{"restore_blob_backup", "delete_created_paths"}, nil, func() map[string]any {
		b1 := w.backup("turn-1", p)
		os.WriteFile(p, []byte("second"), 0o640)
		b2 := w.backup("turn-1", p)
		os.WriteFile(p, []byte("third"), 0o640)
		os.WriteFile(q, []byte("made"), 0o640)
		b3 := w.backup("turn-1", q)
		os.WriteFile(q, []byte("made, then written over"), 0o640)
		return map[string]any{"results": []any{
			map[string]any{"path": p, "created": false, "prev_blob_path": b1["blob_path"]},
			map[string]any{"path": p, "created": false, "prev_blob_path": b2["blob_path"]},
			map[string]any{"path": q, "created": true},
			map[string]any{"path": q, "created": false, "prev_blob_path": b3["blob_path"]},
		}}
	})
	rep, err := w.j.Undo(id, w.history, false)
	if err != nil || len(rep.Conflicts) != 0 {
		t.Fatalf("undo: %+v %v", rep, err)
	}
	equal(t, w.snapshot(), before)
	if e, _ := w.j.Entry(id); e.State() != "undone" {
		t.Fatalf("state %s", e.State())
	}
}
