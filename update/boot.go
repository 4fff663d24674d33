package update

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"
)

// Outcome is what [Boot] found.
type Outcome int

const (
	// Normal: no update is on probation; start as usual.
	Normal Outcome = iota
	// Probation: this build is on probation; it confirms with its first
	// successful poll ([Updater.Confirm]).
	Probation
	// RolledBack: this build failed its probation and the previous one
	// is back in place; exit 0 for the supervisor to start it.
	RolledBack
)

// Boot is the first thing `run` does: it puts back a build that a kill
// left aside, counts a start of a build on probation, and rolls back
// one that has used its [MaxBoots] starts without confirming. It never
// stops the agent from starting except by returning RolledBack; what it
// cannot do is logged and returned as err for the caller to log too.
func Boot(statePath string, f Files, log *slog.Logger) (Outcome, State, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if _, err := os.Lstat(f.Exe); errors.Is(err, fs.ErrNotExist) {
		// Only on Windows, between the two renames of a swap.
		if _, oerr := os.Lstat(f.Old); oerr == nil {
			if err := os.Rename(f.Old, f.Exe); err != nil {
				log.Error("update: the executable is missing and its previous build could not be put back", "exe", f.Exe, "err", err)
			} else {
				log.Warn("update: an update was cut short between its two renames; the previous build is back in place", "exe", f.Exe)
			}
		}
	}
	st, err := LoadState(statePath)
	if err != nil {
		log.Warn("update: the update record is unreadable; starting afresh", "err", err)
	}
	if st.Phase != PhaseProbation {
		return Normal, st, nil
	}
	sum, herr := FileSHA256(f.Exe)
	switch {
	case herr != nil:
		log.Error("update: cannot read the executable to check the update on probation", "exe", f.Exe, "err", herr)
		return Normal, st, herr
	case sum == st.Previous:
		if st.Failed != nil && st.Failed.RolledBack && st.Failed.SHA256 == st.SHA256 {
			// Killed after a rollback, before its record was final.
			log.Error("update: rolled back: the new build "+st.Failed.Reason+"; the previous build is back in place", "version", st.Version)
		} else {
			// Killed after the marker, before the new build was in place.
			log.Warn("update: the update to "+st.Version+" was cut short before the new build was in place; this build goes on and the update is tried again", "version", st.Version)
		}
		if same(f.Exe, f.Old) {
			os.Remove(f.Old)
		}
		st.Phase, st.Version, st.SHA256, st.Previous, st.Boots = PhaseNone, "", "", "", 0
		return Normal, st, SaveState(statePath, st)
	case sum != st.SHA256:
		log.Warn("update: the executable is neither the build on probation nor the one it replaced (replaced by hand?); the probation ends", "exe", f.Exe, "version", st.Version)
		st.Phase, st.Version, st.SHA256, st.Previous, st.Boots = PhaseNone, "", "", "", 0
		return Normal, st, SaveState(statePath, st)
	}
	if st.Boots < MaxBoots {
		st.Boots++
		if err := SaveState(statePath, st); err != nil {
			// Without the count, a build that crashes would never be
			// rolled back: say so, loudly, and go on.
			log.Error("update: cannot count this start of the build on probation", "version", st.Version, "err", err)
			return Probation, st, err
		}
		log.Info("update: this build is on probation until its first successful poll", "version", st.Version, "start", st.Boots, "of", MaxBoots)
		return Probation, st, nil
	}
	reason := fmt.Sprintf("started %d times without reaching a successful poll", st.Boots)
	if osum, err := FileSHA256(f.Old); err != nil || osum != st.Previous {
		log.Error("update: the build on probation failed, and the previous build is not there to go back to; keeping this one", "version", st.Version, "old", f.Old, "err", err)
		st.Failed = &Failure{Version: st.Version, SHA256: st.SHA256, Reason: reason + "; the previous build was missing, so it was kept", At: time.Now().UTC()}
		st.Phase, st.Version, st.SHA256, st.Previous, st.Boots = PhaseNone, "", "", "", 0
		return Normal, st, SaveState(statePath, st)
	}
	// The failure is recorded before the rollback: a kill between the
	// two leaves a record that the next start reads right (either the
	// rollback again, or the previous build with the failure noted).
	st.Failed = &Failure{Version: st.Version, SHA256: st.SHA256, Reason: reason, At: time.Now().UTC(), RolledBack: true}
	if err := SaveState(statePath, st); err != nil {
		log.Error("update: cannot record the failed update before rolling it back", "err", err)
	}
	if err := rollback(f); err != nil {
		log.Error("update: rolling back the build on probation failed; trying again at the next start", "version", st.Version, "err", err)
		return Probation, st, err
	}
	log.Error("update: rolled back: the new build "+reason+"; the previous build is back in place (the failed one is kept as "+f.Failed+")", "version", st.Version)
	st.Phase, st.Version, st.SHA256, st.Previous, st.Boots = PhaseNone, "", "", "", 0
	if err := SaveState(statePath, st); err != nil {
		log.Error("update: cannot record the rollback", "err", err)
	}
	return RolledBack, st, nil
}

// same reports whether a and b are the same file.
func same(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}
