package update

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/metnos/agent/internal/atomicfile"
)

// MaxBoots is how many starts a build on probation gets to confirm
// (reach a successful poll) before the next start rolls it back.
const MaxBoots = 2

// Phases of [State].
const (
	PhaseNone      = "none"
	PhaseProbation = "probation"
)

// State is the self-update's record, kept in the data folder
// (layout.UpdateState): the probation under way, the last version
// applied, and the last failure.
type State struct {
	// Phase is PhaseProbation from just before the swap until the new
	// build confirms or is rolled back, PhaseNone otherwise.
	Phase string `json:"phase"`
	// Version and SHA256 are the build on probation; Previous is the
	// sha256 of the build it replaced (what <exe>.old holds).
	Version  string `json:"version,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	Previous string `json:"previous_sha256,omitempty"`
	// From is the agent version the update started from (for the log).
	From string `json:"from,omitempty"`
	// Boots is how many times the build on probation has started.
	Boots int `json:"boots,omitempty"`
	// Applied is the mirror version of the last update this device
	// confirmed: a descriptor must be strictly newer.
	Applied string `json:"applied,omitempty"`
	// Failed is the last update that did not take, if any.
	Failed *Failure `json:"failed,omitempty"`
}

// Failure is an update that was refused after the download, or rolled
// back.
type Failure struct {
	Version string    `json:"version"`
	SHA256  string    `json:"sha256,omitempty"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
	// RolledBack says the build ran and was put back; false: it was
	// never put in place.
	RolledBack bool `json:"rolled_back,omitempty"`
	// Broken says the build was downloaded but does not start here
	// (`version` failed), or the server's file does not match its own
	// signed sha256 (fetched twice alike): like a rolled-back one, the
	// run loop does not download it again.
	Broken bool `json:"broken,omitempty"`
}

// LoadState reads the record at path. A missing file is a device that
// never updated (PhaseNone); a file that is not a record is an error
// that names it, for the caller to log: [Boot] then starts afresh
// rather than refuse to start.
func LoadState(path string) (State, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return State{Phase: PhaseNone}, nil
	}
	if err != nil {
		return State{Phase: PhaseNone}, fmt.Errorf("reading the update record %s: %w", path, err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil || (s.Phase != PhaseNone && s.Phase != PhaseProbation) {
		return State{Phase: PhaseNone}, fmt.Errorf("the update record %s is not one (%v): starting afresh", path, err)
	}
	return s, nil
}

// SaveState writes s to path atomically and durably.
func SaveState(path string, s State) error {
	if s.Phase == "" {
		s.Phase = PhaseNone
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(b, '\n'), 0o600)
}

// Summary is the record in a few words, for the heartbeat and
// `metnos-agent update --check`: "" when there is nothing to say.
func (s State) Summary() string {
	switch {
	case s.Phase == PhaseProbation:
		return fmt.Sprintf("on probation: %s, start %d of %d, not confirmed yet", s.Version, s.Boots, MaxBoots)
	case s.Failed != nil && s.Failed.RolledBack:
		return fmt.Sprintf("update to %s rolled back at %s: %s", s.Failed.Version, s.Failed.At.UTC().Format(time.RFC3339), s.Failed.Reason)
	case s.Failed != nil:
		return fmt.Sprintf("update to %s failed at %s: %s", s.Failed.Version, s.Failed.At.UTC().Format(time.RFC3339), s.Failed.Reason)
	}
	return ""
}
