// Package agent is a paired device's run loop (docs/protocol.md §7.2): it long-polls the
// server, heartbeats, verifies each invocation and runs it once in the
// sandbox, and delivers every result at least once.
//
// What it guarantees: invocations run side by side, up to the owner's
// concurrency, but two whose grants overlap where one of them may write
// run one after the other, in the order they came (docs/limits.md);
// an invocation runs at most once on this device
// (the spool's ledger and STARTED markers, across restarts: one that
// was running when the agent stopped is reported as
// execution_outcome_unknown, never run again), every result is on disk
// before it is sent and is sent, byte for byte, until the server
// accepts or refuses it for good, and nothing runs that does not verify
// against the pinned server key. What it does not: it never exits the
// process (an overrun execution is reported to [Config.Watchdog]), and
// it does not keep two agents of one user apart (the command's lock
// file does).
package agent

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metnos/agent/agent/internal/pyc"
	"github.com/metnos/agent/agent/internal/spool"
	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/client"
	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/undo"
	"github.com/metnos/agent/update"
	"github.com/metnos/agent/wire"
)

// Config is what an [Agent] runs with. Zero fields take the protocol's
// defaults (docs/protocol.md §16).
type Config struct {
	// Layout is where the agent keeps everything: its data and cache
	// folders (the Rust client's) and the files in them.
	Layout layout.Layout
	// Host describes this device to the policy: the home folder, the
	// session's sockets and the agent's own folders, which every
	// executor's policy masks.
	Host policy.Host
	// Sandbox are the sandbox's settings, passed to every run; their
	// Priority is replaced by the one the owner's limits give (see
	// PriorityOf), read when the invocation is claimed.
	Sandbox sandbox.Options
	// Limits are the device owner's limits in force at the start
	// (limits.toml with the environment's overrides, see
	// [config.LoadLimits]; the zero value is today's behaviour). Before
	// every run the agent refuses an executor [executors] refuses, an
	// argument inside a never folder and, in readonly mode, an executor
	// that writes (in preview mode, it runs as a dry run where the build
	// has them, else it is refused); Host carries the never folders and
	// the network lists. Priority is for the sandbox.
	Limits config.Limits
	// ReloadLimits, when set, reads the owner's limits again, with the
	// Host they make (never and network included). After each poll the
	// agent looks at Limits.File's size and time; when they changed and
	// its bytes did too, it calls ReloadLimits and puts what it returns
	// in force (when it fails, the limits in force stay), and records
	// the change in the audit log either way.
	ReloadLimits func() (config.Limits, policy.Host, error)
	// Python is the interpreter executors run with whatever else is
	// installed (METNOS_PYTHON); "" looks for one (see [FindPython]).
	Python string
	// Path is the agent's PATH: where [FindPython] looks, and the start
	// of an executor's PATH ("": /usr/bin:/bin). Lang is the executors'
	// LANG ("": C.UTF-8).
	Path, Lang string
	// SpoolRetention is how long an undelivered result stays in the
	// spool (0: 14 days); HistoryRetention how long backup blobs are
	// kept (0: 30 days).
	SpoolRetention, HistoryRetention time.Duration
	// JournalRetention is how long the history journal keeps a change
	// (0: a year; never shorter than HistoryRetention).
	JournalRetention time.Duration
	// AuditRetention is how long the audit log keeps a day's file (0: a
	// year, [audit.DefaultRetention]).
	AuditRetention time.Duration
	// HistoryQuota is the most the backup blobs may take, in bytes: 0
	// for the default share of the free space (see
	// [undo.DefaultQuotaPercent]), negative for no quota.
	HistoryQuota int64
	// Client carries every request to the paired server (required; the
	// command's connect step makes it, over the OS network or the
	// embedded tailnet).
	Client *client.Client
	// Logger receives the agent's log (nil: discarded).
	Logger *slog.Logger
	// Version is the agent's version, sent in the heartbeat.
	Version string
	// MinSandbox is the weakest sandbox this device accepts for any
	// executor, on top of each manifest's own minimum.
	MinSandbox policy.Level
	// Block is the long-poll time (25 s), HeartbeatEvery the heartbeat
	// period (30 s).
	Block, HeartbeatEvery time.Duration
	// MemoryBytes caps each run's memory (0: the sandbox default).
	MemoryBytes int64
	// OnHeartbeat, when set, runs with every heartbeat (the tailnet
	// node records its state then).
	OnHeartbeat func(context.Context)
	// OnBeat, when set, is called after each heartbeat with its error
	// (nil: the server answered it).
	OnBeat func(err error)
	// StopDelivery bounds how long the agent, once asked to stop, keeps
	// trying to deliver the results that finished (0: 10 s, under the
	// systemd unit's TimeoutStopSec=20 and a run's own time). What is
	// not delivered by then stays in the spool for the next start.
	StopDelivery time.Duration
	// StopBudget is how long the agent's service manager lets it stop
	// before it kills it (METNOS_STOP_TIMEOUT_S, which the systemd unit
	// sets to its TimeoutStopSec); 0 for none. With a budget, once the
	// agent is asked to stop, a run still going half the budget after
	// the request is cut short, and its result, which says so, is
	// spooled and delivered like any other (see [result.CutAtStop]);
	// and results are delivered until [StopMargin] before the budget
	// ends at the latest (never later than StopDelivery allows), so that
	// the process exits before it is killed. Without one, a run under
	// way finishes however long it takes (what a Ctrl-C by hand wants).
	StopBudget time.Duration
	// Halt, when closed, stops the agent now: a run under way is cut
	// short (the next start reports it as execution_outcome_unknown,
	// as after a crash) and undelivered results stay in the spool. The
	// command closes it on a second SIGINT or SIGTERM.
	Halt <-chan struct{}
	// Update, when set, keeps the agent current from the server
	// (docs/protocol.md §9): each poll whose server_client_version
	// differs from the last one seen makes it check for an update,
	// between runs, and the first successful poll confirms a build on
	// probation. Once an update is in place, Run delivers what it can
	// and returns [update.ErrRestart].
	Update *update.Updater
	// Watchdog is called, on a goroutine of its own, when an execution
	// overruns its deadline by 10 s (docs/protocol.md §7.2 step 8); the run goes on
	// meanwhile. Nil means no watchdog: the agent waits for the run
	// however long it takes. The agent never exits the process itself:
	// the command's run passes a watchdog that logs and exits 124, for
	// the supervisor to restart the agent (which then reports the
	// invocation as execution_outcome_unknown).
	Watchdog func(invocationID string)
	// BytecodeOff keeps no compiled bytecode for the executors and the
	// shim (METNOS_BYTECODE=off): every run compiles them from source.
	BytecodeOff bool
	// OnIdle, when set, is called when the agent settles into waiting:
	//   - from the run loop, before its first poll, and again before the
	//     poll that follows an empty (or failed) one when an invocation
	//     ran since the last call, or every [IdleAgain];
	//   - when the poll that follows a run, or a long-poll that timed
	//     out after [IdleAfterWork] or more, has waited [IdleAfterWork]
	//     with no invocation, without waiting for that long-poll to
	//     return;
	//   - after each heartbeat but the first while no invocation runs.
	//
	// The command gives back then the memory that start-up, the runs or
	// rarer work (polls' answers, heartbeats, the garbage collector)
	// touched and waiting does not need. It must be quick, and may run
	// on a goroutine of its own; two calls never run at once.
	OnIdle func()
}

// Agent is a paired device's run loop: it long-polls the server,
// verifies and runs each invocation once, and delivers every result at
// least once.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	client *client.Client
	server ed25519.PublicKey
	spool  *spool.Spool
	state  pairing.State
	host   policy.Host
	python Python
	pyErr  error
	best   string
	shimMu sync.Mutex
	// exMu keeps two preparations from fetching or verifying an
	// executor into the cache at once (see executor).
	exMu    sync.Mutex
	shimDir string
	shimSHA string
	// shimFiles are the loaded shim's files, shimSums their SHA-256
	// (checked on every use), and bc keeps the
	// bytecode of the shim and the executors (see python.go).
	shimFiles []string
	shimSums  map[string][32]byte
	bc        *pyc.Bytecode
	journal   *undo.Journal
	audit     *audit.Log
	// lim are the owner's limits in force, limStat what the run loop
	// last saw of their file, and limSeen the hash of the bytes it last
	// read there (only the Run goroutine touches them after New).
	lim     config.Limits
	limStat limitsStat
	limSeen string
	// auditPrunedAt is when the audit log was last pruned (UnixNano).
	auditPrunedAt atomic.Int64

	// halt ends when Config.Halt is closed (see Run): the stop-now
	// context of the runs and of the last delivery.
	halt       context.Context
	haltCancel context.CancelFunc
	// cut ends half of Config.StopBudget after the agent is asked to
	// stop (see Run): a run still going then is cut short, and gets a
	// result that says so (see execute).
	cut       context.Context
	cutCancel context.CancelFunc
	// stopAt is when the agent was asked to stop (UnixNano; 0 while it
	// was not).
	stopAt atomic.Int64

	// outbox is what flush delivers: the spooled results not delivered
	// yet, read from the spool once (at the first flush, or again after
	// that read failed: loaded says whether it was) and then kept up to
	// date as results are spooled, delivered and moved to dead-results.
	// The spool on disk stays the source of truth after a restart. Only
	// the Run goroutine touches them.
	outbox []spool.Spooled
	loaded bool
	// unsettled are the invocations whose result could not be spooled
	// (or recorded in the ledger): see spoolResult and settle.
	unsettled []string
	// redo are the journal and audit writes that failed after a run,
	// retried with the unsettled results (only the Run goroutine
	// touches it).
	redo []redo
	// runEnded is when the last run ended (only the Run goroutine
	// touches it).
	runEnded time.Time
	// seenVersion is the last server_client_version a poll announced,
	// and updateRetry when a check that failed is tried again (only the
	// Run goroutine touches them).
	seenVersion string
	updateRetry time.Time
	// beatNow asks the heartbeat goroutine for a heartbeat now.
	beatNow chan struct{}
	// idleMu keeps two calls of Config.OnIdle from running at once.
	idleMu sync.Mutex
	// working is set while an invocation runs, and workEnded is when
	// the last run ended (UnixNano): the heartbeat goroutine reads
	// them (see idleAfterBeat).
	working   atomic.Bool
	workEnded atomic.Int64
	// queue are the claimed invocations, prepared, waiting for a
	// conflicting run to end (in the order they came), and running
	// those under way, each on a goroutine of its own (only the Run
	// goroutine touches them; see schedule). inFlight is how many run
	// and limit how many may be claimed at once (see slots), for the
	// heartbeat and InFlight.
	queue, running  []*job
	inFlight, limit atomic.Int32
	// ends counts the runs that ended (see job.ends); fresh says a
	// result was spooled since the last flush (only the Run goroutine
	// touches them).
	ends  int
	fresh bool
	// swept is done once the start's sweep of backup blobs and journal
	// segments has ended: it runs beside the first poll, and the first
	// run waits for it (see housekeeping).
	swept chan struct{}
}

// ErrNotPaired is returned by [New] on a device that has no pairing
// (pairing.ErrNotPaired, so either one matches with errors.Is).
var ErrNotPaired = pairing.ErrNotPaired

// New loads the device key, the pairing and the spool, and resolves
// what a crash may have left (STARTED markers without a result).
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Block == 0 {
		cfg.Block = client.PollBlock
	}
	if cfg.HeartbeatEvery == 0 {
		cfg.HeartbeatEvery = 30 * time.Second
	}
	if cfg.StopDelivery == 0 {
		cfg.StopDelivery = 10 * time.Second
	}
	if cfg.SpoolRetention == 0 {
		cfg.SpoolRetention = 14 * 24 * time.Hour
	}
	if cfg.HistoryRetention == 0 {
		cfg.HistoryRetention = 30 * 24 * time.Hour
	}
	if cfg.JournalRetention == 0 {
		cfg.JournalRetention = undo.DefaultRetention
	}
	cfg.JournalRetention = max(cfg.JournalRetention, cfg.HistoryRetention)
	if cfg.AuditRetention == 0 {
		cfg.AuditRetention = audit.DefaultRetention
	}
	st, err := pairing.LoadState(cfg.Layout)
	if err != nil {
		return nil, err
	}
	if !st.Paired() {
		return nil, ErrNotPaired
	}
	server, err := st.ServerKey()
	if err != nil {
		return nil, fmt.Errorf("%w: the agent will not run without a pinned server key", err)
	}
	if cfg.Client == nil || cfg.Client.DeviceID() != *st.DeviceID {
		return nil, errors.New("agent: the server client is not the paired device's")
	}
	host := cfg.Host
	sp, err := spool.Open(cfg.Layout)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, client: cfg.Client, server: server, spool: sp, state: st, host: host, beatNow: make(chan struct{}, 1)}
	a.halt, a.haltCancel = context.WithCancel(context.Background())
	a.cut, a.cutCancel = context.WithCancel(context.Background())
	if cut := sp.Cut(); cut != "" {
		a.log.Warn("the ledger's last line was cut short by a crash; removed (its invocation's STARTED marker or result decides)", "ledger", cfg.Layout.Ledger(), "line", cut)
	}
	unknown, err := sp.Recover(*st.DeviceID)
	for _, id := range unknown {
		a.log.Warn("an invocation was running when the agent stopped; it will not run again and is reported as execution_outcome_unknown", "invocation", id)
	}
	if err == nil {
		var damaged []spool.Salvaged
		damaged, err = sp.Salvage(*st.DeviceID)
		for _, d := range damaged {
			if d.ID == "" {
				a.log.Error("a spooled result was damaged and does not say its invocation; moved aside, not delivered (the server times the invocation out)", "file", d.Dead)
				continue
			}
			a.log.Error("a spooled result was damaged; its invocation does not run again and is reported as execution_outcome_unknown (the damaged bytes are kept)",
				"invocation", d.ID, "file", d.Dead)
			unknown = append(unknown, d.ID)
		}
	}
	if err == nil {
		a.journal, err = undo.Open(cfg.Layout.Journal())
	}
	if err == nil {
		a.audit, err = audit.Open(cfg.Layout.Audit())
	}
	if err == nil {
		err = a.recoverJournal(unknown)
	}
	if err == nil {
		a.auditUnknown(unknown)
		a.startLimits()
	}
	if err != nil {
		sp.Close()
		return nil, err
	}
	a.housekeeping()
	pyHost := host
	if cfg.Sandbox.Disabled != "" {
		pyHost = policy.Host{} // no sandbox: any interpreter runs
	}
	a.python, a.pyErr = FindPython(cfg.Layout, pyHost, cfg.Python, cfg.Path)
	for _, s := range a.python.Skipped {
		a.log.Warn("python skipped: the sandbox could not run it", "skipped", s)
	}
	if a.pyErr != nil {
		a.log.Warn("no Python for executors", "err", a.pyErr)
	} else {
		a.log.Info("python", "path", a.python.Path, "source", a.python.Source, "note", a.python.Note)
	}
	a.bc = a.bytecode()
	a.best = sandbox.PlanFor(cfg.Sandbox, policy.Policy{}, policy.LevelNone).Best
	return a, nil
}

// Close releases the spool and the audit log, once the start's sweep
// (see housekeeping) has ended, and removes the run cgroups the sandbox
// keeps for the next runs (sandbox.DrainPool), so that a stopped agent
// leaves none behind. It is called once Run has returned, which waits
// for the run under way: no run holds a cgroup then.
func (a *Agent) Close() error {
	a.haltCancel()
	a.cutCancel()
	a.waitSwept()
	sandbox.DrainPool(a.log)
	a.audit.Close()
	return a.spool.Close()
}

// Python returns the interpreter executors run with, or why there is
// none.
func (a *Agent) Python() (Python, error) { return a.python, a.pyErr }

// SandboxLevel is the strongest sandbox word this machine gives.
func (a *Agent) SandboxLevel() string { return a.best }

// Run polls and executes until ctx ends, which is a request to stop:
// the runs under way finish (they are not cut short), and the results
// that finished are delivered for up to Config.StopDelivery before Run
// returns. Up to the owner's [config.Limits.Concurrency] invocations run
// at once, each on a goroutine of its own; everything else (polling,
// the spool and delivery, the journal and audit log, the owner's
// limits, updates) stays on the goroutine that called Run, which polls
// only while a claimed invocation could start, and starts one only when
// no run whose grants overlap its own where either may write is under
// way or came before it (see schedule). With a Config.StopBudget, a run still going half the budget
// after the request is cut short and its result (ok false, saying so)
// is delivered too, and delivery ends [StopMargin] before the budget
// does, so that Run returns before it. Closing Config.Halt stops at
// once instead, leaving the results in the spool (and a run cut then
// without one: the next start reports it execution_outcome_unknown).
// It returns nil when it stopped.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("agent running", "server", a.client.URL(), "device", a.client.DeviceID(), "sandbox", a.best)
	returned := make(chan struct{})
	defer close(returned)
	if a.cfg.Halt != nil {
		go func() {
			select {
			case <-a.cfg.Halt:
				a.haltCancel()
			case <-returned:
			}
		}()
	}
	// Stopping now is also a request to stop.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(a.halt, cancel)()
	// A result POST under way when the stop request comes is not cut
	// short (the server may have it already, and would get it twice):
	// deliveries go on until Config.StopDelivery after the request (or
	// StopMargin before the stop budget ends), or until the agent stops
	// now. With a stop budget, a run still going at half of it is cut.
	dctx, dcancel := context.WithCancel(a.halt)
	defer dcancel()
	defer context.AfterFunc(ctx, func() {
		now := time.Now()
		a.stopAt.Store(now.UnixNano())
		time.AfterFunc(a.deliveryEnd(now, now).Sub(now), dcancel)
		if b := a.cfg.StopBudget; b > 0 {
			time.AfterFunc(b/2, a.cutCancel)
		}
	})()
	a.slots()
	go a.heartbeats(ctx)
	backoff := time.Second
	restart := false
	var down reachability
	// worked: an invocation ran since OnIdle was last called (start-up
	// counts as one); quiet: the last poll brought none; waited: it was
	// answered, empty, after IdleAfterWork or more (a long-poll that
	// timed out: answering it, and sending the next, touch code that
	// waiting does not need).
	worked, quiet, waited := true, true, false
	var idleAt time.Time
	// The poll runs on a goroutine of its own, so that the runs' ends
	// are taken while it waits; only one is out at a time, and only
	// while a claimed invocation could start (see slots). delay is how
	// long it waits before polling: the backoff after a failure.
	polls := make(chan polled, 1)
	done := make(chan ran)
	preps := make(chan prepared)
	polling := false
	var delay time.Duration
	var idleTimer *time.Timer
	var idledMidPoll atomic.Bool
	// updating: the server announced a client version to check, which
	// waits until no invocation runs (an update never replaces the
	// agent in the middle of one); no poll is sent meanwhile.
	updating := ""
	// armIdle calls OnIdle after d, unless a run starts meanwhile or
	// the poll under way returns first.
	armIdle := func(d time.Duration) {
		if a.cfg.OnIdle == nil || idleTimer != nil {
			return
		}
		idleTimer = time.AfterFunc(d, func() {
			if a.working.Load() {
				return
			}
			a.idle()
			idledMidPoll.Store(true)
		})
	}
	for {
		stopping := ctx.Err() != nil || restart
		a.schedule(ctx, done)
		if a.fresh && dctx.Err() == nil {
			// A result was spooled (a run ended, or an invocation
			// could not run): it goes now, not after the long-poll
			// under way.
			a.fresh = false
			a.flush(dctx)
		}
		busy := len(a.running)+len(a.queue) > 0
		if stopping && !polling && !busy {
			break
		}
		if !stopping && updating != "" && !polling && !busy {
			if a.checkUpdate(ctx) {
				restart = true
				continue
			}
			updating = ""
		}
		if !stopping && !polling && updating == "" && len(a.running)+len(a.queue) < a.slots() {
			if quiet && !busy && a.cfg.OnIdle != nil && (worked || time.Since(idleAt) >= IdleAgain) {
				a.idle()
				worked, idleAt = false, time.Now()
			}
			quiet = true
			block := a.cfg.Block
			if !a.flush(dctx) {
				// Results wait in the spool: come back soon to retry them
				// rather than after a whole long-poll.
				block = min(block, 2*time.Second)
			}
			if down.since != nil {
				// The server was unreachable: a short poll finds out soon
				// that it is back, rather than a whole long-poll later.
				block = min(block, 2*time.Second)
			}
			// After a run, or a long-poll that timed out, the long-poll's
			// wait is idle time already: once its request has gone (which
			// touches code as answering does), and while no run goes on.
			idleTimer = nil
			idledMidPoll.Store(false)
			if (worked || waited) && !busy {
				armIdle(delay + IdleAfterWork)
			}
			waited = false
			polling = true
			go a.poll(ctx, delay, block, polls)
			delay = 0
		}
		var p polled
		select {
		case <-a.nextDeadline():
			// A claimed invocation waiting for a conflicting run has
			// come to its deadline (see schedule).
			continue
		case pr := <-preps:
			a.prepared(pr)
			continue
		case d := <-done:
			a.ended(d)
			if polling && len(a.running)+len(a.queue) == 0 {
				// The last run ended while the long-poll waits: that
				// wait is idle time already.
				armIdle(IdleAfterWork)
			}
			continue
		case p = <-polls:
			polling = false
		case <-ctx.Done():
			if !polling && !busy {
				continue
			}
			// Wait for the poll and the runs; a stop comes once.
			select {
			case pr := <-preps:
				a.prepared(pr)
				continue
			case d := <-done:
				a.ended(d)
				continue
			case p = <-polls:
				polling = false
			}
		}
		resp, err := p.resp, p.err
		if err == nil && resp.Invocation == nil && p.took >= IdleAfterWork {
			waited = true
		}
		if idleTimer != nil {
			idleTimer.Stop()
			if idledMidPoll.Load() {
				worked, idleAt = false, time.Now()
			}
			idleTimer = nil
		}
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			switch {
			case errors.Is(err, client.ErrReconnected):
				// Cut short on purpose, for a new connection: poll again
				// at once; the server did not fail.
				a.log.Debug("poll cut short for a new connection", "err", err)
				continue
			case client.StatusOf(err) == 0:
				down.failed(a.log, err)
			default:
				if a.cfg.Update != nil {
					a.cfg.Update.Answered()
				}
				a.log.Warn("poll failed; retrying", "err", err)
			}
			delay = a.backoff(&backoff)
			continue
		}
		down.answered(a.log)
		if a.cfg.Update != nil {
			a.cfg.Update.Answered()
			if a.cfg.Update.Confirm() {
				// The server hears at once that the probation ended.
				select {
				case a.beatNow <- struct{}{}:
				default:
				}
			}
		}
		a.noteShim(resp.ShimSHA256)
		// The owner's last word comes before the next run.
		a.watchLimits()
		if resp.Invocation != nil {
			worked, quiet = true, false
			j, err := a.admit(ctx, resp.Invocation, preps)
			if j != nil {
				a.queue = append(a.queue, j)
			}
			if err != nil {
				// A malformed invocation counts as a failed poll (docs/protocol.md §7.2
				// step 1): back off.
				delay = a.backoff(&backoff)
				continue
			}
		}
		backoff = time.Second
		if a.updateDue(resp.ServerClientVersion) {
			updating = resp.ServerClientVersion
		}
	}
	// The stop time, unless the loop ended before the AfterFunc ran.
	stopped := time.Now()
	if at := a.stopAt.Load(); at != 0 {
		stopped = time.Unix(0, at)
	}
	a.deliverBeforeStop(stopped)
	if restart {
		a.log.Info("agent stopped for its update")
		return update.ErrRestart
	}
	a.log.Info("agent stopped")
	return nil
}

// IdleAfterWork is how long the poll that follows a run waits with no
// invocation before the run loop calls Config.OnIdle, while that
// long-poll goes on waiting.
const IdleAfterWork = 2 * time.Second

// idle calls Config.OnIdle, one call at a time.
func (a *Agent) idle() {
	a.idleMu.Lock()
	defer a.idleMu.Unlock()
	a.cfg.OnIdle()
}

// idleAfterBeat calls Config.OnIdle after a heartbeat while the agent
// only waits: no invocation runs, nor ended in the last IdleAfterWork.
// A heartbeat's connection, signing and encoding touch code all over
// the binary, which the kernel faults in by the 64 KiB: a few MB
// that would otherwise stay resident until IdleAgain. The first
// heartbeat is left out, as the start's call follows or overlaps it.
func (a *Agent) idleAfterBeat() {
	if a.cfg.OnIdle == nil || a.working.Load() {
		return
	}
	if time.Since(time.Unix(0, a.workEnded.Load())) < IdleAfterWork {
		return
	}
	a.idle()
}

// IdleAgain is how often the run loop calls Config.OnIdle while it
// only waits.
const IdleAgain = 5 * time.Minute

// updateDue reports whether the server's announced client version
// calls for an update check: it differs from the last one seen, or a
// check that failed is due again.
func (a *Agent) updateDue(announced string) bool {
	if a.cfg.Update == nil || announced == "" || a.cfg.Update.Probation() {
		return false
	}
	if announced != a.seenVersion {
		a.seenVersion = announced
		a.updateRetry = time.Time{}
		return true
	}
	return !a.updateRetry.IsZero() && time.Now().After(a.updateRetry)
}

// updateRetryAfter is how long a failed update check, or one that found
// no build for this target, waits before it is tried again;
// updateRecheckAfter how long one that found nothing to apply waits (a
// build can be published under a version the server already
// announces). A new announced version is checked at once.
const (
	updateRetryAfter   = 30 * time.Minute
	updateRecheckAfter = 6 * time.Hour
)

// checkUpdate checks for an update and applies it; it reports whether
// the new build is in place and the agent must exit for it.
func (a *Agent) checkUpdate(ctx context.Context) bool {
	a.updateRetry = time.Time{}
	dec, err := a.cfg.Update.Check(ctx, false)
	switch {
	case client.StatusOf(err) == http.StatusNotFound:
		// A build may be published later under the same version: look
		// again.
		a.log.Info("update: the server announces client version "+a.seenVersion+" but publishes no metnos-agent build for this device's target yet; looking again later", "err", err)
		a.updateRetry = time.Now().Add(updateRetryAfter)
		return false
	case err != nil:
		a.log.Warn("update: the check failed; it is tried again later", "err", err)
		a.updateRetry = time.Now().Add(updateRetryAfter)
		return false
	case !dec.Apply:
		a.log.Info("update: not applied: "+dec.Why, "version", dec.Descriptor.Version)
		a.updateRetry = time.Now().Add(updateRecheckAfter)
		return false
	}
	err = a.cfg.Update.Apply(ctx, dec.Descriptor)
	if errors.Is(err, update.ErrRestart) {
		return true
	}
	if err != nil {
		a.log.Error("update failed; this build goes on, and the update is tried again later", "err", err)
		a.updateRetry = time.Now().Add(updateRetryAfter)
	}
	return false
}

// reachability is whether the server answers the run loop's polls, so
// that an outage is logged once when it starts and once when it ends,
// not at every retry.
type reachability struct {
	since *time.Time // when polls started failing; nil while they answer
}

// failed notes a poll that got no answer (a transport error: no
// connection, no answer in time).
func (r *reachability) failed(log *slog.Logger, err error) {
	if r.since != nil {
		log.Debug("poll failed; the server is still unreachable", "err", err)
		return
	}
	now := time.Now()
	r.since = &now
	log.Warn("server unreachable: " + err.Error() + "; polling again until it answers")
}

// answered notes a poll the server answered.
func (r *reachability) answered(log *slog.Logger) {
	if r.since == nil {
		return
	}
	log.Info("server reachable again", "unreachable_for", time.Since(*r.since).Round(time.Second).String())
	r.since = nil
}

// StopMargin is how long before the end of Config.StopBudget the agent
// stops delivering results: the time it takes to close down and exit
// before its service manager kills it.
const StopMargin = 2 * time.Second

// deliveryEnd is when the results stop being delivered for a stop
// requested at stopAt, the last run having ended at ran:
// Config.StopDelivery after the later of the two, and no later than
// StopMargin before the end of Config.StopBudget, when there is one.
func (a *Agent) deliveryEnd(stopAt, ran time.Time) time.Time {
	end := later(stopAt, ran).Add(a.cfg.StopDelivery)
	if b := a.cfg.StopBudget; b > 0 {
		if last := stopAt.Add(max(b-StopMargin, 0)); last.Before(end) {
			end = last
		}
	}
	return end
}

// deliverBeforeStop delivers the results that finished, once the agent
// is asked to stop (at stopAt), until deliveryEnd (Config.StopDelivery
// after the request or after the last run ended, whichever is later,
// and within the stop budget), or until the agent is told to stop now;
// what is left stays in the spool, for the next start.
func (a *Agent) deliverBeforeStop(stopAt time.Time) {
	if a.halt.Err() == nil && !a.loaded {
		a.load()
	}
	defer a.settleBeforeStop()
	if len(a.outbox) == 0 {
		if a.halt.Err() != nil {
			a.log.Info("stopping now")
		}
		return
	}
	deadline := a.deliveryEnd(stopAt, a.runEnded)
	ctx, cancel := context.WithDeadline(a.halt, deadline)
	defer cancel()
	if ctx.Err() == nil {
		a.log.Info("stopping: delivering the results that finished first; a second Ctrl-C or SIGTERM stops now and keeps them in the spool",
			"invocations", a.outboxIDs(), "for_at_most", time.Until(deadline).Round(100*time.Millisecond).String())
	}
	for ctx.Err() == nil && !a.flush(ctx) {
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	if slices.ContainsFunc(a.outbox, spool.Spooled.OnDisk) {
		a.log.Warn("stopping with results not delivered; they stay in the spool and are delivered at the next start", "invocations", a.outboxIDs())
	}
}

// settleBeforeStop tries a last time to spool or record the results
// that could not be, and says what a restart will make of those it
// still cannot.
func (a *Agent) settleBeforeStop() {
	if len(a.redo) > 0 {
		a.retry()
		for _, w := range a.redo {
			a.log.Error("stopping with a write that could not be made (is the data folder full?): the history journal shows the change as interrupted after a restart, and the audit log lacks its line",
				"to", w.what, "invocation", w.id)
		}
	}
	if len(a.unsettled) == 0 {
		return
	}
	a.settle()
	if len(a.unsettled) == 0 {
		return
	}
	// One whose result is on disk is settled by the next start; any
	// other has only its STARTED marker there.
	var unknown, lost []string
	for _, id := range a.unsettled {
		if !slices.ContainsFunc(a.outbox, func(r spool.Spooled) bool { return r.ID == id && r.OnDisk() }) {
			unknown = append(unknown, id)
		}
		if slices.ContainsFunc(a.outbox, func(r spool.Spooled) bool { return r.ID == id && !r.OnDisk() }) {
			lost = append(lost, id)
		}
	}
	if len(unknown) > 0 {
		a.log.Error("stopping with results that could not be spooled nor recorded in the ledger (is the data folder full?): the next start reports them as execution_outcome_unknown (the server keeps a result it already has); they do not run again",
			"invocations", unknown, "not_delivered", lost)
	}
}

// later returns the later of two times.
func later(t, u time.Time) time.Time {
	if u.After(t) {
		return u
	}
	return t
}

// outboxIDs are the invocation ids of the results waiting for delivery.
func (a *Agent) outboxIDs() []string {
	ids := make([]string, len(a.outbox))
	for i, r := range a.outbox {
		ids[i] = r.ID
	}
	return ids
}

// backoff returns how long to wait before the next poll, backoff × a
// jitter in [0.75, 1.25), and doubles backoff up to 10 s
// (docs/protocol.md §16).
func (a *Agent) backoff(backoff *time.Duration) time.Duration {
	d := client.Jitter(*backoff)
	*backoff = client.NextBackoff(*backoff)
	return d
}

// polled is a poll's answer, and how long it took.
type polled struct {
	resp wire.PollResponse
	err  error
	took time.Duration
}

// poll waits delay (unless ctx ends), polls, and sends what it got to
// out. The cursor is always null. The Rust client sends the last id
// it saw, which hides from it every invocation with a smaller id: one
// a dead agent's orphaned long-poll claimed (docs/protocol.md §6.5),
// or any ordinary one after a durable id (docs/protocol.md §17.1). The
// ledger already keeps anything from running twice, and the server
// hands out again only invocations without a result, after their
// deadline.
func (a *Agent) poll(ctx context.Context, delay, block time.Duration, out chan<- polled) {
	if delay > 0 {
		select {
		case <-ctx.Done():
			out <- polled{err: ctx.Err()}
			return
		case <-time.After(delay):
		}
	}
	start := time.Now()
	resp, err := a.client.Poll(ctx, "", block)
	out <- polled{resp: resp, err: err, took: time.Since(start)}
}

// heartbeats sends the profile at once and then every HeartbeatEvery.
// A failure is logged at warn when it follows a heartbeat that went
// through, and at debug while they keep failing (the run loop's polls
// say when the server is unreachable and when it is back).
func (a *Agent) heartbeats(ctx context.Context) {
	t := time.NewTicker(a.cfg.HeartbeatEvery)
	defer t.Stop()
	failing := false
	for beat := 0; ; beat++ {
		err := a.client.Heartbeat(ctx, a.profile())
		if a.cfg.OnBeat != nil && ctx.Err() == nil {
			a.cfg.OnBeat(err)
		}
		switch {
		case err == nil:
			failing = false
		case ctx.Err() != nil:
		case failing:
			a.log.Debug("heartbeat failed again", "err", err)
		default:
			failing = true
			a.log.Warn("heartbeat failed", "err", err)
		}
		if a.cfg.OnHeartbeat != nil {
			a.cfg.OnHeartbeat(ctx)
		}
		if beat > 0 && ctx.Err() == nil {
			a.idleAfterBeat()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.beatNow:
		}
	}
}

// profile is the heartbeat's profile (docs/protocol.md §5.4), with the sandbox this
// machine really gives and the Python executors run with.
func (a *Agent) profile() map[string]any {
	p := map[string]any{
		"client_version": a.cfg.Version,
		"cpu_count":      int64(runtime.NumCPU()),
		"os_arch":        client.OSArch(),
		"os_family":      client.OSFamily(),
		"sandbox_level":  a.best,
		"agent":          "metnos-agent",
		// How many invocations run now, and may run at once (the
		// server stores the profile as it is: integers, by convention).
		"in_flight":   int64(a.inFlight.Load()),
		"concurrency": int64(a.limit.Load()),
	}
	if a.cfg.Update != nil {
		if s := a.cfg.Update.Summary(); s != "" {
			p["update"] = s
		}
	}
	for _, d := range fetch.Downloading(a.cfg.Layout) {
		// A runtime download under way (or left half-way).
		p["runtime_download"] = fmt.Sprintf("%s: %d/%d bytes", d.URL, d.Done, d.Total)
	}
	if a.pyErr == nil {
		p["python"] = a.python.Path
		p["python_source"] = a.python.Source
	} else {
		p["python"] = ""
		p["python_source"] = "none: " + a.pyErr.Error()
	}
	return p
}

// spoolResult spools the result body of invocation id (durably, see
// [spool.Spool.Finish]) and queues it for the next flush. When that
// fails (a full data folder), the result is queued all the same, from
// memory: it is delivered (the server having it is what matters), and
// each flush tries again to spool it or, once delivered, to record it
// in the ledger (see [Agent.settle]), so that it neither runs again nor
// becomes "outcome unknown" after a restart. The error is returned for
// the caller to say so, once.
func (a *Agent) spoolResult(id string, body []byte) error {
	r, err := a.spool.Finish(id, body)
	a.outbox = append(a.outbox, r)
	a.fresh = true
	if err != nil {
		a.unsettled = append(a.unsettled, id)
	}
	return err
}

// settle tries again, for each result whose spooling failed, what
// [spool.Spool.Finish] could not do: to spool it while it waits in
// memory for delivery, and else to record it in the ledger and remove
// its STARTED marker. Failures are logged at debug (spoolResult's
// caller said it once); success once, at info.
func (a *Agent) settle() {
	kept := a.unsettled[:0]
	for _, id := range a.unsettled {
		var err error
		if i := slices.IndexFunc(a.outbox, func(r spool.Spooled) bool { return r.ID == id && !r.OnDisk() }); i >= 0 {
			var r spool.Spooled
			r, err = a.spool.Finish(id, a.outbox[i].Body)
			if r.OnDisk() {
				a.outbox[i] = r
			}
		} else {
			err = a.spool.Settle(id)
		}
		if err != nil {
			a.log.Debug("the result still cannot be spooled", "invocation", id, "err", err)
			kept = append(kept, id)
			continue
		}
		a.log.Info("the result that could not be spooled is now recorded on disk: a restart neither runs the invocation again nor reports it unknown", "invocation", id)
	}
	a.unsettled = kept
}

// flush delivers every spooled result, byte for byte (docs/protocol.md §5.5): accepted
// ones leave the spool, refused ones (4xx but 408, 423, 425, 429) go to
// dead-results, and on a transport error or a retryable status it stops
// until the next round. It reports whether the spool is now empty.
func (a *Agent) flush(ctx context.Context) bool {
	if !a.loaded && !a.load() {
		return false
	}
	if len(a.unsettled) > 0 {
		a.settle()
	}
	if len(a.redo) > 0 {
		a.retry()
	}
	empty := true
	var kept []spool.Spooled
	for i, r := range a.outbox {
		err := a.client.Deliver(ctx, r.Body)
		switch status := client.StatusOf(err); {
		case err == nil:
			if err := a.spool.Delivered(r); err != nil {
				a.log.Error("removing a delivered result", "invocation", r.ID, "err", err)
			}
			a.log.Info("result delivered", "invocation", r.ID, "bytes", len(r.Body))
		case status == 0:
			// The server is not there: the others would fail too.
			a.log.Warn("result not delivered yet; kept in the spool", "invocation", r.ID, "err", err)
			a.outbox = append(kept, a.outbox[i:]...)
			return false
		case client.Retryable(status):
			// This one may be refused for now; the next may go through.
			a.log.Warn("result not delivered yet; kept in the spool", "invocation", r.ID, "err", err)
			kept = append(kept, r)
			empty = false
		default:
			if derr := a.spool.DeadLetter(r, status); derr != nil {
				a.log.Error("moving a refused result to dead-results", "invocation", r.ID, "err", derr)
				a.outbox = append(kept, a.outbox[i:]...)
				return false
			}
			a.log.Error("the server refused a result for good; kept in spool/dead-results", "invocation", r.ID, "status", status, "err", err)
		}
	}
	a.outbox = kept
	return empty
}

// load reads the outbox from the spool: everything spooled so far is
// on disk, queued results included, but for those kept in memory
// because they could not be spooled. It reports whether it could.
func (a *Agent) load() bool {
	pending, err := a.spool.Pending()
	if err != nil {
		a.log.Error("reading the spool", "err", err)
		return false
	}
	for _, r := range a.outbox {
		if !r.OnDisk() {
			pending = append(pending, r)
		}
	}
	a.outbox, a.loaded = pending, true
	return true
}

// housekeeping applies the retention rules at start: spooled results
// older than Config.SpoolRetention at once (before the first flush
// reads the spool), then, on a goroutine of its own, backup blobs past
// Config.HistoryRetention or over the quota and history journal
// segments past Config.JournalRetention, and audit log day files past
// Config.AuditRetention. That sweep looks at every blob
// folder the retention keeps, so it runs beside the first poll rather
// than before it: a start with months of history claims its first
// invocation as soon as an empty agent does, and the first run waits
// for the sweep (waitSwept) so that the two never act at once.
func (a *Agent) housekeeping() {
	cut := time.Now().Add(-a.cfg.SpoolRetention)
	for _, p := range a.spool.Expire(cut) {
		a.log.Warn("dropped a result older than the spool retention", "file", p)
	}
	a.swept = make(chan struct{})
	go func() {
		defer close(a.swept)
		// An agent killed while bubblewrap set a run up leaves it
		// waiting forever (sandbox.SweepOrphans).
		sandbox.SweepOrphans(a.log)
		// An agent killed during a Windows run leaves the access
		// entries it gave the AppContainer (sandbox.RecoverGrants).
		if _, err := sandbox.RecoverGrants(a.cfg.Sandbox, a.log); err != nil {
			a.log.Warn("the access entries a run cut short left could not all be removed", "err", err)
		}
		a.expireBlobs(a.cfg.HistoryRetention)
		a.pruneJournal()
		a.pruneAudit(time.Now())
	}()
}

// waitSwept waits for the start's sweep of blobs and journal segments
// (see housekeeping) to end.
func (a *Agent) waitSwept() {
	if a.swept != nil {
		<-a.swept
	}
}

// expireBlobs removes the backup blobs past retention or over the
// quota; the journal records which changes lose their undo.
func (a *Agent) expireBlobs(retention time.Duration) {
	out, err := a.journal.Expire(undo.Expiry{History: a.history(), Retention: retention, Quota: a.cfg.HistoryQuota})
	for _, x := range out {
		log := a.log.Info
		if len(x.Lost) > 0 {
			log = a.log.Warn
		}
		log("backup blobs removed", "dir", x.Dir, "reason", x.Reason, "bytes", x.Bytes, "changes_that_can_no_longer_be_fully_undone", x.Lost)
	}
	if err != nil {
		a.log.Warn("backup blob retention", "err", err)
	}
}

// history is the backup blob folder executors write (the layout's
// Blobs).
func (a *Agent) history() string { return a.cfg.Layout.Blobs() }

// userData is the executors' METNOS_USER_DATA (the layout's UserData).
func (a *Agent) userData() string { return a.cfg.Layout.UserData() }
