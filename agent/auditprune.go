package agent

import (
	"time"
)

// auditPruneEvery is how often a running agent applies the audit log's
// retention (at start, then when a run's audit line is written this
// long after the last time).
const auditPruneEvery = 24 * time.Hour

// pruneAudit removes the audit log's day files past
// Config.AuditRetention (see [audit.Log.Prune]); what it removed is
// logged, and `audit verify` says it.
func (a *Agent) pruneAudit(now time.Time) {
	a.auditPrunedAt.Store(now.UnixNano())
	p, err := a.audit.Prune(a.cfg.AuditRetention, now)
	if err != nil {
		a.log.Warn("audit log retention", "err", err)
		return
	}
	if p.Files > 0 {
		a.log.Info("audit log pruned", "lines", p.Lines, "files", p.Files, "before", p.Before, "retention_days", p.RetentionDays)
	}
}

// pruneAuditDaily prunes the audit log when it was last pruned more
// than auditPruneEvery ago: an agent that runs for months keeps it
// bounded without a restart.
func (a *Agent) pruneAuditDaily() {
	now := time.Now()
	if last := a.auditPrunedAt.Load(); now.Sub(time.Unix(0, last)) < auditPruneEvery {
		return
	}
	a.pruneAudit(now)
}
