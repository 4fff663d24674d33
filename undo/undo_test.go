package undo

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// world is a folder of files, a history folder and a journal, as an
// agent would have them.
type world struct {
	t       *testing.T
	folder  string // the folder executors were allowed to write
	history string // <user data>/_history
	j       *Journal
	seq     int
}

func newWorld(t *testing.T) *world {
	t.Helper()
	base := t.TempDir()
	w := &world{t: t, folder: filepath.Join(base, "Photos"), history: filepath.Join(base, "shimdata", "_history")}
	for _, d := range []string{w.folder, w.history} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	j, err := Open(filepath.Join(base, "history"))
	if err != nil {
		t.Fatal(err)
	}
	w.j = j
	return w
}

// snapshot maps every file under the folder to its SHA-256, and every
// folder to "dir".
func (w *world) snapshot() map[string]string {
	w.t.Helper()
	m := map[string]string{}
	filepath.WalkDir(w.folder, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			w.t.Fatal(err)
		}
		rel, _ := filepath.Rel(w.folder, p)
		if d.IsDir() {
			m[rel] = "dir"
		} else {
			m[rel] = sha256File(p)
		}
		return nil
	})
	return m
}

func (w *world) write(rel, content string) string {
	w.t.Helper()
	p := filepath.Join(w.folder, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
		w.t.Fatal(err)
	}
	return p
}

// backup keeps a blob of p as the shim does and returns the row fields.
func (w *world) backup(turn, p string) map[string]any {
	w.t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		w.t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	digest := hex.EncodeToString(sum[:])
	dir := filepath.Join(w.history, turn, "blob")
	os.MkdirAll(dir, 0o700)
	blob := filepath.Join(dir, digest+".bin")
	if err := os.WriteFile(blob, b, 0o600); err != nil {
		w.t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	return map[string]any{"blob_path": blob, "blob_sha256": digest, "mode": json.Number(fmt.Sprint(uint32(fi.Mode().Perm()))),
		"mtime_ns": json.Number(fmt.Sprint(fi.ModTime().UnixNano())), "size": json.Number(fmt.Sprint(fi.Size()))}
}

// run journals one invocation as the agent does: Begin, the change
// (done by fn, which returns the executor's output), Finish.
func (w *world) run(executor string, reverse []string, args any, fn func() map[string]any) string {
	w.t.Helper()
	w.seq++
	id := fmt.Sprintf("inv-%d-%06d", time.Now().UnixMilli(), w.seq)
	if err := w.j.Begin(Begin{InvocationID: id, TurnID: "turn-1", Executor: executor, ManifestSHA256: "sha256:m",
		Reverse: reverse, Roots: []string{w.folder}, History: w.history}); err != nil {
		w.t.Fatal(err)
	}
	out := fn()
	if _, err := w.j.Finish(id, Outcome{OK: true, Payload: out, Args: args}); err != nil {
		w.t.Fatal(err)
	}
	return id
}

// organize moves n photos into YYYY/MM folders the way organize_photos
// does, one of them onto a taken name (its blob kept first), and
// returns the invocation id and the folder as it was before.
func (w *world) organize(n int) (string, map[string]string) {
	w.t.Helper()
	for i := range n {
		w.write(fmt.Sprintf("IMG_%04d.jpg", i), fmt.Sprintf("photo %d %s", i, strings.Repeat("x", i)))
	}
	w.write("2024/03/IMG_0000.jpg", "an older photo with the same name")
	before := w.snapshot()
	return w.run("organize_photos", []string{"swap_src_dst", "restore_blob_backup", "delete_created_dirs"},
		map[string]any{"folder": w.folder}, func() map[string]any {
			var rows []any
			var dirs []any
			for i := range n {
				src := filepath.Join(w.folder, fmt.Sprintf("IMG_%04d.jpg", i))
				month := fmt.Sprintf("%02d", 3+i%3)
				dst := filepath.Join(w.folder, "2024", month, filepath.Base(src))
				if _, err := os.Stat(filepath.Dir(dst)); err != nil {
					os.MkdirAll(filepath.Dir(dst), 0o755)
					dirs = append(dirs, filepath.Dir(dst))
				}
				row := map[string]any{"src": src, "dst": dst}
				if _, err := os.Stat(dst); err == nil {
					row["path"] = dst
					for k, v := range w.backup("turn-1", dst) {
						row[k] = v
					}
					row["replaced"] = true
				}
				if err := os.Rename(src, dst); err != nil {
					w.t.Fatal(err)
				}
				rows = append(rows, row)
			}
			return map[string]any{"ok": true, "results": rows, "dirs_created": dirs}
		}), before
}

func equal(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: there, and was not before", k)
		}
	}
}

func TestUndoPutsEverythingBack(t *testing.T) {
	w := newWorld(t)
	id, before := w.organize(30)
	e, _ := w.j.Entry(id)
	if got := e.Summary(); got != "move 30 files back, restore 1 file from its backup, remove 2 created folders" {
		t.Fatalf("summary: %q", got)
	}
	dry, err := w.j.Undo(id, w.history, true)
	if err != nil || len(dry.Done) != 33 || len(dry.Conflicts) != 0 {
		t.Fatalf("dry run: %d steps, %v, %v", len(dry.Done), dry.Conflicts, err)
	}
	rep, err := w.j.Undo(id, w.history, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Done) != 33 || len(rep.Conflicts) != 0 {
		t.Fatalf("undo: %d steps done, conflicts %v", len(rep.Done), rep.Conflicts)
	}
	equal(t, w.snapshot(), before)
	if e, _ := w.j.Entry(id); e.State() != "undone" {
		t.Fatalf("state after undo: %s", e.State())
	}
	// Again: nothing to do, nothing broken.
	rep, err = w.j.Undo(id, w.history, false)
	if err != nil || len(rep.Done) != 0 || len(rep.Conflicts) != 0 {
		t.Fatalf("second undo: %+v %v", rep, err)
	}
	equal(t, w.snapshot(), before)
	if rep, err := chainlog.Verify(w.j.Dir()); err != nil || !rep.OK() {
		t.Fatalf("journal: %v %v", rep, err)
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestUndoConflictsAreReportedNotClobbered(t *testing.T) {
	w := newWorld(t)
	id, _ := w.organize(6)
	e, _ := w.j.Entry(id)
	rows := e.Rows
	// 1: a moved photo edited in its new place.
	edited := rows[1].Dst
	os.WriteFile(edited, []byte("edited after the move"), 0o640)
	// 2: a new file where a photo came from.
	taken := rows[2].Src
	os.WriteFile(taken, []byte("a new file with the old name"), 0o640)
	// 3: a file added to a created folder, which must stay.
	extra := filepath.Join(e.DirsCreated[len(e.DirsCreated)-1], "notes.txt")
	os.WriteFile(extra, []byte("mine"), 0o640)

	rep, err := w.j.Undo(id, w.history, false)
	if err != nil {
		t.Fatal(err)
	}
	why := map[string]string{}
	for _, c := range rep.Conflicts {
		why[c.Path] = c.Why
	}
	if !strings.Contains(why[rows[1].Src], "changed since") {
		t.Errorf("edited file: %q", why[rows[1].Src])
	}
	if !strings.Contains(why[taken], "taken by another file") {
		t.Errorf("taken name: %q", why[taken])
	}
	if !strings.Contains(why[filepath.Dir(extra)], "not empty") {
		t.Errorf("folder with a new file: %q", why[filepath.Dir(extra)])
	}
	// Both sides of every conflict are still there, untouched.
	for p, want := range map[string]string{edited: "edited after the move", taken: "a new file with the old name", extra: "mine", rows[2].Dst: ""} {
		b, err := os.ReadFile(p)
		if err != nil || (want != "" && string(b) != want) {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
	if e, _ := w.j.Entry(id); e.State() != "partly-undone" || len(e.Conflicts) != len(rep.Conflicts) {
		t.Fatalf("state %s, %d conflicts recorded", e.State(), len(e.Conflicts))
	}
}

// deleteWithBlob deletes files the way delete_files does and journals it.
func (w *world) deleteWithBlob(paths ...string) string {
	return w.run("delete_files", []string{"restore_blob_backup"}, map[string]any{"paths": paths}, func() map[string]any {
		var rows []any
		for _, p := range paths {
			row := map[string]any{"path": p, "removed": true}
			for k, v := range w.backup("turn-2", p) {
				row[k] = v
			}
			os.Remove(p)
			rows = append(rows, row)
		}
		return map[string]any{"ok": true, "results": rows}
	})
}

func TestRestoreChecksTheBlob(t *testing.T) {
	w := newWorld(t)
	a := w.write("a.txt", "alpha")
	b := w.write("b.txt", "bravo")
	os.Chmod(a, 0o604)
	old := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
	os.Chtimes(a, old, old)
	id := w.deleteWithBlob(a, b)
	e, _ := w.j.Entry(id)
	// Corrupt b's blob (same size, one byte changed).
	blob := e.Rows[1].BlobPath
	os.WriteFile(blob, []byte("brava"), 0o600)

	rep, err := w.j.Undo(id, w.history, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Done) != 1 || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "corrupted") {
		t.Fatalf("undo: %+v", rep)
	}
	if _, err := os.Lstat(b); err == nil {
		t.Fatal("a corrupted blob was restored")
	}
	got, _ := os.ReadFile(a)
	fi, _ := os.Stat(a)
	if string(got) != "alpha" || fi.Mode().Perm() != 0o604 || !fi.ModTime().Equal(old) {
		t.Fatalf("restored a: %q %v %v", got, fi.Mode(), fi.ModTime())
	}
	if ents, _ := os.ReadDir(w.folder); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}

// TestUndoStaysInsideTheGrants: a result row that names a file outside
// the folders the invocation could write (a lying executor) does not
// make a local undo move it, nor does a link planted in the folder;
// with the same rows and the outside folder granted, the same undo does
// move it, so the refusal is the confinement's.
func TestUndoStaysInsideTheGrants(t *testing.T) {
	for _, granted := range []bool{false, true} {
		t.Run(fmt.Sprintf("outside granted=%v", granted), func(t *testing.T) {
			w := newWorld(t)
			outside := filepath.Join(filepath.Dir(w.folder), "elsewhere")
			os.MkdirAll(outside, 0o755)
			secret := filepath.Join(outside, "secret.txt")
			os.WriteFile(secret, []byte("keep me here"), 0o600)
			// A link in the granted folder to the outside one.
			os.Symlink(outside, filepath.Join(w.folder, "link"))
			roots := []string{w.folder}
			if granted {
				roots = append(roots, outside)
			}
			id := "inv-1-000001"
			w.j.Begin(Begin{InvocationID: id, Executor: "move_files", Reverse: []string{"swap_src_dst"}, Roots: roots, History: w.history})
			w.j.Finish(id, Outcome{OK: true, Payload: map[string]any{"results": []any{
				// "I moved photo.jpg to the secret's place": undo would move the secret out.
				map[string]any{"src": filepath.Join(w.folder, "photo.jpg"), "dst": secret},
			}}})
			e, _ := w.j.Entry(id)
			e.Items[0].Expect = statOf(secret) // as if the journal had seen it
			w.j.byID[id].Items[0].Expect = statOf(secret)
			rep, err := w.j.Undo(id, w.history, false)
			if err != nil {
				t.Fatal(err)
			}
			_, stillThere := os.Stat(secret)
			if granted {
				if stillThere == nil || len(rep.Done) != 1 {
					t.Fatalf("with the folder granted the move back should happen: %+v", rep)
				}
				return
			}
			if stillThere != nil || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "outside the folders") {
				t.Fatalf("a row outside the grants moved a file: %+v", rep)
			}
		})
	}
	t.Run("through a link in the grant", func(t *testing.T) {
		w := newWorld(t)
		outside := filepath.Join(filepath.Dir(w.folder), "elsewhere")
		os.MkdirAll(outside, 0o755)
		os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("keep"), 0o600)
		os.Symlink(outside, filepath.Join(w.folder, "link"))
		via := filepath.Join(w.folder, "link", "secret.txt")
		id := "inv-1-000002"
		w.j.Begin(Begin{InvocationID: id, Executor: "move_files", Reverse: []string{"swap_src_dst"}, Roots: []string{w.folder}, History: w.history})
		w.j.Finish(id, Outcome{OK: true, Payload: map[string]any{"results": []any{
			map[string]any{"src": filepath.Join(w.folder, "photo.jpg"), "dst": via},
		}}})
		rep, _ := w.j.Undo(id, w.history, false)
		if _, err := os.Stat(filepath.Join(outside, "secret.txt")); err != nil || len(rep.Conflicts) != 1 {
			t.Fatalf("a link inside the grant led the undo outside: %+v", rep)
		}
	})
	t.Run("blob outside the history folder", func(t *testing.T) {
		w := newWorld(t)
		target := filepath.Join(w.folder, "restored.txt")
		elsewhere := filepath.Join(t.TempDir(), "x.bin")
		os.WriteFile(elsewhere, []byte("not a blob of ours"), 0o600)
		id := "inv-1-000003"
		w.j.Begin(Begin{InvocationID: id, Executor: "delete_files", Reverse: []string{"restore_blob_backup"}, Roots: []string{w.folder}, History: w.history})
		w.j.Finish(id, Outcome{OK: true, Payload: map[string]any{"results": []any{
			map[string]any{"path": target, "blob_path": elsewhere, "blob_sha256": sha256Hex("not a blob of ours")},
		}}})
		rep, _ := w.j.Undo(id, w.history, false)
		if _, err := os.Lstat(target); err == nil || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "history folder") {
			t.Fatalf("a blob from outside the history folder was used: %+v", rep)
		}
	})
}

// TestServerUndoIsRecognised: the reverse calls the server sends (move
// back, restore the blob, remove the folders) are ordinary invocations;
// the journal sees that they put the entry's changes back.
func TestServerUndoIsRecognised(t *testing.T) {
	w := newWorld(t)
	id, before := w.organize(5)
	e, _ := w.j.Entry(id)
	var moveRows []any
	for _, r := range e.Rows {
		moveRows = append(moveRows, map[string]any{"src": r.Dst, "dst": r.Src})
	}
	mv := w.run("move_files", []string{"swap_src_dst", "delete_created_dirs"}, map[string]any{"entries": "..."}, func() map[string]any {
		for _, r := range e.Rows {
			if err := os.Rename(r.Dst, r.Src); err != nil {
				t.Fatal(err)
			}
		}
		return map[string]any{"ok": true, "results": moveRows}
	})
	if got, _ := w.j.Entry(id); got.State() != "partly-undone" || got.Undone[0] != mv {
		t.Fatalf("after the move back: %s, %v", got.State(), got.Undone)
	}
	w.run("move_files", []string{"swap_src_dst"}, nil, func() map[string]any {
		var rows []any
		for _, r := range e.Rows {
			if r.BlobPath != "" {
				b, _ := os.ReadFile(r.BlobPath)
				os.WriteFile(r.Path, b, 0o640)
				rows = append(rows, map[string]any{"src": r.BlobPath, "dst": r.Path})
			}
		}
		return map[string]any{"ok": true, "results": rows}
	})
	w.run("delete_dirs", nil, map[string]any{"paths": anyList(e.DirsCreated)}, func() map[string]any {
		var rows []any
		for _, d := range []string{filepath.Join(w.folder, "2024", "03"), filepath.Join(w.folder, "2024", "04"), filepath.Join(w.folder, "2024", "05")} {
			if err := os.Remove(d); err == nil {
				rows = append(rows, map[string]any{"path": d, "removed": true})
			}
		}
		return map[string]any{"ok": true, "results": rows}
	})
	got, _ := w.j.Entry(id)
	if got.State() != "undone" {
		t.Fatalf("after the three reverse calls: %s (%s)", got.State(), got.Summary())
	}
	if last, _, ok := w.j.Last(); ok && last.InvocationID == id {
		t.Fatal("--last would pick an entry already undone")
	}
	if mvEntry, _ := w.j.Entry(mv); len(mvEntry.Reverses) != 1 || mvEntry.Reverses[0] != id {
		t.Fatalf("the reverse invocation does not say what it undid: %v", mvEntry.Reverses)
	}
	// The photo the organize replaced is back too.
	equal(t, w.snapshot(), before)
}

func anyList(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func TestJournalSurvivesReopen(t *testing.T) {
	w := newWorld(t)
	id, _ := w.organize(3)
	w.j.Begin(Begin{InvocationID: "inv-9-000009", Executor: "move_files", Reverse: []string{"swap_src_dst"}})
	j2, err := Open(w.j.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := j2.Entry(id); !ok || e.State() != "done" || len(e.Items) != 6 {
		t.Fatalf("reopened: %+v", e)
	}
	if u := j2.Unfinished(); len(u) != 1 || u[0] != "inv-9-000009" {
		t.Fatalf("unfinished: %v", u)
	}
	if err := j2.Interrupt("inv-9-000009"); err != nil {
		t.Fatal(err)
	}
	if e, _ := j2.Entry("inv-9-000009"); e.State() != "interrupted" || !strings.Contains(e.Summary(), "not known") {
		t.Fatalf("interrupted: %s %s", e.State(), e.Summary())
	}
	if _, err := j2.Undo("inv-9-000009", w.history, false); err == nil {
		t.Fatal("an interrupted run was undone")
	}
	// The first journal sees what the second wrote when it next appends.
	w.j.Begin(Begin{InvocationID: "inv-9-000010", Executor: "move_files"})
	if e, _ := w.j.Entry("inv-9-000009"); e.State() != "interrupted" {
		t.Fatalf("the other process's record was not folded in: %s", e.State())
	}
}

// TestAnUndoWhoseRecordFailsStillReports: the steps are done and the
// journal cannot record it at the end: the report of what was done
// comes back with an error saying to run the undo again, which then
// finds everything done and records it.
func TestAnUndoWhoseRecordFailsStillReports(t *testing.T) {
	w := newWorld(t)
	id, before := w.organize(3)
	file := filepath.Join(w.j.Dir(), journalFile)
	stepHook = func(i int, phase string) {
		if phase == "end" {
			os.Rename(file, file+".aside")
			os.Mkdir(file, 0o700)
		}
	}
	rep, err := w.j.Undo(id, w.history, false)
	stepHook = nil
	if err == nil || !strings.Contains(err.Error(), "run the undo again") || len(rep.Done) != 6 {
		t.Fatalf("undo: %d steps reported, %v", len(rep.Done), err)
	}
	equal(t, w.snapshot(), before)
	os.Remove(file)
	os.Rename(file+".aside", file)
	rep, err = w.j.Undo(id, w.history, false)
	if err != nil || rep.Already != 6 || len(rep.Conflicts) != 0 {
		t.Fatalf("again: %+v %v", rep, err)
	}
	if e, _ := w.j.Entry(id); e.State() != "undone" {
		t.Fatalf("state: %s", e.State())
	}
}
