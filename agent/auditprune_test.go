package agent

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/internal/chainlog"
	"github.com/metnos/agent/wire"
)

// writeAuditDays writes one line on each of days consecutive days from
// first into the audit log in dir.
func writeAuditDays(t *testing.T, dir string, first time.Time, days int) {
	t.Helper()
	l, err := audit.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for d := range days {
		at := first.AddDate(0, 0, d)
		if err := l.Write(audit.Record{Time: at, InvocationID: fmt.Sprintf("inv-old-%d", d), Executor: "echo", OK: true}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStartPrunesTheAuditLog: at start the agent removes the audit
// log's days older than its retention (a year by default), logs what it
// removed at info level, and what is kept still verifies.
func TestStartPrunesTheAuditLog(t *testing.T) {
	a := testAgent(t, "http://127.0.0.1:1")
	a.Close()
	dir := a.cfg.Layout.Audit()
	old := time.Now().AddDate(-2, 0, 0).UTC()
	writeAuditDays(t, dir, old, 5)
	recent := time.Now().UTC().AddDate(0, 0, -1)
	writeAuditDays(t, dir, recent, 1)

	var logs syncBuffer
	cfg := a.cfg
	cfg.AuditRetention = 0 // the default: a year
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.Close() // waits for the start's sweep
	p, ok, err := audit.PrunedFrom(dir)
	want := audit.Pruned{Lines: 5, Files: 5, Before: recent.Format(time.DateOnly), RetentionDays: 365}
	if err != nil || !ok || p != want {
		t.Fatalf("pruned at start: %+v %v %v; want %+v", p, ok, err, want)
	}
	if rep, err := audit.Verify(dir); err != nil || !rep.OK() || rep.Lines != 1 || rep.Files != 1 {
		t.Fatalf("the audit log kept: %v %v", rep, err)
	}
	if !strings.Contains(logs.String(), `level=INFO msg="audit log pruned" lines=5 files=5`) {
		t.Fatalf("the agent's log does not say what was pruned:\n%s", logs.String())
	}
}

// TestRunningAgentPrunesTheAuditLogDaily: an agent that runs for months
// applies the audit retention when a run's audit line is written, once
// a day, not only at start.
func TestRunningAgentPrunesTheAuditLogDaily(t *testing.T) {
	a := testAgent(t, "http://127.0.0.1:1")
	a.Close()
	dir := a.cfg.Layout.Audit()
	writeAuditDays(t, dir, time.Now().UTC().AddDate(0, 0, -100), 3)
	b, err := New(a.cfg) // a year's retention: nothing to remove at start
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.waitSwept()
	if _, ok, _ := audit.PrunedFrom(dir); ok {
		t.Fatal("pruned at start, within the retention")
	}
	// The lines are now past the retention (as if the agent had run
	// for 300 days since).
	b.cfg.AuditRetention = 30 * 24 * time.Hour
	inv := &invocation{Invocation: wire.Invocation{ID: "inv-18ed65bd51bdc701fcd26b70", Executor: "echo"}}
	b.auditRecord(inv, result.Result{OK: true}, []byte(`{"ok":true}`))
	if _, ok, _ := audit.PrunedFrom(dir); ok {
		t.Fatal("pruned again less than a day after the start's prune")
	}
	b.auditPrunedAt.Store(time.Now().Add(-25 * time.Hour).UnixNano())
	inv.ID = "inv-18ed65bd51bdc701fcd26b71"
	b.auditRecord(inv, result.Result{OK: true}, []byte(`{"ok":true}`))
	p, ok, err := audit.PrunedFrom(dir)
	if err != nil || !ok || p.Lines != 3 || p.Files != 3 || p.RetentionDays != 30 {
		t.Fatalf("pruned a day later: %+v %v %v", p, ok, err)
	}
	if rep, err := chainlog.Verify(dir); err != nil || !rep.OK() || rep.Lines != 2 {
		t.Fatalf("the audit log kept: %v %v", rep, err)
	}
}
