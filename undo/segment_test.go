package undo

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/chainlog"
)

// smallSegments makes the journal start a new segment every few KiB.
func smallSegments(t *testing.T) {
	old := segmentBytes
	segmentBytes = 8 << 10
	t.Cleanup(func() { segmentBytes = old })
}

// TestSegmentsKeepTheChainTheMasksAndTheUndo: a journal of many
// segments is one chain (Verify checks all of it), each segment names
// a sandbox's masks once, and a change recorded in an old segment,
// whose begin record names its masks by hash only, is still listed and
// undone by a later process, which still refuses its masked path.
func TestSegmentsKeepTheChainTheMasksAndTheUndo(t *testing.T) {
	smallSegments(t)
	w := newWorld(t)
	home := w.folder
	masks := realisticMasks(home)
	grow(t, w.j, home, 0, 1, false) // the first begin of the segment: the masks whole
	doc := w.write("Documents/a.txt", "mine")
	secret := w.write(".ssh/keep.txt", "a key")
	const x = "inv-x"
	if err := w.j.Begin(Begin{InvocationID: x, Executor: "write_files", Reverse: []string{"delete_created_paths"},
		Roots: []string{home}, Masks: masks, History: filepath.Join(home, ".local/share/metnos/_history")}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.j.Finish(x, Outcome{OK: true, Payload: map[string]any{"results": []any{
		map[string]any{"path": doc, "created": true}, map[string]any{"path": secret, "created": true}}}}); err != nil {
		t.Fatal(err)
	}
	ids := grow(t, w.j, home, 1, 60, true)

	dir := w.j.Dir()
	names, _ := filepath.Glob(filepath.Join(dir, "*"+chainlog.Ext))
	if len(names) < 4 || filepath.Base(names[0]) != journalFile {
		t.Fatalf("segments: %v", names)
	}
	for _, n := range names {
		b, _ := os.ReadFile(n)
		if c := bytes.Count(b, []byte(`"masks":`)); c != 1 {
			t.Errorf("%s names the masks %d times, want once", filepath.Base(n), c)
		}
		if bytes.Contains(b, []byte(`"invocation_id":"inv-x","open"`)) && bytes.Contains(b, []byte(`"kind":"begin","time"`)) {
			for _, line := range bytes.Split(b, []byte("\n")) {
				if bytes.Contains(line, []byte(`"invocation_id":"inv-x"`)) && bytes.Contains(line, []byte(`"kind":"begin"`)) && bytes.Contains(line, []byte(`"masks"`)) {
					t.Fatal("inv-x's begin record has the masks whole: the test does not read them by hash")
				}
			}
		}
	}
	if rep, err := chainlog.Verify(dir); err != nil || !rep.OK() || rep.Lines != 2*62 || rep.Files != len(names) {
		t.Fatalf("verify: %v %v", rep, err)
	}

	// Another process: the history, then a local undo of the old change.
	l, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	all, err := l.Newest(0)
	if err != nil || len(all) != 62 || all[0].InvocationID != ids[len(ids)-1] || all[60].InvocationID != x {
		t.Fatalf("history: %d entries, %v", len(all), err)
	}
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := j.Undo(x, w.history, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(doc); !os.IsNotExist(err) {
		t.Errorf("the created file is still there: %v", err)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Fatalf("a local undo of an old entry removed a masked file: %v", err)
	}
	if len(rep.Done) != 1 || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "hidden from executors") {
		t.Fatalf("undo: %+v", rep)
	}
	if e, _ := j.Entry(x); !slices.Equal(e.Masks, masks) {
		t.Fatalf("the masks read back: %v", e.Masks)
	}
	if rep, err := chainlog.Verify(dir); err != nil || !rep.OK() {
		t.Fatalf("verify after the undo: %v %v", rep, err)
	}
}

// TestOpenFindsWhatACrashLeftRunning: a restart reads only the end of
// the journal, yet finds every entry a crash left running, however much
// history comes before; and a journal written before segments and
// policies (masks in every begin record, no count of running entries)
// is read whole.
func TestOpenFindsWhatACrashLeftRunning(t *testing.T) {
	smallSegments(t)
	w := newWorld(t)
	grow(t, w.j, w.folder, 0, 100, false)
	for _, id := range []string{"inv-a", "inv-b"} {
		if err := w.j.Begin(Begin{InvocationID: id, Executor: "write_files", Roots: []string{w.folder}, Masks: []string{"/m"}}); err != nil {
			t.Fatal(err)
		}
	}
	grow(t, w.j, w.folder, 100, 40, false) // runs that ended while b ran
	if _, err := w.j.Finish("inv-a", Outcome{OK: true}); err != nil {
		t.Fatal(err)
	}
	j, err := Open(w.j.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if got := j.Unfinished(); !slices.Equal(got, []string{"inv-b"}) {
		t.Fatalf("after the crash: %v running, want inv-b", got)
	}
	if err := j.Interrupt("inv-b"); err != nil {
		t.Fatal(err)
	}
	if j2, _ := Open(w.j.Dir()); len(j2.Unfinished()) != 0 {
		t.Fatalf("after marking it interrupted: %v running", j2.Unfinished())
	}

	// The journal of an older agent.
	dir := filepath.Join(t.TempDir(), "history")
	log, err := chainlog.Open(dir, chainlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ok := true
	for _, r := range []record{
		{Kind: kindBegin, ID: "old-1", Executor: "write_files", Roots: []string{w.folder}, Masks: []string{"/m1", "/m2"}, History: "/h"},
		{Kind: kindBegin, ID: "old-2", Executor: "write_files", Roots: []string{w.folder}, Masks: []string{"/m1", "/m2"}, History: "/h"},
		{Kind: kindChange, ID: "old-1", OK: &ok},
		{Kind: kindBegin, ID: "old-3", Executor: "write_files", Roots: []string{w.folder}, Masks: []string{"/m1", "/m2"}, History: "/h"},
		{Kind: kindChange, ID: "old-3", OK: &ok},
	} {
		if _, err := log.Append(journalFile, r); err != nil {
			t.Fatal(err)
		}
	}
	j, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := j.Unfinished(); !slices.Equal(got, []string{"old-2"}) {
		t.Fatalf("in an old journal: %v running, want old-2", got)
	}
	if e, _ := j.Entry("old-1"); !slices.Equal(e.Masks, []string{"/m1", "/m2"}) || e.History != "/h" || e.State() != "done" {
		t.Fatalf("an old entry: %+v", e)
	}
}

// TestARestartStillRecognisesAReverse: the server's undo of a change
// made before the agent restarted is recognised: the newest entries are
// read back when a run ends.
func TestARestartStillRecognisesAReverse(t *testing.T) {
	w := newWorld(t)
	p := w.write("made.txt", "x")
	made := w.run("write_files", []string{"delete_created_paths"}, nil, func() map[string]any {
		return map[string]any{"ok": true, "results": []any{map[string]any{"path": p, "created": true}}}
	})
	grow(t, w.j, w.folder, 0, 30, false)
	j, err := Open(w.j.Dir())
	if err != nil {
		t.Fatal(err)
	}
	w.j = j
	w.run("delete_files", nil, map[string]any{"paths": []any{p}}, func() map[string]any {
		os.Remove(p)
		return map[string]any{"ok": true, "results": []any{map[string]any{"path": p, "removed": true}}}
	})
	if e, _ := j.Entry(made); e.State() != "undone" {
		t.Fatalf("after the server's reverse, following a restart: %s", e.State())
	}
}
