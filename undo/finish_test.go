package undo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// overwrite journals a write_files run that overwrote each of paths
// with new bytes (their blobs kept first), its rows repeated times
// times, and returns the invocation id.
func (w *world) overwrite(roots []string, recovered bool, times int, paths ...string) string {
	w.t.Helper()
	w.seq++
	id := "inv-overwrite-" + strings.Repeat("x", w.seq)
	if err := w.j.Begin(Begin{InvocationID: id, Executor: "write_files", Reverse: []string{"restore_blob_backup"}, Roots: roots, History: w.history}); err != nil {
		w.t.Fatal(err)
	}
	var rows []any
	for _, p := range paths {
		row := map[string]any{"path": p}
		for k, v := range w.backup("turn-3", p) {
			row[k] = v
		}
		if err := os.WriteFile(p, []byte("the executor's "+filepath.Base(p)), 0o640); err != nil {
			w.t.Fatal(err)
		}
		for range times {
			rows = append(rows, row)
		}
	}
	if _, err := w.j.Finish(id, Outcome{OK: true, Payload: map[string]any{"results": rows}, Recovered: recovered}); err != nil {
		w.t.Fatal(err)
	}
	return id
}

// hashed counts the files hashed while fn runs, by path.
func hashed(t *testing.T, fn func()) map[string]int {
	n := map[string]int{}
	hashedHook = func(p string) { n[p]++ }
	defer func() { hashedHook = nil }()
	fn()
	return n
}

// TestFinishLooksOnlyInsideTheGrantsAndOnce: the rows are the
// executor's word. A row naming a file outside the folders it could
// write is not looked at (no size, no hash recorded: a local undo
// would not touch it either), and a file named by many rows is hashed
// once.
func TestFinishLooksOnlyInsideTheGrantsAndOnce(t *testing.T) {
	w := newWorld(t)
	outside := filepath.Join(t.TempDir(), "disk.img")
	os.WriteFile(outside, []byte("a big image"), 0o640)
	inside := w.write("notes.txt", "my notes")
	var id string
	n := hashed(t, func() { id = w.overwrite([]string{w.folder}, false, 500, outside, inside) })
	if n[outside] != 0 || n[inside] != 1 {
		t.Fatalf("hashed at Finish: %v; want %s once and %s never", n, inside, outside)
	}
	e, _ := w.j.Entry(id)
	for _, r := range e.Rows {
		switch r.Path {
		case outside:
			if r.Now != nil || r.NowSHA256 != "" {
				t.Fatalf("a row outside the grants was looked at: %+v %s", r.Now, r.NowSHA256)
			}
		case inside:
			if r.Now == nil || r.NowSHA256 != sha256Hex("the executor's notes.txt") {
				t.Fatalf("a row inside the grants: %+v %s", r.Now, r.NowSHA256)
			}
		}
	}
	// A later run naming both looks at the entry again (recognise):
	// still not outside, and inside at most once.
	n = hashed(t, func() {
		w.run("write_files", []string{"restore_blob_backup"}, map[string]any{"paths": []any{outside, inside}}, func() map[string]any {
			return map[string]any{"results": []any{}}
		})
	})
	if n[outside] != 0 || n[inside] > 1 {
		t.Fatalf("hashed when a later run looked at the entry: %v", n)
	}
}

// TestFinishHashesWithinABudget: an overwritten file beyond what one
// Finish hashes is recorded without its hash; a local undo cannot tell
// whether it changed since the run, so it keeps both: the file as it
// is, and the version from before the run beside it.
func TestFinishHashesWithinABudget(t *testing.T) {
	defer func(b int64) { hashBudget = b }(hashBudget)
	hashBudget = int64(len("the executor's a.txt")) + 5
	w := newWorld(t)
	a := w.write("a.txt", "alpha")
	b := w.write("b.txt", "bravo")
	id := w.overwrite([]string{w.folder}, false, 1, a, b)
	rep, err := w.j.Undo(id, w.history, false)
	if err != nil || len(rep.Done) != 1 || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "not hashed") {
		t.Fatalf("undo: %+v %v", rep, err)
	}
	for p, want := range map[string]string{a: "alpha", b: "the executor's b.txt", beside(b): "bravo"} {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("%s: %q %v, want %q", p, got, err, want)
		}
	}
}

// TestARecoveredEntryKeepsBoth: an outcome recorded only at the start
// after a crash (from the spooled result) looked at the files late: a
// user's edit made in between would pass for the executor's. A local
// undo then replaces no overwritten file: the version from before the
// run goes beside it.
func TestARecoveredEntryKeepsBoth(t *testing.T) {
	w := newWorld(t)
	a := w.write("a.txt", "alpha")
	id := w.overwrite([]string{w.folder}, true, 1, a)
	if e, _ := w.j.Entry(id); !e.Recovered {
		t.Fatal("the entry is not marked recovered")
	}
	rep, err := w.j.Undo(id, w.history, false)
	if err != nil || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "after a crash") {
		t.Fatalf("undo: %+v %v", rep, err)
	}
	for p, want := range map[string]string{a: "the executor's a.txt", beside(a): "alpha"} {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("%s: %q %v, want %q", p, got, err, want)
		}
	}
}
