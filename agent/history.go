package agent

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/undo"
	"github.com/metnos/agent/wire"
)

// journaled reports whether an invocation goes into the history
// journal: its executor can write or declares reverse patterns, or the
// server says it is reversible.
func journaled(inv *invocation) bool {
	r, m := inv.Reversibility, inv.ex.Manifest
	return m.Facts.Writes() || len(m.Reverse()) > 0 || (r != "" && r != "read_only")
}

// writeRoots are the folders and files a run's sandbox lets it write,
// but the agent's own.
func writeRoots(p policy.Policy) []string {
	var roots []string
	for _, g := range p.Grants {
		if g.Access == policy.Write && !g.Own {
			roots = append(roots, g.Path)
		}
	}
	return roots
}

// beginJournal records an invocation about to run, if it is journaled.
func (a *Agent) beginJournal(inv *invocation, req sandbox.Request) error {
	ex := inv.ex
	if !journaled(inv) || inv.dryBy != "" {
		// A dry run changes nothing: there is nothing to undo.
		return nil
	}
	var masks []string
	for _, m := range req.Policy.Masks {
		masks = append(masks, m.Path)
	}
	return a.journal.Begin(undo.Begin{InvocationID: inv.ID, TurnID: inv.TurnID, Executor: ex.Name,
		ManifestSHA256: inv.ManifestSHA256, Reverse: ex.Manifest.Reverse(), Roots: writeRoots(req.Policy), Masks: masks, History: a.history()})
}

// finishJournal records a journaled invocation's outcome, says which
// earlier changes it put back, and enforces the blob quota when it kept
// blobs. A failure is logged: the result is already spooled.
//
// sent is the result as the server is sent it: the entry's ok and
// error class are its own. payload is the executor's whole output, which
// the rows of what the run changed are read from: a result cut to fit
// the server's limit is sent without it, but the run did change the
// disk, and a local undo must still be able to put that back.
func (a *Agent) finishJournal(inv *invocation, sent result.Result, payload any) {
	// The journal reads only the strings of the arguments.
	o := undo.Outcome{OK: sent.OK, ErrorClass: sent.ErrorClass, Payload: payload, Args: inv.strs, Busy: a.busyRoots()}
	f, err := a.journal.Finish(inv.ID, o)
	if errors.Is(err, undo.ErrNotOpen) {
		return // not journaled
	}
	if err != nil {
		a.log.Error("could not record the change in the history journal (is the data folder full?); it is retried while the agent runs, and until then the change cannot be undone from this device's history (undo --offline)", "invocation", inv.ID, "err", err)
		// Recorded later, what the run left is looked at late: a local
		// undo then keeps both versions (undo.Outcome.Recovered).
		o.Recovered = true
		a.redo = append(a.redo, redo{id: inv.ID, what: "history journal", do: func() error {
			_, err := a.journal.Finish(inv.ID, o)
			if errors.Is(err, undo.ErrNotOpen) {
				return nil // finished meanwhile
			}
			return err
		}})
		return
	}
	for _, id := range f.Undid {
		a.log.Info("this invocation put back changes of an earlier one", "invocation", inv.ID, "undid", id)
	}
	if f.KeptBlobs {
		a.expireBlobs(a.cfg.HistoryRetention)
	}
	// An agent that runs for months prunes while it runs (a look at the
	// oldest segment when there is nothing to remove).
	a.pruneJournal()
}

// pruneJournal removes the history journal's segments past
// Config.JournalRetention; what it removed is logged, and `history`
// says it.
func (a *Agent) pruneJournal() {
	p, err := a.journal.Prune(a.cfg.JournalRetention, time.Now())
	if err != nil {
		a.log.Warn("history journal retention", "err", err)
		return
	}
	if p.Entries > 0 {
		a.log.Info("history journal pruned", "changes", p.Entries, "before", p.Before, "retention_days", p.RetentionDays)
	}
}

// auditRecord writes the audit line of an invocation whose result was
// spooled: its body (what the server is sent) is the output measured.
// A failure is logged; the result is not held back for it.
func (a *Agent) auditRecord(inv *invocation, r result.Result, body []byte) {
	rec := audit.Record{Time: time.Now(), InvocationID: inv.ID, TurnID: inv.TurnID, Executor: inv.Executor,
		ManifestSHA256: inv.ManifestSHA256, Args: inv.Args, Output: body, DurationMS: r.ElapsedMS,
		OK: r.OK, ErrorClass: r.ErrorClass, Sandbox: r.Sandbox, Policy: r.Policy, Network: auditNetwork(inv.net),
		RefusedBy: inv.refusedBy, OwnerMode: ownerMode(inv.lim), DryRun: inv.dryBy != ""}
	if err := a.audit.Write(rec); err != nil {
		a.log.Error("could not write the audit record (is the data folder full?); it is retried while the agent runs", "invocation", inv.ID, "err", err)
		a.redo = append(a.redo, redo{id: inv.ID, what: "audit log", do: func() error { return a.audit.Write(rec) }})
	}
	a.pruneAuditDaily()
}

// auditUnknown writes the audit lines of the invocations a crash cut
// short, whose "outcome unknown" results the spool recovery made.
func (a *Agent) auditUnknown(ids []string) {
	for _, id := range ids {
		e, _ := a.journal.Entry(id)
		body, _ := a.spool.Body(id)
		err := a.audit.Write(audit.Record{InvocationID: id, TurnID: e.TurnID, Executor: e.Executor, ManifestSHA256: e.ManifestSHA256,
			Output: body, ErrorClass: wire.ClassExecutionOutcomeUnknown, Sandbox: "unknown_after_restart"})
		if err != nil {
			a.log.Error("could not write the audit record", "invocation", id, "err", err)
		}
	}
}

// recoverJournal settles the journal entries a crash left open: one
// whose result was spooled is finished from it (the crash came between
// the two), marked recovered: the files the run left are looked at only
// now, so a local undo keeps both versions rather than trust that look.
// Any other is marked interrupted.
func (a *Agent) recoverJournal(unknown []string) error {
	for _, id := range a.journal.Unfinished() {
		var r struct {
			OK         bool   `json:"ok"`
			ErrorClass string `json:"error_class"`
			Payload    any    `json:"payload"`
		}
		body, ok := a.spool.Body(id)
		if ok && !slices.Contains(unknown, id) && json.Unmarshal(body, &r) == nil {
			a.log.Warn("the agent stopped before recording a change in the history journal; recorded now from the spooled result", "invocation", id)
			if _, err := a.journal.Finish(id, undo.Outcome{OK: r.OK, ErrorClass: r.ErrorClass, Payload: r.Payload, Recovered: true}); err != nil {
				return err
			}
			continue
		}
		a.log.Warn("the agent stopped while this invocation ran: the history journal marks it interrupted (what it changed is not known)", "invocation", id)
		if err := a.journal.Interrupt(id); err != nil {
			return err
		}
	}
	return nil
}

var blobName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9a-f]{64})\.bin$`) })

// checkBlobs verifies every backup blob an invocation's arguments name
// (the server's restore_blob_backup sends move_files with copy:true from
// a blob): a blob whose bytes no longer have the SHA-256 it is named by
// is refused before anything runs, so a corrupted blob is never
// restored.
func (a *Agent) checkBlobs(inv *invocation) error {
	history := a.history()
	for _, s := range inv.strs {
		if !filepath.IsAbs(s) || !fspath.Within(filepath.Clean(s), history) {
			// Not a blob of the history folder (CheckBlob refuses a
			// path that only looks inside it, with "..").
			continue
		}
		if m := blobName().FindStringSubmatch(filepath.Base(s)); m != nil {
			if err := undo.CheckBlob(history, s, m[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// redo is a write to the history journal or the audit log that failed
// after a run (a full data folder), retried at each round of the run
// loop until it succeeds (see retry).
type redo struct {
	id, what string
	do       func() error
}

// retry makes the writes that failed after a run again, in order, and
// keeps those that fail again for the next round.
func (a *Agent) retry() {
	kept := a.redo[:0]
	for _, w := range a.redo {
		if err := w.do(); err != nil {
			a.log.Debug("still cannot write", "to", w.what, "invocation", w.id, "err", err)
			kept = append(kept, w)
			continue
		}
		a.log.Info("written now that there is room", "to", w.what, "invocation", w.id)
	}
	a.redo = kept
}

// auditNetwork is the audit line's account of a run's egress proxy:
// every connection it allowed or refused, nil for a run without one.
func auditNetwork(n *sandbox.NetReport) *audit.Network {
	if n == nil {
		return nil
	}
	an := &audit.Network{Proxy: n.Proxy, Enforced: n.Enforced, Refused: n.Refused, More: n.Overflow}
	for _, c := range n.Conns {
		an.Conns = append(an.Conns, audit.Conn{Proto: c.Proto, Host: c.Host, Port: c.Port, Addr: c.Addr, Up: c.Up, Down: c.Down, Verdict: c.Verdict, Reason: c.Reason})
	}
	return an
}
