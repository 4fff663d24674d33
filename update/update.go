package update

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/wire"
)

// ErrRestart is returned by [Updater.Apply] once the new build is in
// place: the agent must exit 0 for its supervisor to start it.
var ErrRestart = errors.New("update: the new build is in place; exit for the supervisor to start it")

// errBroken marks the error of a build that does not start here: it is
// not downloaded again by the run loop.
var errBroken = errors.New("the new build does not run on this machine")

// Config configures an [Updater].
type Config struct {
	// StatePath is the update record (layout.UpdateState).
	StatePath string
	// Files are the executable this process was started from and the
	// update's files beside it (FilesFor of Executable, found at start).
	Files Files
	// Version is this build's version, for the log.
	Version string
	// Target is this build's target (wire.UpdateTarget).
	Target string
	// ServerKey is the pinned server key descriptors must verify with.
	ServerKey ed25519.PublicKey
	// Client is the paired server's client.
	Client *client.Client
	// Logger receives the update's log (nil: discarded).
	Logger *slog.Logger
	// Probation is the build on probation's state from [Boot]'s
	// outcome: true when this process must confirm it.
	Probation bool
}

// Updater checks for, applies and confirms updates of the running
// agent. Its methods are safe for concurrent use.
type Updater struct {
	cfg Config
	log *slog.Logger

	// work serializes what writes the update record (Apply, Confirm)
	// and is held for a whole download; mu guards probation and
	// summary, which the heartbeat reads meanwhile.
	work      sync.Mutex
	mu        sync.Mutex
	probation bool
	// answered is set once the server answered a poll (Answered).
	answered atomic.Bool
	summary  string
}

// set records the summary for the heartbeat, and the probation.
func (u *Updater) set(summary string, probation bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.summary, u.probation = summary, probation
}

// New returns an Updater for cfg.
func New(cfg Config) *Updater {
	u := &Updater{cfg: cfg, log: cfg.Logger, probation: cfg.Probation}
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	if st, err := LoadState(cfg.StatePath); err == nil {
		u.summary = st.Summary()
	}
	return u
}

// Summary is the update's state in a few words for the heartbeat: the
// probation under way, or the last update that failed or was rolled
// back; "" when there is nothing to say.
func (u *Updater) Summary() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.summary
}

// Probation reports whether this build is on probation (not confirmed
// yet).
func (u *Updater) Probation() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.probation
}

// Answered notes that the server answered a poll, with success or with
// an error of its own (an HTTP status): unlike a server that cannot be
// reached, that says something about this build.
func (u *Updater) Answered() { u.answered.Store(true) }

// ServerAnswered reports whether [Updater.Answered] was called since
// the process started.
func (u *Updater) ServerAnswered() bool { return u.answered.Load() }

// Confirm ends this build's probation: called after each successful
// poll, it does something only the first time, when the build is on
// probation. It records the version as applied and deletes the build
// it replaced. It reports whether it confirmed the build just now.
func (u *Updater) Confirm() bool {
	if !u.Probation() {
		return false
	}
	u.work.Lock()
	defer u.work.Unlock()
	st, err := LoadState(u.cfg.StatePath)
	if err != nil || st.Phase != PhaseProbation {
		u.mu.Lock()
		u.probation = false
		u.mu.Unlock()
		return false
	}
	st.Applied, st.Phase, st.Boots = st.Version, PhaseNone, 0
	if st.Failed != nil && wire.CompareVersions(st.Failed.Version, st.Applied) <= 0 {
		st.Failed = nil
	}
	version := st.Version
	st.Version, st.SHA256, st.Previous = "", "", ""
	if err := SaveState(u.cfg.StatePath, st); err != nil {
		u.log.Error("update: cannot record the confirmation; this build stays on probation", "version", version, "err", err)
		return false
	}
	u.set(st.Summary(), false)
	for _, p := range []string{u.cfg.Files.Old, u.cfg.Files.Failed} {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			u.log.Warn("update: cannot delete a previous build", "file", p, "err", err)
		}
	}
	u.log.Info("update confirmed: this build reached a successful poll; the previous build is deleted", "version", version, "agent_version", u.cfg.Version)
	return true
}

// Decision is what [Updater.Check] concluded about a descriptor.
type Decision struct {
	Descriptor wire.ComponentDescriptor
	// Apply says the descriptor should be applied; otherwise Why says
	// why not.
	Apply bool
	Why   string
}

// Check fetches and verifies the server's descriptor of this build's
// target and decides whether to apply it. force (an update asked for by
// hand) lets a version that was rolled back be applied again. Not
// forced (the run loop), a descriptor of the running build records its
// version as applied (see noteRunning). An error
// is a descriptor that could not be had or did not verify; a server
// that publishes no metnos-agent build gives a *client.ServerError with
// status 404.
func (u *Updater) Check(ctx context.Context, force bool) (Decision, error) {
	body, err := u.cfg.Client.ComponentDescriptor(ctx, wire.AgentComponent, u.cfg.Target)
	if err != nil {
		return Decision{}, err
	}
	d, err := wire.VerifyComponentDescriptor(body, u.cfg.ServerKey, wire.AgentComponent, u.cfg.Target)
	if err != nil {
		return Decision{}, err
	}
	st, err := LoadState(u.cfg.StatePath)
	if err != nil {
		u.log.Warn("update: the update record is unreadable", "err", err)
	}
	dec := Decision{Descriptor: d}
	sum, herr := FileSHA256(u.cfg.Files.Exe)
	switch {
	case herr != nil:
		return dec, fmt.Errorf("update: reading the running executable %s: %w", u.cfg.Files.Exe, herr)
	case st.Phase == PhaseProbation:
		dec.Why = fmt.Sprintf("the update to %s is on probation until its first successful poll", st.Version)
	case st.Applied != "" && wire.CompareVersions(d.Version, st.Applied) <= 0:
		dec.Why = fmt.Sprintf("the server offers %s, which is not newer than %s, the version this device last applied", d.Version, st.Applied)
	case sum == d.SHA256:
		dec.Why = fmt.Sprintf("this executable is already the build of %s", d.Version)
		if !force {
			u.noteRunning(d)
		}
	case !force && st.Failed != nil && st.Failed.RolledBack && st.Failed.SHA256 == d.SHA256:
		dec.Why = fmt.Sprintf("the build of %s was rolled back on this device (%s): a newer version is needed, or `metnos-agent update` by hand", d.Version, st.Failed.Reason)
	case !force && st.Failed != nil && st.Failed.Broken && st.Failed.SHA256 == d.SHA256:
		dec.Why = fmt.Sprintf("the build of %s failed here (%s): a newer version is needed, or `metnos-agent update` by hand", d.Version, st.Failed.Reason)
	default:
		dec.Apply = true
	}
	return dec, nil
}

// noteRunning records d's version as applied when the running
// executable is its build and no newer version was applied: a device
// installed with the server's current build then refuses an older
// descriptor replayed to it, as one that updated to it would. Only the
// run loop's check (not forced) calls it: it holds the lock `run` holds,
// while `update --check` holds none and must not write the record.
func (u *Updater) noteRunning(d wire.ComponentDescriptor) {
	u.work.Lock()
	defer u.work.Unlock()
	st, err := LoadState(u.cfg.StatePath)
	if err != nil || st.Phase == PhaseProbation || (st.Applied != "" && wire.CompareVersions(d.Version, st.Applied) <= 0) {
		return
	}
	st.Applied = d.Version
	if err := SaveState(u.cfg.StatePath, st); err != nil {
		u.log.Warn("update: cannot record the version of the running build", "version", d.Version, "err", err)
		return
	}
	u.log.Info("update: this executable is the server's build of "+d.Version+"; older versions are refused from now on", "version", d.Version)
}

// Apply downloads, checks and swaps in the build d describes (see the
// package doc). It returns [ErrRestart] once the new build is in place;
// any other error leaves the running build in place and, unless ctx
// ended (the agent is stopping), is recorded for the heartbeat.
func (u *Updater) Apply(ctx context.Context, d wire.ComponentDescriptor) error {
	u.work.Lock()
	defer u.work.Unlock()
	err := u.apply(ctx, d)
	if err == nil || errors.Is(err, ErrRestart) {
		return err
	}
	if ctx.Err() != nil {
		// Stopped, not failed: what was downloaded is resumed next time.
		return err
	}
	st, _ := LoadState(u.cfg.StatePath)
	if st.Phase != PhaseProbation {
		st.Failed = &Failure{Version: d.Version, SHA256: d.SHA256, Reason: err.Error(), At: time.Now().UTC(), Broken: errors.Is(err, errBroken) || errors.Is(err, fetch.ErrPinMismatch)}
		if serr := SaveState(u.cfg.StatePath, st); serr == nil {
			u.set(st.Summary(), u.Probation())
		}
	}
	return err
}

func (u *Updater) apply(ctx context.Context, d wire.ComponentDescriptor) error {
	f := u.cfg.Files
	dir := filepath.Dir(f.Exe)
	if err := writable(dir); err != nil {
		return fmt.Errorf("update to %s: the folder of %s is not writable by this user (%w): a build installed by a package manager is updated by it", d.Version, f.Exe, err)
	}
	old, err := FileSHA256(f.Exe)
	if err != nil {
		return fmt.Errorf("update to %s: reading the running executable: %w", d.Version, err)
	}
	url := u.cfg.Client.FileURL(d.URLPath)
	u.log.Info("update: downloading", "version", d.Version, "url", fetch.ShowURL(url), "sha256", d.SHA256)
	o := fetch.Options{Chunk: downloadChunk, MaxSize: maxBuildSize, Client: u.cfg.Client.HTTPClient(), Logger: u.log}
	if err := fetch.File(ctx, url, f.New, fetch.Pin{SHA256: d.SHA256}, o); err != nil {
		if errors.Is(err, fetch.ErrPinMismatch) {
			return fmt.Errorf("update to %s: %w", d.Version, err)
		}
		return fmt.Errorf("update to %s: %w (what was downloaded is kept beside %s and resumed next time)", d.Version, err, f.Exe)
	}
	at("downloaded")
	if err := os.Chmod(f.New, 0o755); err != nil {
		return fmt.Errorf("update to %s: %w", d.Version, err)
	}
	if err := tryRun(ctx, f.New); err != nil {
		os.Remove(f.New)
		return fmt.Errorf("update to %s: %w (%w): it was deleted, and this build goes on", d.Version, errBroken, err)
	}
	st, err := LoadState(u.cfg.StatePath)
	if err != nil {
		u.log.Warn("update: the update record is unreadable; writing a new one", "err", err)
	}
	st.Phase, st.Version, st.SHA256, st.Previous, st.From, st.Boots = PhaseProbation, d.Version, d.SHA256, old, u.cfg.Version, 0
	if err := SaveState(u.cfg.StatePath, st); err != nil {
		return fmt.Errorf("update to %s: writing the probation marker: %w", d.Version, err)
	}
	at("marked")
	if err := swap(f); err != nil {
		st.Phase, st.Version, st.SHA256, st.Previous = PhaseNone, "", "", ""
		if serr := SaveState(u.cfg.StatePath, st); serr != nil {
			u.log.Error("update: cannot clear the probation marker after a failed swap (the next start does)", "err", serr)
		}
		return fmt.Errorf("update to %s: %w", d.Version, err)
	}
	u.set(st.Summary(), u.Probation())
	u.log.Info("update: the new build is in place; exiting for the supervisor to start it", "version", d.Version, "exe", f.Exe, "previous_kept_as", f.Old)
	return ErrRestart
}

// downloadChunk is the size of the download's Range requests. fetch
// resumes a cut download from its last whole chunk, and its default
// chunk (8 MB) is most of a build: a connection cut part of the way
// would start the download over.
const downloadChunk = 1 << 20

// maxBuildSize bounds a build's download: the signature covers its
// sha256, not its size, and a transport that lies could otherwise
// answer with a file that fills the disk beside the executable. A
// release of metnos-agent is a few tens of MB. (A variable for tests.)
var maxBuildSize int64 = 512 << 20

// tryRun runs exe version and wants it to exit 0 within 30 s.
func tryRun(ctx context.Context, exe string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "version")
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 200 {
			msg = msg[:200]
		}
		return fmt.Errorf("`%s version`: %w: %s", filepath.Base(exe), err, term.Sanitize(msg))
	}
	return nil
}

// writable reports whether a file can be created in dir.
func writable(dir string) error {
	f, err := os.CreateTemp(dir, ".metnos-agent-update-*")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// Target is the target this updater asks builds for.
func (u *Updater) Target() string { return u.cfg.Target }
