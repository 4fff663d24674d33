package agent

import (
	"path/filepath"
	"testing"

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
