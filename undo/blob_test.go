//go:build unix

package undo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAHistoryFolderThatIsALinkIsRefused: _history lies in a folder
// executors can write, so one that is a symbolic link may lead
// anywhere: no backup is read through it, by the path a row names or by
// its SHA-256, and nothing is restored.
func TestAHistoryFolderThatIsALinkIsRefused(t *testing.T) {
	w := newWorld(t)
	elsewhere := filepath.Join(filepath.Dir(w.history), "elsewhere")
	if err := os.Rename(w.history, elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, w.history); err != nil {
		t.Fatal(err)
	}
	a := w.write("a.txt", "alpha")
	b := w.write("b.txt", "bravo")
	id := w.deleteWithBlob(a, b)
	e, _ := w.j.Entry(id)
	if err := CheckBlob(w.history, e.Rows[0].BlobPath, e.Rows[0].BlobSHA256); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("CheckBlob through a linked history folder: %v", err)
	}
	// b's row names its blob only by its SHA-256: found by a walk of
	// the history folder, which must refuse the link too.
	byHash := e.Items[0]
	byHash.Blob = ""
	c := &confinement{history: w.history}
	if _, err := c.findBlob(byHash); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a blob found by its SHA-256 in a linked history folder: %v", err)
	}
	for _, dry := range []bool{true, false} {
		rep, err := w.j.Undo(id, w.history, dry)
		if err != nil || len(rep.Done) != 0 || len(rep.Conflicts) != 2 {
			t.Fatalf("undo (dry run %v): %+v %v", dry, rep, err)
		}
		for _, c := range rep.Conflicts {
			if !strings.Contains(c.Why, "symbolic link") {
				t.Errorf("conflict: %q, want it to name the link", c.Why)
			}
		}
	}
	for _, p := range []string{a, b} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s was restored through a linked history folder", p)
		}
	}
}

// TestABlobSwappedAfterTheCheckIsNeverCopied: the blob is replaced by
// other bytes between the undo's look at the steps and the restore (an
// executor still writing in the history folder). The restore hashes
// the very file it copies, before copying: nothing reaches the user's
// folder (not even a temporary file, which would change the folder's
// modification time), and a conflict says the backup is corrupted.
func TestABlobSwappedAfterTheCheckIsNeverCopied(t *testing.T) {
	w := newWorld(t)
	a := w.write("a.txt", "alpha")
	id := w.deleteWithBlob(a)
	e, _ := w.j.Entry(id)
	blob := e.Rows[0].BlobPath
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(w.folder, old, old); err != nil {
		t.Fatal(err)
	}
	stepHook = func(i int, phase string) {
		if phase != "before" {
			return
		}
		other := blob + ".new"
		if err := os.WriteFile(other, []byte("not alpha at all"), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Rename(other, blob); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { stepHook = nil })
	rep, err := w.j.Undo(id, w.history, false)
	if err != nil || len(rep.Done) != 0 || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "corrupted") {
		t.Fatalf("undo: %+v %v", rep, err)
	}
	if ents, _ := os.ReadDir(w.folder); len(ents) != 0 {
		t.Fatalf("left in the folder: %v", ents)
	}
	if fi, _ := os.Stat(w.folder); !fi.ModTime().Equal(old) {
		t.Fatalf("the folder was written to (modified %v): bytes of an unchecked blob reached it", fi.ModTime())
	}
}

// TestABlobPathOutsideTheHistoryFallsBackToItsHash: a row's blob_path
// that exists but lies outside the history folder is not used; as the
// server does (metnos-protocol §6.7.1), the blob named by the row's
// SHA-256 in the history folder is.
func TestABlobPathOutsideTheHistoryFallsBackToItsHash(t *testing.T) {
	w := newWorld(t)
	a := w.write("a.txt", "alpha")
	row := w.backup("turn-1", a)
	outside := filepath.Join(t.TempDir(), filepath.Base(row["blob_path"].(string)))
	if err := os.WriteFile(outside, []byte("alpha"), 0o600); err != nil {
		t.Fatal(err)
	}
	row["blob_path"], row["path"], row["removed"] = outside, a, true
	os.Remove(a)
	id := w.run("delete_files", []string{"restore_blob_backup"}, map[string]any{"paths": []any{a}}, func() map[string]any {
		return map[string]any{"results": []any{row}}
	})
	rep, err := w.j.Undo(id, w.history, false)
	if err != nil || len(rep.Done) != 1 || len(rep.Conflicts) != 0 {
		t.Fatalf("undo: %+v %v", rep, err)
	}
	if b, err := os.ReadFile(a); err != nil || string(b) != "alpha" {
		t.Fatalf("restored: %q %v", b, err)
	}
}
