package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/fspath"
)

// ownerRefusal says why the owner's limits refuse inv, whose executor
// is verified and whose arguments are read, before it runs (nil: they
// let it run): an argument inside a never folder; in readonly mode, an
// executor that writes (its manifest declares fs:write, the one
// capability that grants writing). In preview mode, it marks inv for a
// dry run instead (see dryRunOf), which a device that cannot make the
// copy-on-write layer refuses rather than run for real. The executors the limits refuse by
// name are refused before the executor is fetched (see execute).
func (a *Agent) ownerRefusal(inv *invocation) error {
	if p, n, ok := neverArg(inv.lim, inv.host.Home, inv.strs); ok {
		return inv.lim.Refused(fmt.Sprintf("never lists %q, which holds %q", n, p))
	}
	if !inv.ex.Manifest.Facts.Writes() {
		return nil
	}
	switch inv.lim.InForce() {
	case config.ModeReadonly:
		return inv.lim.Refused(`mode = "readonly" refuses executors that write`)
	case config.ModePreview:
		inv.preview = true
	case config.ModeSupervised:
		inv.log.Warn(`the owner's mode is "supervised": this executor writes; it runs, and its run is recorded as every run is (history, audit log)`)
	}
	return nil
}

// neverArg finds an argument string that names a path inside one of
// the never folders of lim (home is the home folder ~ stands for, as
// itself, or where its symbolic links lead): the path and the never
// entry, as the file writes it.
func neverArg(lim config.Limits, home string, strs []string) (path, never string, ok bool) {
	if len(lim.Never) == 0 {
		return "", "", false
	}
	for _, s := range strs {
		p := s
		switch {
		case p == "~" || strings.HasPrefix(p, "~/"):
			p = filepath.Join(home, p[1:])
		case !filepath.IsAbs(p):
			continue
		}
		p = filepath.Clean(p)
		cands := []string{p}
		if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
			cands = append(cands, r)
		}
		for i, n := range lim.Never {
			ns := []string{n}
			if r, err := filepath.EvalSymlinks(n); err == nil && r != n {
				ns = append(ns, r)
			}
			for _, c := range cands {
				for _, n2 := range ns {
					if fspath.Within(c, n2) {
						return s, lim.NeverAsWritten[i], true
					}
				}
			}
		}
	}
	return "", "", false
}

// refusedByOwner is the result of an invocation the owner's limits
// refused (err wraps the [*config.RefusedError]; ok is false when it
// does not): a device_error, as every refusal of what an executor
// needs is (docs/protocol.md §12.1), whose error says the rule, logged
// at warn and marked for the audit line and `history`.
func (a *Agent) refusedByOwner(inv *invocation, err error) (result.Result, bool) {
	var re *config.RefusedError
	if !errors.As(err, &re) {
		return result.Result{}, false
	}
	inv.refusedBy = re.Error()
	inv.log.Warn("refused by the owner's limits; not run", "rule", re.Rule, "limits", re.File)
	return result.DeviceError(fmt.Errorf("executor %s: not run on this device: %w", inv.Executor, re)), true
}

// ownerMode is the owner's mode of lim for an audit line: "" for full.
func ownerMode(lim config.Limits) string {
	if m := lim.InForce(); m != config.ModeFull {
		return string(m)
	}
	return ""
}

// limitsStat is what the run loop looks at of the limits file between
// polls: a change of any of it makes it read the file.
type limitsStat struct {
	exists bool
	size   int64
	mtime  time.Time
}

// statLimits is path's limitsStat.
func statLimits(path string) limitsStat {
	fi, err := os.Stat(path)
	if err != nil {
		return limitsStat{}
	}
	return limitsStat{exists: true, size: fi.Size(), mtime: fi.ModTime()}
}

// startLimits puts Config.Limits in force and records in the audit log
// what changed in the file since the agent last put it in force (the
// copy it keeps, Layout.LimitsSeen): a change made while no agent ran.
func (a *Agent) startLimits() {
	a.lim = a.cfg.Limits
	a.limStat = statLimits(a.lim.File)
	a.limSeen = a.lim.SHA256
	if a.lim.Present {
		a.log.Info("the owner's limits are in force", "limits", a.lim.File, "mode", a.lim.InForce(), "never", len(a.lim.Never),
			"executors_allow", len(a.lim.Executors.Allow), "executors_deny", len(a.lim.Executors.Deny))
	}
	seen, err := os.ReadFile(a.cfg.Layout.LimitsSeen())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		a.log.Warn("the copy of the owner's limits last put in force cannot be read; the limits file is compared with none", "copy", a.cfg.Layout.LimitsSeen(), "err", err)
	}
	if err != nil {
		seen = nil
	}
	if sha(seen) == a.lim.SHA256 {
		return
	}
	rec := audit.LimitsChange{File: a.lim.File, Seen: "start", OldSHA256: sha(seen), NewSHA256: a.lim.SHA256,
		Changes: a.limitsDiff(seen, a.lim.Data), InForce: true}
	what := "the owner's limits file changed while no agent ran; in force now, and recorded in the audit log"
	if seen == nil {
		what = "the owner's limits file is seen for the first time; in force now, and recorded in the audit log"
	}
	a.log.Warn(what, "limits", a.lim.File, "changes", changesText(rec.Changes))
	a.recordLimits(rec)
}

// watchLimits looks at the owner's limits file between polls: when its
// size or time changed and its bytes differ from the last
// ones seen, it reads it again (Config.ReloadLimits), puts it in force
// or, when it is refused, keeps the limits in force, and records the
// change in the audit log either way.
func (a *Agent) watchLimits() {
	if a.cfg.ReloadLimits == nil || a.lim.File == "" {
		return
	}
	st := statLimits(a.lim.File)
	if st == a.limStat {
		return
	}
	a.limStat = st
	data, err := os.ReadFile(a.lim.File)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		a.log.Warn("the owner's limits file changed and cannot be read; the limits in force stay", "limits", a.lim.File, "err", err)
		return
	}
	if sum := sha(data); sum == a.limSeen {
		return // touched, not changed
	}
	lim, host, err := a.cfg.ReloadLimits()
	rec := audit.LimitsChange{File: a.lim.File, Seen: "run", OldSHA256: a.lim.SHA256, NewSHA256: sha(data)}
	if err != nil {
		a.limSeen = rec.NewSHA256
		rec.Error = err.Error()
		a.log.Error("the owner's limits file changed, and is refused: the limits in force stay as they were until it is fixed (metnos-agent limits says what is wrong)",
			"limits", a.lim.File, "err", err)
		a.recordLimits(rec)
		return
	}
	rec.NewSHA256, rec.InForce = lim.SHA256, true
	rec.Changes = a.limitsDiff(a.lim.Data, lim.Data)
	a.lim, a.host, a.limSeen = lim, host, lim.SHA256
	a.log.Warn("the owner's limits changed; in force from the next invocation, and recorded in the audit log", "limits", lim.File, "mode", lim.InForce(), "changes", changesText(rec.Changes))
	a.recordLimits(rec)
}

// recordLimits writes rec to the audit log and, when the new file is in
// force, keeps a copy of it (or removes the copy of a file removed) to
// compare the next change with.
func (a *Agent) recordLimits(rec audit.LimitsChange) {
	if err := a.audit.WriteLimits(rec); err != nil {
		a.log.Error("could not record the change of the owner's limits in the audit log (is the data folder full?)", "limits", rec.File, "err", err)
		return // the copy stays: the next start records it
	}
	if !rec.InForce {
		return
	}
	seen := a.cfg.Layout.LimitsSeen()
	var err error
	if a.lim.Present {
		err = atomicfile.WriteFile(seen, a.lim.Data, 0o600)
	} else if err = os.Remove(seen); errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err != nil {
		a.log.Warn("could not keep a copy of the owner's limits; the next start records this change again", "copy", seen, "err", err)
	}
}

// limitsDiff is what changed from the limits file old to new (nil: no
// file), as the files say, without the environment's overrides. A copy
// that no longer reads (an older build's) counts as the defaults.
func (a *Agent) limitsDiff(old, new []byte) []audit.Change {
	values := func(b []byte) config.Limits {
		if b == nil {
			return config.Limits{}
		}
		l, err := config.ParseLimits(b, a.lim.File, a.host.Home)
		if err != nil {
			return config.Limits{}
		}
		return l
	}
	var out []audit.Change
	for _, c := range config.DiffLimits(values(old), values(new)) {
		out = append(out, audit.Change{Key: c.Key, Old: c.Old, New: c.New})
	}
	return out
}

// changesText writes changes for the log: key old → new; ...
func changesText(changes []audit.Change) string {
	if len(changes) == 0 {
		return "none (comments or layout only)"
	}
	var s []string
	for _, c := range changes {
		s = append(s, fmt.Sprintf("%s %s → %s", c.Key, c.Old, c.New))
	}
	return strings.Join(s, "; ")
}

// sha is the SHA-256 of b in hex, "" for nil (no file).
func sha(b []byte) string {
	if b == nil {
		return ""
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
