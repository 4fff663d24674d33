package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/undo"
	"github.com/metnos/agent/wire"
)

// blockLog makes every append to the chained log in dir fail, as a full
// disk does, until the returned func is called: its lock file becomes a
// folder.
func blockLog(t *testing.T, dir string) func() {
	t.Helper()
	lock := filepath.Join(dir, "LOCK")
	os.Remove(lock)
	if err := os.MkdirAll(filepath.Join(lock, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	return func() { os.RemoveAll(lock) }
}

// TestJournalAndAuditWrittenWhenRoomReturns: a run whose change cannot
// be recorded in the history journal, nor its line in the audit log (a
// full data folder), is recorded in both once there is room, at the
// next round of the run loop, rather than left "running" until a
// restart calls it interrupted; the late record is marked recovered, so
// a local undo keeps both versions.
func TestJournalAndAuditWrittenWhenRoomReturns(t *testing.T) {
	a := testAgent(t, "http://127.0.0.1:1")
	id := "inv-18ed65bd51bdc701fcd26b70"
	if err := a.journal.Begin(undo.Begin{InvocationID: id, Executor: "write_files", Reverse: []string{"restore_blob_backup"}}); err != nil {
		t.Fatal(err)
	}
	inv := &invocation{Invocation: wire.Invocation{ID: id, Executor: "write_files"}, log: slog.New(slog.DiscardHandler)}
	r := result.Result{InvocationID: id, OK: true, Payload: map[string]any{"results": []any{map[string]any{"path": "/nowhere/a.txt", "created": true}}}}
	unblockJournal := blockLog(t, a.cfg.Layout.Journal())
	unblockAudit := blockLog(t, a.cfg.Layout.Audit())
	a.finishJournal(inv, r, r.Payload)
	a.auditRecord(inv, r, []byte(`{"ok":true}`))
	if len(a.redo) != 2 {
		t.Fatalf("%d writes waiting, want the journal's and the audit log's", len(a.redo))
	}
	a.retry() // still no room
	if e, _ := a.journal.Entry(id); e.Finished || len(a.redo) != 2 {
		t.Fatalf("recorded with no room: %s, %d waiting", e.State(), len(a.redo))
	}
	unblockJournal()
	unblockAudit()
	a.retry()
	if len(a.redo) != 0 {
		t.Fatalf("%d writes still waiting with room", len(a.redo))
	}
	e, _ := a.journal.Entry(id)
	if !e.Finished || !e.Recovered || len(e.Rows) != 1 {
		t.Fatalf("the journal entry once there is room: %s recovered=%v rows=%d", e.State(), e.Recovered, len(e.Rows))
	}
	a.Close()
	rep, err := audit.Verify(a.cfg.Layout.Audit())
	if err != nil || !rep.OK() || rep.Lines != 1 {
		t.Fatalf("the audit log once there is room: %+v %v", rep, err)
	}
}
