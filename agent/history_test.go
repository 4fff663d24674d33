package agent

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/metnos/agent/internal/chainlog"
	"github.com/metnos/agent/undo"
)

// TestJournalRecovery: a crash between spooling a result and recording
// its change leaves a begun journal entry; the next start finishes it
// from the spooled result. A crash during the run (no result) leaves it
// marked interrupted.
func TestJournalRecovery(t *testing.T) {
	a := testAgent(t, "http://127.0.0.1:1")
	const done, cut = "inv-18ed65bd51bdc701fcd26b60", "inv-18ed65bd51bdc701fcd26b61"
	for _, id := range []string{done, cut} {
		if err := a.spool.Start(id, "revertible", true); err != nil {
			t.Fatal(err)
		}
		if err := a.journal.Begin(undo.Begin{InvocationID: id, Executor: "move_files", Reverse: []string{"swap_src_dst"}}); err != nil {
			t.Fatal(err)
		}
	}
	body := `{"invocation_id":"` + done + `","ok":true,"payload":{"results":[{"src":"/a/x.jpg","dst":"/a/2024/x.jpg"}],"dirs_created":["/a/2024"]}}`
	if _, err := a.spool.Finish(done, []byte(body)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b, err := New(a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	j, err := undo.Load(b.cfg.Layout.Journal())
	if err != nil {
		t.Fatal(err)
	}
	// Recorded late: marked so, so that a local undo keeps both
	// versions of what a user may have changed since.
	if e, _ := j.Entry(done); !e.Finished || !e.Recovered || len(e.Rows) != 1 || e.Rows[0].Dst != "/a/2024/x.jpg" || len(e.DirsCreated) != 1 {
		t.Fatalf("the entry whose result was spooled: %+v", e)
	}
	if e, _ := j.Entry(cut); e.State() != "interrupted" {
		t.Fatalf("the entry whose run was cut short: %s", e.State())
	}
	if n, _ := filepath.Glob(filepath.Join(b.cfg.Layout.Data, "audit", "*.jsonl")); len(n) != 1 {
		t.Fatalf("no audit line for the run cut short: %v", n)
	}
}

// TestStartPrunesTheJournal: at start the agent removes the journal's
// segments older than its retention (a year by default), and what is
// kept still verifies.
func TestStartPrunesTheJournal(t *testing.T) {
	a := testAgent(t, "http://127.0.0.1:1")
	a.Close()
	dir := a.cfg.Layout.Journal()
	log, err := chainlog.Open(dir, chainlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().AddDate(-2, 0, 0).UTC()
	ok := true
	for i := range 40 {
		id := fmt.Sprintf("inv-old-%d", i)
		for _, r := range []map[string]any{
			{"kind": "begin", "time": old, "invocation_id": id, "executor": "write_files", "roots": []string{"/home/u/Documents"}},
			{"kind": "change", "time": old, "invocation_id": id, "ok": ok},
		} {
			if _, err := log.Append("journal.jsonl", r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := log.Append("journal_000002.jsonl", map[string]any{"kind": "begin", "time": time.Now().UTC(), "invocation_id": "inv-new", "executor": "write_files"}); err != nil {
		t.Fatal(err)
	}
	b, err := New(a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.Close() // waits for the start's sweep
	p, ok, err := undo.PrunedFrom(dir)
	if err != nil || !ok || p.Entries != 40 || p.RetentionDays != 365 || !p.Before.Equal(old) {
		t.Fatalf("pruned at start: %+v %v %v", p, ok, err)
	}
	if rep, err := chainlog.Verify(dir); err != nil || !rep.OK() || rep.Lines != 2 {
		t.Fatalf("the journal kept: %v %v", rep, err)
	}
}
