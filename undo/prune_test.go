package undo

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// TestPruneRemovesOldSegmentsAndTheChainStillHolds: pruning removes
// the segments older than the retention, never the one being written
// nor one where a change is still running, says how many changes went
// and up to when, and the chain of what is kept still verifies, still
// shows an edit, and shows a segment removed by hand.
func TestPruneRemovesOldSegmentsAndTheChainStillHolds(t *testing.T) {
	smallSegments(t)
	w := newWorld(t)
	old := grow(t, w.j, w.folder, 0, 40, false)
	if err := w.j.Begin(Begin{InvocationID: "inv-running", Executor: "write_files", Roots: []string{w.folder}}); err != nil {
		t.Fatal(err)
	}
	grow(t, w.j, w.folder, 40, 40, false)
	time.Sleep(20 * time.Millisecond)
	cut := time.Now()
	time.Sleep(20 * time.Millisecond)
	recent := grow(t, w.j, w.folder, 80, 30, false)
	dir := w.j.Dir()
	before, _ := chainlog.Files(dir)

	day := 24 * time.Hour
	// Everything before cut is past retention, but inv-running's
	// segment and those after it stay.
	p, err := w.j.Prune(day, cut.Add(day))
	if err != nil {
		t.Fatal(err)
	}
	after, _ := chainlog.Files(dir)
	if p.Entries == 0 || len(after) >= len(before) || after[0] == journalFile {
		t.Fatalf("pruned %+v: %v -> %v", p, before, after)
	}
	all, err := w.j.Newest(0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range all {
		ids = append(ids, e.InvocationID)
	}
	if !slices.Contains(ids, "inv-running") || slices.Contains(ids, old[0]) || !slices.Contains(ids, recent[0]) {
		t.Fatalf("after pruning: %v", ids)
	}
	if p.Entries != 111-len(all) {
		t.Fatalf("pruned %d entries, %d kept, of 111", p.Entries, len(all))
	}
	if got, ok, err := PrunedFrom(dir); err != nil || !ok || got.Entries != p.Entries || got.RetentionDays != 1 || got.Before.After(cut) {
		t.Fatalf("what was pruned: %+v %v %v", got, ok, err)
	}
	if s := p.String(); !strings.Contains(s, "older changes before ") || !strings.HasSuffix(s, "were pruned (retention 1 days)") {
		t.Fatalf("says %q", s)
	}
	if _, err := w.j.Undo(old[0], w.history, true); err == nil || !strings.Contains(err.Error(), "were pruned (retention 1 days)") {
		t.Fatalf("undo of a pruned change: %v", err)
	}
	if rep, err := chainlog.Verify(dir); err != nil || !rep.OK() || rep.Files != len(after) {
		t.Fatalf("verify after pruning: %v %v", rep, err)
	}
	// A restart still finds the running one, and the journal goes on.
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := j.Unfinished(); !slices.Equal(got, []string{"inv-running"}) {
		t.Fatalf("running after pruning: %v", got)
	}
	if err := j.Interrupt("inv-running"); err != nil {
		t.Fatal(err)
	}
	// Now its segment goes too, and the count adds up.
	p2, err := j.Prune(day, time.Now().Add(day+time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := PrunedFrom(dir); p2.Entries == 0 || got.Entries != p.Entries+p2.Entries {
		t.Fatalf("second prune %+v, in all %+v", p2, got)
	}
	if rep, err := chainlog.Verify(dir); err != nil || !rep.OK() {
		t.Fatalf("verify after the second prune: %v %v", rep, err)
	}
	files, _ := chainlog.Files(dir)
	if len(files) != 1 {
		t.Fatalf("the segment being written was pruned, or an old one kept: %v", files)
	}

	// An edit of the first line kept is still seen.
	first := filepath.Join(dir, files[0])
	raw, _ := os.ReadFile(first)
	i := bytes.IndexByte(raw, '\n')
	edited := append(bytes.Replace(raw[:i], []byte(`"kind":"`), []byte(`"kind":"x`), 1), raw[i:]...)
	os.WriteFile(first, edited, 0o600)
	if rep, err := chainlog.Verify(dir); err != nil || rep.OK() || rep.File != files[0] || rep.Line != 1 {
		t.Fatalf("an edit of the first line kept: %v (good %d) %v", rep, rep.Good, err)
	}
	os.WriteFile(first, raw, 0o600)
	// So is the first line's prev changed to pass for the chain's start.
	os.WriteFile(first, bytes.Replace(raw, raw[bytes.Index(raw, []byte(`"prev":"`))+8:][:64], bytes.Repeat([]byte("0"), 64), 1), 0o600)
	if rep, err := chainlog.Verify(dir); err != nil || rep.OK() || !strings.Contains(rep.Problem, "pruned") {
		t.Fatalf("a first line that claims to start the chain: %v %v", rep, err)
	}
	os.WriteFile(first, raw, 0o600)
	if rep, err := chainlog.Verify(dir); err != nil || !rep.OK() {
		t.Fatalf("put back: %v %v", rep, err)
	}
}

// TestPruneKeepsRecentHistory: nothing within the retention goes.
func TestPruneKeepsRecentHistory(t *testing.T) {
	smallSegments(t)
	w := newWorld(t)
	grow(t, w.j, w.folder, 0, 60, false)
	files, _ := chainlog.Files(w.j.Dir())
	if p, err := w.j.Prune(DefaultRetention, time.Now()); err != nil || p.Entries != 0 {
		t.Fatalf("pruned %+v %v", p, err)
	}
	if after, _ := chainlog.Files(w.j.Dir()); !slices.Equal(files, after) {
		t.Fatalf("%v -> %v", files, after)
	}
	if _, ok, err := PrunedFrom(w.j.Dir()); ok || err != nil {
		t.Fatalf("says something was pruned: %v", err)
	}
}
