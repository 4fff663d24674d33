package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	goruntime "runtime"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/metnos/agent/agent"
	"github.com/metnos/agent/client"
	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/update"
	"github.com/metnos/agent/wire"
)

// exitLocked is the status when another agent already runs (docs/protocol.md §13.1).
const exitLocked = 3

func runRun(std stdio, args []string) int {
	// Under a systemd service stderr may be the journal: the log is then
	// written for it, and run's sentences (its errors) are errors there.
	errLog := stderrOf(std)
	if errLog.journal {
		std.err = &journalLines{w: std.err, prio: journalErr}
	}
	// A build on probation counts this start before anything else can
	// fail (flags, configuration, pairing), so that a build failing at
	// any of them is rolled back after two starts like one that crashes.
	// Asking for help is not a start.
	var early earlyBoot
	if !asksHelp(args) {
		var code int
		var stop bool
		if early, code, stop = bootEarly(std, errLog, asksWait(args)); stop {
			return code
		}
	}
	if early.lock != nil {
		defer early.lock.Release()
	}
	if early.outcome == update.RolledBack {
		fmt.Fprintln(std.err, rolledBackExit)
		return exitOK
	}
	fs, f := newRunFlags(std)
	server, minSandbox, tf := f.server, &f.minSandbox, f.tailnet
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "run", "run takes no arguments, only flags (got %q)", term.Sanitize(fs.Arg(0)))
	}
	// Bad flags are usage errors, before anything is read or written.
	if err := tf.check(); err != nil {
		return usageError(std.err, "run", "%v", err)
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	// Before anything is written or sent: a server URL that cannot be
	// one, a home folder that does not exist (never created), and a
	// device that is not paired or whose pairing or key is unusable.
	if err := pairing.CheckServer(e.lay, *server); err != nil {
		return fail(std, err)
	}
	if err := pairing.CheckHome(e.lay); err != nil {
		return fail(std, err)
	}
	if err := pairing.CheckPaired(e.lay); err != nil {
		return fail(std, err)
	}
	if early.lock == nil || early.data != e.lay.Data {
		lock, code, ok := lockRun(std, e.lay, *f.wait, errLog.logger(e.cfg.LogLevel))
		if !ok {
			return code
		}
		defer lock.Release()
	}
	logf, err := openLog(e.lay.Log(), std.err)
	if err != nil {
		return fail(std, err)
	}
	defer logf.Close()
	log := newLogger(logf, errLog, e.cfg.LogLevel)
	// cannotStart says why the agent cannot start: one sentence on
	// stderr, and a line in the log file for the service's log.
	cannotStart := func(err error) int {
		slog.New(slog.NewJSONHandler(logf, nil)).Error("cannot start", "err", err)
		return fail(std, err)
	}
	// A build on probation counts this start, and one that used its
	// starts without confirming is rolled back, before anything else
	// can fail (docs/protocol.md §9).
	files, boot := early.files, early.outcome
	if early.lock == nil || early.data != e.lay.Data {
		files, boot = bootUpdate(e.lay, log)
	}
	if boot == update.RolledBack {
		fmt.Fprintln(std.err, rolledBackExit)
		return exitOK
	}
	ctx, halt := stopOnSignals(log, e.cfg.StopTimeout)
	ctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	c, node, err := connect(ctx, e, connectOptions{server: *server, tailnet: tf}, log)
	if err != nil {
		return cannotStart(err)
	}
	if node != nil {
		defer node.Close()
		log.Info("joined the tailnet", "node", node.Name())
	}
	// METNOS_PYTHON_RUNTIME, or on Windows METNOS_PYTHON_RUNTIME_WIN,
	// what the Windows installer sets (docs/protocol.md §11).
	if name := e.cfg.PythonRuntime; name != "" {
		// As the Rust client: the runtime the installer pinned, from the
		// paired server's signed descriptor, before the first poll; a
		// failure is only logged (executors then use what FindPython
		// finds).
		if err := installFromServer(ctx, c, e.lay, name, log); err != nil {
			log.Error("the Python runtime could not be installed; executors use the next Python found", "runtime", name, "err", err)
		}
	}
	ac, err := agentConfig(e)
	if err != nil {
		return cannotStart(err)
	}
	ac.Client, ac.Logger, ac.Version, ac.MinSandbox = c, log, version(), policy.Level(*minSandbox)
	ac.OnHeartbeat = func(ctx context.Context) {
		if node != nil {
			node.Report(ctx)
		}
	}
	// The agent is made below; the heartbeats that read it start with
	// its Run.
	var a *agent.Agent
	ac.OnBeat = liveStatusWriter(e.lay, c.URL(), log, func() (int, int) { return a.InFlight() })
	ac.Watchdog = exitOnOverrun(log)
	ac.OnIdle = func() {
		// The heap the runs grew goes back first: the collection
		// touches code that the release below then drops again.
		debug.FreeOSMemory()
		before, after, err := releaseExecutablePages()
		log.Debug("idle: released the executable's pages", "rss_file_before", before, "rss_file_after", after, "err", err)
	}
	ac.Halt = halt
	// The service manager's stop timeout (METNOS_STOP_TIMEOUT_S, which
	// the systemd unit sets to its TimeoutStopSec): a run still going
	// at half of it is cut, and its result delivered, before the kill.
	ac.StopBudget = e.cfg.StopTimeout
	var unconfirmed atomic.Bool
	if files.Exe != "" {
		ac.Update, err = newUpdater(e, c, files, boot == update.Probation, log)
		if err != nil {
			return cannotStart(err)
		}
		if ac.Update != nil && boot == update.Probation {
			watchProbation(ac.Update, e.cfg.UpdateProbation, stopRun, &unconfirmed, log)
		}
	}
	a, err = agent.New(ac)
	if err != nil {
		return cannotStart(err)
	}
	defer a.Close()
	err = a.Run(ctx)
	switch {
	case errors.Is(err, update.ErrRestart):
		return exitOK // for the supervisor to start the new build
	case err != nil:
		log.Error("stopped", "err", err)
		return exitFailure
	case unconfirmed.Load():
		return exitFailure // a failed start of the build on probation
	}
	return exitOK
}

// rolledBackExit is what run says when the start rolled its build back.
const rolledBackExit = "metnos-agent: the update this build came from failed its probation and was rolled back; exiting for the supervisor to start the previous build"

// runText is what run does, for its help.
const runText = `Serve the paired server: long-poll for invocations, run each in the sandbox, send back the results. Stops on SIGINT or SIGTERM.

Only one agent runs for a user at a time (it holds the lock in the data folder). When another one is running, run says which and exits 3; with --wait it waits for that one to stop and then takes over, and a SIGINT or SIGTERM ends the wait with exit 0.`

// runFlags are run's flags.
type runFlags struct {
	server     *string
	minSandbox levelFlag
	tailnet    tailnetFlags
	wait       *bool
}

// newRunFlags returns run's flag set and the flags it sets.
func newRunFlags(std stdio) (*flag.FlagSet, *runFlags) {
	fs := newFlagSet("run", std, runText)
	f := &runFlags{server: fs.String("server", "", "the server URL (default: the one paired with)")}
	fs.Var(&f.minSandbox, "min-sandbox", "refuse any executor run weaker than this (none, contained, isolated, full)")
	f.tailnet = addTailnetFlags(fs)
	f.wait = fs.Bool("wait", false, "when another agent is running for this user, wait for it to stop and take over then, instead of exiting 3 (the service runs run --wait)")
	return fs, f
}

// asksWait reports whether args, run's, ask to --wait, for bootEarly,
// which runs before run parses its flags; args that do not parse do not
// (run then says why, once it parses them).
func asksWait(args []string) bool {
	fs, f := newRunFlags(stdio{out: io.Discard, err: io.Discard})
	return parseInterspersed(fs, args, true) == nil && *f.wait
}

// lockWaitPoll is how often a `run --wait` tries the lock again.
const lockWaitPoll = time.Second

// lockRun takes the lock `run` holds. When another agent holds it:
// without wait, it says so on stderr and ok is false, with exit 3 in
// code; with wait, it logs once on log which process holds it and waits
// until it can take it, and a SIGINT or SIGTERM meanwhile ends the wait,
// ok false with exit 0. Any other error is said on stderr, exit 1. log
// is a stderr log (the journal, under systemd): the log file is the
// other agent's until it stops.
func lockRun(std stdio, lay layout.Layout, wait bool, log *slog.Logger) (lock *lockfile.Held, code int, ok bool) {
	lock, err := lockfile.Lock(lay.Lock())
	if wait && errors.Is(err, lockfile.ErrLocked) {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		lock, err = waitLock(ctx, lay.Lock(), err, log)
		if ctx.Err() != nil && lock == nil {
			log.Info("stop requested while waiting for the other agent; exiting")
			return nil, exitOK, false
		}
	}
	if errors.Is(err, lockfile.ErrLocked) {
		fmt.Fprintf(std.err, "metnos-agent: another agent is already running for this user (%v): stop it first with `systemctl --user stop metnos-agent`, or Ctrl-C in its terminal\n", err)
		return nil, exitLocked, false
	}
	if err != nil {
		return nil, fail(std, err), false
	}
	return lock, 0, true
}

// waitLock logs once on log which process holds the lock at path (held,
// the error of the Lock that found it held, says) and waits for the
// lock until ctx ends ([lockfile.LockContext]).
func waitLock(ctx context.Context, path string, held error, log *slog.Logger) (*lockfile.Held, error) {
	var le *lockfile.LockedError
	if errors.As(held, &le) && le.PID > 0 {
		log.Info(fmt.Sprintf("waiting for the agent in process %d to stop; it takes over then", le.PID), "lock", path, "pid", le.PID)
	} else {
		log.Info("waiting for the agent that holds the lock to stop; it takes over then", "lock", path)
	}
	lock, err := lockfile.LockContext(ctx, path, lockWaitPoll)
	if err == nil {
		log.Info("the other agent stopped; taking over", "lock", path)
	}
	return lock, err
}

// earlyBoot is what bootEarly did: the lock it holds (nil: none, and
// run boots later), for the data folder data, and Boot's result.
type earlyBoot struct {
	lock    *lockfile.Held
	data    string
	files   update.Files
	outcome update.Outcome
}

// bootEarly runs the update's boot step first thing, when this device
// has an update record (agent-update.json): it takes run's lock (a start
// that finds another agent running is not a start of this build: exit
// 3, or with wait, a wait for it as [lockRun]'s) and runs
// [update.Boot], logging to the log file and stderr (errLog). Without a
// record there is nothing on probation, and nothing is touched before
// run's own checks.
func bootEarly(std stdio, errLog stderrLog, wait bool) (earlyBoot, int, bool) {
	e, _ := std.environment() // a variable run refuses later does not keep a failed build on probation
	lay := e.lay
	if lay.Data == "" {
		return earlyBoot{}, 0, false
	}
	if _, err := os.Lstat(lay.UpdateState()); err != nil {
		return earlyBoot{}, 0, false
	}
	lock, code, ok := lockRun(std, lay, wait, errLog.logger(slog.LevelInfo))
	if !ok {
		return earlyBoot{}, code, true
	}
	log := errLog.logger(slog.LevelInfo)
	if logf, err := openLog(lay.Log(), std.err); err == nil {
		defer logf.Close()
		log = newLogger(logf, errLog, slog.LevelInfo)
	}
	files, out := bootUpdate(lay, log)
	return earlyBoot{lock: lock, data: lay.Data, files: files, outcome: out}, 0, false
}

// asksHelp reports whether args ask for a command's help (-h, -help or
// --help before any "--").
func asksHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help", "-h=true", "-help=true", "--help=true":
			return true
		}
	}
	return false
}

// bootUpdate runs [update.Boot] on this executable; files.Exe is "" (and
// the agent does not update itself) when the executable cannot be
// found.
func bootUpdate(lay layout.Layout, log *slog.Logger) (update.Files, update.Outcome) {
	exe, err := update.Executable()
	if err != nil {
		log.Warn("update: this executable cannot be found, so the agent cannot update itself", "err", err)
		return update.Files{}, update.Normal
	}
	files := update.FilesFor(exe)
	out, _, _ := update.Boot(lay.UpdateState(), files, log)
	return files, out
}

// newUpdater returns the run loop's updater, or nil when the agent does
// not update itself: METNOS_UPDATE=off, or a development build (version
// "dev", such as `go run`), which has no release to be replaced by. A
// build on probation always gets one, to confirm it.
func newUpdater(e environment, c *client.Client, files update.Files, probation bool, log *slog.Logger) (*update.Updater, error) {
	v := version()
	if !probation && (e.cfg.UpdateOff || v == "dev") {
		why := "METNOS_UPDATE=off"
		if v == "dev" {
			why = "a development build (version dev)"
		}
		log.Info("updates from the server are off: " + why)
		return nil, nil
	}
	st, err := pairing.LoadState(e.lay)
	if err != nil {
		return nil, err
	}
	key, err := st.ServerKey()
	if err != nil {
		return nil, err
	}
	return update.New(update.Config{StatePath: e.lay.UpdateState(), Files: files, Version: v,
		Target: wire.UpdateTarget(goruntime.GOOS, goruntime.GOARCH), ServerKey: key, Client: c, Logger: log, Probation: probation}), nil
}

// unreachableProbation is how many probation times a build on
// probation waits, while the server cannot be reached at all, before
// that counts against it: a laptop that goes offline right after an
// update does not roll a good build back, and a build that cannot reach
// anything is rolled back all the same, later.
const unreachableProbation = 6

// watchProbation stops the run (stop) when the build on probation has
// not confirmed within d (or, while the server never answered at all,
// within unreachableProbation times d), and sets unconfirmed for `run`
// to exit 1: a failed start, which the supervisor follows with another,
// and the start after the last one rolls the build back.
func watchProbation(u *update.Updater, d time.Duration, stop context.CancelFunc, unconfirmed *atomic.Bool, log *slog.Logger) {
	waited := 0
	var check func()
	check = func() {
		waited++
		if !u.Probation() {
			return
		}
		if !u.ServerAnswered() && waited < unreachableProbation {
			log.Warn("update: this build has not reached the server yet; its probation waits", "probation", d.String(), "waited", waited, "of", unreachableProbation)
			time.AfterFunc(d, check)
			return
		}
		log.Error("update: this build has not reached a successful poll in its probation time; stopping, which counts as a failed start", "probation", (time.Duration(waited) * d).String())
		unconfirmed.Store(true)
		stop()
	}
	time.AfterFunc(d, check)
}

// stopOnSignals returns a context that ends at the first SIGINT or
// SIGTERM (stop: finish the run under way and deliver its result; with
// a stop budget, cut the run at half of it) and a channel closed at the
// second (stop now: what is not delivered stays in the spool). Each is
// logged, so that a Ctrl-C is never met with silence; a third exits at
// once, whatever is under way.
func stopOnSignals(log *slog.Logger, budget time.Duration) (context.Context, <-chan struct{}) {
	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	halt := make(chan struct{})
	go func() {
		s := <-sigs
		if budget > 0 {
			log.Info(fmt.Sprintf("stop requested; finishing what runs, or cutting it at most %d s from now (half the stop budget of %d s, METNOS_STOP_TIMEOUT_S), and delivering its result first (a second Ctrl-C or SIGTERM stops now)",
				(budget/2+time.Second/2)/time.Second, budget/time.Second), "signal", s.String())
		} else {
			log.Info("stop requested; finishing what runs and delivering its result first (a second Ctrl-C or SIGTERM stops now)", "signal", s.String())
		}
		cancel()
		s = <-sigs
		log.Warn("stopping now; results not delivered stay in the spool for the next start (a third signal exits at once)", "signal", s.String())
		close(halt)
		s = <-sigs
		log.Error("exiting at once", "signal", s.String())
		os.Exit(exitFailure)
	}()
	return ctx, halt
}

// exitOnOverrun is the agent's watchdog (docs/protocol.md §7.2 step 8): a run still
// going 10 s after its deadline is out of the agent's hands, so the
// process logs it and exits 124, as timeout(1), for the supervisor to
// restart it; the restarted agent reports the invocation as
// execution_outcome_unknown.
func exitOnOverrun(log *slog.Logger) func(invocationID string) {
	return func(id string) {
		log.Error("execution watchdog: the run did not end 10 s after its deadline; exiting 124 for the supervisor to restart the agent", "invocation", id)
		os.Exit(exitTimeout)
	}
}

// installFromServer installs the runtime archive name as the paired
// server's signed descriptor describes it, both fetched through c (the
// client connect made).
func installFromServer(ctx context.Context, c *client.Client, lay layout.Layout, name string, log *slog.Logger) error {
	st, err := pairing.LoadState(lay)
	if err != nil {
		return err
	}
	key, err := st.ServerKey()
	if err != nil {
		return err
	}
	d, err := fetch.RuntimeDescriptor(ctx, lay, key, name, c.RuntimeDescriptor)
	if err != nil {
		return err
	}
	o := fetch.Options{Logger: log, Client: c.HTTPClient()}
	last := int64(-1)
	o.Progress = func(p fetch.Progress) {
		if p.Total > 0 && p.Done*10/p.Total != last {
			last = p.Done * 10 / p.Total
			log.Info("runtime download", "file", name, "done", p.Done, "total", p.Total)
		}
	}
	_, err = fetch.Install(ctx, lay, fetch.Source{URL: c.RuntimeURL(d.Filename),
		Filename: d.Filename, Pin: fetch.Pin{SHA256: d.ArchiveSHA256, Size: d.ArchiveSize}}, o)
	return err
}
