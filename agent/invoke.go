package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/metnos/agent/agent/internal/bundle"
	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/wire"
)

// invocation is one invocation as the agent acts on it, parsed once at
// the start of handle and passed down: the signed fields, its log, its
// time limit and, once execute has them, the verified executor (its
// manifest's facts parsed once, by the bundle cache) and what the
// arguments are read for, each computed once.
type invocation struct {
	wire.Invocation
	log *slog.Logger
	// limit is the run's deadline_ms, at least a second.
	limit time.Duration
	// ex is the verified executor.
	ex bundle.Executor
	// strs are the strings of Args, walked once: the request's grants,
	// the blob check and the journal read only these, and a list of
	// them stands for Args wherever a walk of its strings would read it.
	strs []string
	// stdin is Args canonicalised: the executor's stdin.
	stdin []byte
	// net is what the run's egress proxy saw (nil without one), for
	// the audit line.
	net *sandbox.NetReport
	// spans times the handling's steps for the debug log, and timing is
	// the sandbox's own split of the last run (nil: none).
	spans  *spans
	timing *sandbox.Timing
	// egress is the network the run was narrowed to, nil for none.
	egress *policy.Egress
	// refusedBy says which of the owner's limits refused the invocation
	// before it ran ("" when none did); preview marks a run that the
	// owner's preview mode makes a dry run (see ownerRefusal).
	refusedBy string
	preview   bool
	// dryBy says why the run is a dry run (dryByArgs, dryByPreview),
	// "" for a real one: set by request, with the policy.
	dryBy string
	// lim and host are the owner's limits and the Host in force when
	// the invocation was claimed: its request reads them, also when the
	// run builds it again on its own goroutine (see run), while the
	// Run goroutine may put new ones in force.
	lim  config.Limits
	host policy.Host
	// noted: the request's notes were logged (see request).
	noted bool
}

// readArgs reads the arguments for everything after it: their strings
// and the executor's stdin.
func (inv *invocation) readArgs() error {
	stdin, err := wire.Canonical(inv.Args)
	if err != nil {
		return fmt.Errorf("executor %s: arguments: %w", inv.ex.Name, err)
	}
	inv.stdin = stdin
	wire.WalkStrings(inv.Args, func(s string) { inv.strs = append(inv.strs, s) })
	return nil
}

// admit takes one invocation from a poll response through docs/protocol.md §7.2:
// shape, ledger, signature, id, then the executor, the arguments and
// the owner's limits, up to its sandbox request (see prepare, which
// runs on a goroutine of its own and sends what it made to preps): the
// job it returns starts once it is prepared and no run it conflicts
// with is under way or came before it (see schedule). One refused here
// has its result spooled for the next flush to deliver, and no job.
// An invocation that fails its checks is not run; it gets a result with
// error_class "invocation_refused", so that the server learns at once
// rather than at its timeout, and so that nothing it sends can stall
// the invocations after it. It runs on the Run goroutine.
func (a *Agent) admit(ctx context.Context, raw any, preps chan<- prepared) (*job, error) {
	w, err := wire.ParseInvocation(raw)
	if err != nil {
		a.log.Error("the server sent an invocation of the wrong shape; ignored", "err", err)
		return nil, err
	}
	inv := &invocation{Invocation: w, log: a.log.With("invocation", w.ID, "executor", w.Executor),
		limit: max(time.Duration(w.DeadlineMS)*time.Millisecond, time.Second), spans: newSpans(),
		lim: a.lim, host: a.host}
	inv.spans.mark("parse")
	if !wire.ValidID(inv.ID) {
		inv.log.Error("refusing an invocation id the server cannot issue; not run, no result possible")
		inv.spans.log(inv.log, nil)
		return nil, nil
	}
	if a.spool.Executed(inv.ID) {
		inv.log.Info("already executed on this device; not run again")
		inv.spans.log(inv.log, nil)
		return nil, nil
	}
	if a.claimed(inv.ID) {
		inv.log.Info("already claimed and waiting or running on this device; not run twice")
		inv.spans.log(inv.log, nil)
		return nil, nil
	}
	if err := inv.Verify(a.server); err != nil {
		a.refuse(inv, fmt.Errorf("the invocation's signature is not the paired server's: %w", err))
		inv.spans.log(inv.log, nil)
		return nil, nil
	}
	if err := wire.CheckID(inv.ID, time.Now()); err != nil {
		a.refuse(inv, err)
		inv.spans.log(inv.log, nil)
		return nil, nil
	}
	inv.spans.mark("verify")
	// The executor, its arguments and its request are made on a
	// goroutine of their own (a first run fetches the executor): the
	// job waits in the queue meanwhile, and whatever came after it
	// waits for it to be known (see ready).
	j := &job{inv: inv, claimed: inv.spans.start, preparing: true, ends: a.ends}
	go func() {
		p, r, keep := a.prepare(ctx, inv)
		preps <- prepared{j: j, p: p, r: r, keep: keep}
	}()
	return j, nil
}

// prepared is what a job's preparation sends back to the Run
// goroutine: the job made (p, nil when it cannot run), or the result
// to keep for it.
type prepared struct {
	j, p *job
	r    result.Result
	keep bool
}

// finish encodes and spools the result of an invocation that was run
// (or failed on the device trying), and records it: the history
// journal entry, the audit line and the log line. All three say what
// the server is sent, not what the run returned: a result cut to fit
// the server's limit is recorded as sent, ok false and error_class
// "result_too_large". The journal alone also reads the run's own
// payload, uncut: the rows of what the run changed on disk, which a
// local undo needs whatever the server was told.
func (a *Agent) finish(inv *invocation, ran result.Result) {
	ran.InvocationID, ran.DeviceID = inv.ID, a.client.DeviceID()
	r, body, cut, err := ran.Encode()
	if err != nil {
		r = result.DeviceError(err)
		r.InvocationID, r.DeviceID = inv.ID, a.client.DeviceID()
		body, _ = r.Body()
	}
	if cut {
		inv.log.Warn("the result was over the server's 4 MiB limit; its payload was dropped and the result says so")
	}
	inv.spans.mark("encode")
	if err := a.spoolResult(inv.ID, body); err != nil {
		// The run happened: its result is delivered from memory, and
		// its journal entry and audit line are written all the same.
		inv.log.Error("could not spool the result (is the data folder full?); delivering it from memory, and spooling it when there is space again; the invocation does not run again",
			"err", err)
	}
	inv.spans.mark("spool")
	a.finishJournal(inv, r, ran.Payload)
	inv.spans.mark("journal")
	a.auditRecord(inv, r, body)
	inv.spans.mark("audit")
	attrs := []any{"ok", r.OK, "sandbox", r.Sandbox, "elapsed_ms", r.ElapsedMS, "error_class", r.ErrorClass}
	if r.Error != "" {
		// The result says why; so does the device's own log.
		attrs = append(attrs, "error", r.Error)
	}
	if inv.refusedBy != "" {
		inv.log.Info("not run: refused by the owner's limits", attrs...)
		return
	}
	inv.log.Info("executed", attrs...)
}

// refuse records and reports an invocation that is not run.
func (a *Agent) refuse(inv *invocation, why error) {
	inv.log.Warn("invocation refused; not run", "err", why)
	r := result.Result{InvocationID: inv.ID, DeviceID: a.client.DeviceID(), Entries: []any{}, Payload: map[string]any{},
		Sandbox: "none", Error: "refused by the device: " + why.Error(), ErrorClass: wire.ClassInvocationRefused}
	body, err := r.Body()
	if err != nil {
		inv.log.Error("could not encode the refusal", "err", err)
	} else if err := a.spoolResult(inv.ID, body); err != nil {
		inv.log.Error("could not spool the refusal (is the data folder full?); delivering it from memory, and spooling it when there is space again", "err", err)
	}
	a.auditRecord(inv, r, body)
}

// prepare fetches and verifies the executor, reads the arguments,
// applies the owner's limits and builds the sandbox request: the job,
// ready to start (see start). When the invocation cannot run, it
// returns no job but the result to spool (keep), or nothing at all
// when the agent was asked to stop meanwhile. It runs on a goroutine
// of its own, and reads the owner's limits and the Host the invocation
// was claimed under (inv.lim, inv.host), never the Agent's.
func (a *Agent) prepare(ctx context.Context, inv *invocation) (*job, result.Result, bool) {
	// Everything before the marker has no effect on the device: when the
	// agent is asked to stop meanwhile, nothing is spooled, and the server
	// hands the invocation out again later.
	// The owner's limits refuse an executor by name before it is
	// fetched, and the rest once it is known, before anything else.
	var err error
	if why := inv.lim.RefuseExecutor(inv.Executor); why != "" {
		err = inv.lim.Refused(why)
	}
	if err == nil {
		inv.ex, err = a.executor(ctx, inv)
	}
	inv.spans.mark("executor")
	if err == nil {
		err = inv.readArgs()
	}
	if err == nil {
		err = a.ownerRefusal(inv)
	}
	var shimDir string
	if err == nil {
		shimDir, err = a.ensureShim(ctx, false)
	}
	inv.spans.mark("shim")
	if err == nil {
		err = a.pyErr
	}
	var req sandbox.Request
	if err == nil {
		req, err = a.request(inv, shimDir, inv.limit)
	}
	if err != nil {
		if ctx.Err() != nil {
			inv.log.Info("stopping before the run started; the server will hand the invocation out again")
			return nil, result.Result{}, false
		}
		if r, ok := a.refusedByOwner(inv, err); ok {
			return nil, r, true
		}
		return nil, result.DeviceError(err), true
	}
	inv.spans.mark("request")
	return &job{inv: inv, req: req, shimDir: shimDir, fp: footprintOf(inv, req.Policy, a.sharedIdentity())}, result.Result{}, false
}

// start starts a prepared job, on the Run goroutine: it checks the
// backup blobs the run would restore, writes the STARTED marker and
// the history journal's entry, and runs the job on a goroutine of its
// own, which sends what it ran to done. It reports whether it started
// the run; when it did not, the result that says why is spooled.
func (a *Agent) start(ctx context.Context, j *job, done chan<- ran) bool {
	inv, req := j.inv, j.req
	fail := func(r result.Result) bool {
		a.finish(inv, r)
		inv.spans.log(inv.log, inv.timing)
		return false
	}
	// What the job waited for conflicting runs is taken from its
	// deadline (the server counts it from the hand-out): its sandbox
	// and its watchdog get what is left, and it is not started with
	// less than a second.
	if waited := time.Since(j.readyAt); !j.readyAt.IsZero() && waited > 0 {
		if inv.limit-waited < time.Second {
			return fail(waitedPastDeadline(inv))
		}
		inv.limit -= waited
		j.req.Limits.Timeout = inv.limit
		req = j.req
	}
	// A backup blob the run would restore must still be the bytes it
	// was named after.
	if err := a.checkBlobs(inv); err != nil {
		return fail(result.DeviceError(fmt.Errorf("executor %s not run: %w", inv.ex.Name, err)))
	}
	// The start's sweep of backup blobs and journal segments acts on
	// what a run writes: it ends before the first run begins.
	a.waitSwept()
	// The marker comes after the executor is known: whether it can
	// write decides what a crash means (docs/protocol.md §17.3).
	inv.spans.mark("blobs")
	// A dry run changes nothing: a crash during one is no change of
	// unknown effect.
	if err := a.spool.Start(inv.ID, inv.Reversibility, inv.ex.Manifest.Facts.Writes() && inv.dryBy == ""); err != nil {
		return fail(result.DeviceError(fmt.Errorf("writing the STARTED marker: %w", err)))
	}
	inv.spans.mark("started_marker")
	if err := a.beginJournal(inv, req); err != nil {
		// Nothing ran yet; a change that could not be journaled is not made.
		return fail(result.DeviceError(fmt.Errorf("executor %s not run: %w", inv.ex.Name, err)))
	}
	inv.spans.mark("journal_begin")
	go func() {
		r, keep := a.execute(ctx, j)
		done <- ran{j: j, r: r, keep: keep, ended: time.Now()}
	}()
	return true
}

// execute runs a started job under the watchdog, on the job's own
// goroutine: it touches nothing of the Agent but what is safe there
// (the sandbox, the shim's lock, the stop contexts). It reports the
// result and whether to keep it (false: the run was stopped now, and
// the next start reports it execution_outcome_unknown).
func (a *Agent) execute(ctx context.Context, j *job) (result.Result, bool) {
	inv, req, shimDir := j.inv, j.req, j.shimDir
	if a.cfg.Watchdog != nil {
		// It judges the run, not the clock alone: see watchdog.
		dog := startWatchdog(inv.limit, func() { a.cfg.Watchdog(inv.ID) })
		defer dog.ended()
	}
	// A started run is not cut short when the agent is asked to stop: it
	// ends by itself or at its deadline, and its result is spooled and
	// delivered before the agent exits. Only the stop budget (half of
	// it gone since the request: its result says the run was cut) and
	// stopping now (a second signal: no result) cut it short, whichever
	// comes first.
	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	defer context.AfterFunc(a.halt, func() { cancel(errStoppedNow) })()
	defer context.AfterFunc(a.cut, func() { cancel(errCutAtStop) })()
	started := time.Now()
	defer context.AfterFunc(ctx, func() {
		if a.halt.Err() != nil {
			return
		}
		ends := (inv.limit - time.Since(started)).Round(time.Second).String()
		if b := a.cfg.StopBudget; b > 0 {
			inv.log.Info(fmt.Sprintf("stop requested: waiting for this run to end, but cutting it at most %s after the stop request (half the stop budget of %s), then delivering its result; a second Ctrl-C or SIGTERM stops now", seconds(b/2), seconds(b)),
				"ends_within", ends)
			return
		}
		inv.log.Info("stop requested: waiting for this run to end, then delivering its result; a second Ctrl-C or SIGTERM stops now",
			"ends_within", ends)
	})()
	r, cut := a.run(rctx, inv, req, shimDir)
	inv.spans.mark("sandbox_run")
	// Whether the run was cut short is what the sandbox says, not
	// whether a stop-now came: one that lands after the executor ended
	// by itself leaves a finished result, which is spooled and delivered.
	switch {
	case cut && errors.Is(context.Cause(rctx), errCutAtStop):
		return a.cutAtStop(inv, r, started), true
	case cut:
		inv.log.Warn("stopped now: the run was cut short; the next start reports it as execution_outcome_unknown")
		return result.Result{}, false
	}
	return r, true
}

// Why a run's context ends before the run does: the agent stops now
// (Config.Halt), or half its stop budget has gone since it was asked to
// stop (Config.StopBudget).
var (
	errStoppedNow = errors.New("the agent stops now")
	errCutAtStop  = errors.New("the agent was asked to stop and half its stop budget has gone")
)

// cutAtStop is the result of a run cut short at half the stop budget
// (see [result.CutAtStop]); cut is what [Agent.run] returned for it
// (the run's sandbox word, policy and time), started when the run
// began. It logs the cut at warn.
func (a *Agent) cutAtStop(inv *invocation, cut result.Result, started time.Time) result.Result {
	b := a.cfg.StopBudget
	stopAt := time.Unix(0, a.stopAt.Load())
	writes := inv.ex.Manifest.Facts.Writes() && inv.dryBy == ""
	why := fmt.Sprintf("the run was cut short after %s, %s after the agent was asked to stop (by its service manager, which gives it %s to stop, and a run at most half of that)",
		seconds(time.Since(started)), seconds(time.Since(stopAt)), seconds(b))
	if writes {
		why += "; the executor writes, so its changes, if it made any, may be partial; it is not run again"
	} else {
		why += "; the executor writes nothing; it is not run again"
	}
	word := cut.Sandbox
	if word == "" {
		word = "none"
	}
	r := result.CutAtStop(word, writes, why)
	r.Policy, r.ElapsedMS = cut.Policy, cut.ElapsedMS
	inv.log.Warn("stop budget: the run was still going at half of it, and was cut short; its result says so and is delivered before the agent exits",
		"stop_budget", b.String(), "ran_for", time.Since(started).Round(100*time.Millisecond).String(), "error_class", r.ErrorClass)
	return r
}

// seconds writes d as a whole number of seconds: "10 s".
func seconds(d time.Duration) string {
	return fmt.Sprintf("%d s", int64(d.Round(time.Second)/time.Second))
}

// executor returns the verified executor, from the cache or fetched.
func (a *Agent) executor(ctx context.Context, inv *invocation) (bundle.Executor, error) {
	// One at a time: the cache's folders are written through a .tmp
	// folder that any materialisation clears.
	a.exMu.Lock()
	defer a.exMu.Unlock()
	ex, err := bundle.Cached(a.cfg.Layout, inv.Executor, inv.ManifestSHA256, inv.CodeSHA256, a.server)
	switch {
	case err == nil:
		a.executorBytecode(inv, ex)
		return ex, nil
	case errors.Is(err, bundle.ErrUnverified):
		a.log.Warn("a cached executor no longer verifies; fetching it again", "executor", inv.Executor, "err", err)
	case !errors.Is(err, fs.ErrNotExist):
		return bundle.Executor{}, err
	}
	// A download that fails in a way that may pass is tried again, up
	// to the invocation's deadline.
	b, err := a.client.ExecutorUntil(ctx, inv.Executor, time.Now().Add(inv.limit))
	if err != nil {
		return bundle.Executor{}, err
	}
	ex, err = bundle.Materialize(a.cfg.Layout, b, inv.Executor, inv.ManifestSHA256, inv.CodeSHA256, a.server)
	if err == nil {
		a.executorBytecode(inv, ex)
	}
	return ex, err
}

// executorBytecode prepares the bytecode of ex's modules: all its code
// files but the entry, which runs as __main__ and which Python never
// loads from bytecode.
func (a *Agent) executorBytecode(inv *invocation, ex bundle.Executor) {
	a.prepareBytecode(inv.log, "executor "+ex.Name, ex.Dir, ex.Manifest.Code.Files[1:])
}

// noteShim drops the loaded shim when the server announces another.
func (a *Agent) noteShim(sha string) {
	a.shimMu.Lock()
	defer a.shimMu.Unlock()
	if sha != "" && a.shimSHA != "" && !strings.EqualFold(sha, a.shimSHA) {
		a.log.Info("the server has a new shim; it is fetched before the next run", "was", a.shimSHA[:12], "now", sha[:min(12, len(sha))])
		a.shimDir, a.shimSHA = "", ""
	}
}

// ensureShim returns the verified shim's directory, fetching it once
// per process (and again when force is set, it drifted, or the copy in
// the cache no longer verifies), its files and its bytecode verified (or
// compiled) on every call.
func (a *Agent) ensureShim(ctx context.Context, force bool) (string, error) {
	a.shimMu.Lock()
	defer a.shimMu.Unlock()
	if a.shimDir != "" && !force {
		if err := bundle.CheckShim(a.shimDir, a.shimSums); err != nil {
			a.log.Warn("the shim in the cache no longer verifies; fetching it again", "err", err)
			force = true
		}
	}
	if a.shimDir == "" || force {
		b, err := a.client.Shim(ctx)
		if err != nil {
			return "", err
		}
		dir, sha, err := bundle.InstallShim(a.cfg.Layout, b, a.server)
		if err != nil {
			return "", err
		}
		a.shimDir, a.shimSHA = dir, sha
		a.shimFiles = slices.Sorted(maps.Keys(b.Files))
		a.shimSums = bundle.ShimSums(b)
	}
	a.prepareBytecode(a.log, "shim", a.shimDir, a.shimFiles)
	return a.shimDir, nil
}

var envName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })

// refusedEnv says why an env_injections name is not passed on ("" when
// it is): what the loader, the interpreter or the shell would act on
// (LD_*, PYTHON*, PATH, HOME, ...) stays the agent's to set, whatever a
// signed invocation says.
func refusedEnv(k string) string {
	u := strings.ToUpper(k)
	switch {
	case !envName().MatchString(k):
		return "not a variable name"
	case strings.HasPrefix(u, "LD_"), strings.HasPrefix(u, "PYTHON"), strings.HasPrefix(u, "DYLD_"), u == "GLIBC_TUNABLES":
		return "changes how the interpreter loads code"
	}
	switch u {
	case "PATH", "HOME", "GCONV_PATH", "BASH_ENV", "ENV", "IFS", "TMPDIR", "SHELL", "USER", "LOGNAME", "LOCPATH", "NLSPATH", "MALLOC_CHECK_", "METNOS_RUNTIME", "METNOS_CLIENT_EXE":
		return "the agent sets it"
	}
	return ""
}

var noModule = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`No module named '([A-Za-z0-9_.]+)'`) })

// run runs the executor in the sandbox and maps its output; once, a
// missing shim module makes it fetch the shim again and retry (docs/protocol.md §8).
// req and shimDir are what execute built (and journaled the grants of);
// the request is built again only for the retry, with the shim the
// self-heal fetched (once: it used to be fetched a second time here).
// cut reports that the sandbox ended the run because ctx ended (or did
// not start it): then r holds only the run's sandbox word, its policy's
// fingerprint and its elapsed time. A run that ended by itself is never
// cut, whenever ctx ends.
func (a *Agent) run(ctx context.Context, inv *invocation, req sandbox.Request, shimDir string) (r result.Result, cut bool) {
	ex, limit := inv.ex, inv.limit
	start := time.Now()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			// The self-heal below has fetched the shim into shimDir.
			var err error
			if req, err = a.request(inv, shimDir, limit-time.Since(start)); err != nil {
				return result.DeviceError(err), false
			}
		}
		out, err := sandbox.Run(ctx, req)
		inv.timing = out.Timing
		if re := (*sandbox.RefusedError)(nil); errors.As(err, &re) && re.DryRun {
			inv.log.Warn("dry run refused: this device cannot keep the run's writes from the disk; not run", "asked_by", inv.dryBy, "why", re.Why)
			return dryRunRefused(ex.Name, inv.dryBy, err), false
		}
		if errors.Is(err, sandbox.ErrRefused) {
			return result.DeviceError(fmt.Errorf("executor %s: not run on this device: %w", ex.Name, err)), false
		}
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			// The sandbox killed the run (or did not start it) because
			// ctx ended: it did not end by itself.
			inv.net, inv.egress = out.Network, req.Policy.Egress
			return result.Result{Sandbox: out.Sandbox, Policy: out.Policy, ElapsedMS: time.Since(start).Milliseconds()}, true
		}
		if err != nil {
			return result.DeviceError(fmt.Errorf("executor %s: %w", ex.Name, err)), false
		}
		var r result.Result
		switch {
		case out.TimedOut:
			r = result.Timeout(out.Sandbox)
		case out.OOMKilled:
			r = result.DeviceError(fmt.Errorf("executor %s was killed by the memory limit of %s", ex.Name, sandbox.FormatBytes(out.Limits.MemoryBytes)))
		case out.CPUTimeExceeded && out.Priority != nil:
			r = result.CPUTimeExceeded(out.Sandbox, ex.Name, out.Priority.CPUTime)
		default:
			r = result.FromOutput(ex.Name, out.Stdout, out.StdoutTruncated, int64(out.Limits.OutputBytes))
			if r.ErrorClass == wire.ClassDeviceError {
				// Self-heal (docs/protocol.md §8), only for a module of the shim that is
				// missing from this device's copy, and only once.
				m := noModule().FindStringSubmatch(string(out.Stderr))
				if attempt == 0 && m != nil && !shimHas(shimDir, m[1]) && limit-time.Since(start) > time.Second {
					a.log.Warn("the executor misses a shim module; fetching the shim again", "executor", ex.Name, "module", m[1])
					fctx, cancel := context.WithTimeout(ctx, limit-time.Since(start))
					dir, err := a.ensureShim(fctx, true)
					cancel()
					if err == nil && shimHas(dir, m[1]) && limit-time.Since(start) > time.Second {
						a.log.Warn("retrying once with the fetched shim", "executor", ex.Name)
						shimDir = dir
						continue
					}
				}
				r.Error += stderrTail(out.Stderr)
			}
		}
		if out.DryRun != nil {
			// What the run would have changed, beside what it said.
			p, err := withDryRun(r.Payload, r.OK, out.DryRun, inv.dryBy)
			if err != nil {
				return result.DeviceError(fmt.Errorf("executor %s: %w", ex.Name, err)), false
			}
			// The entries are the executor's rows of what it did: none
			// was done (they stay in dry_run.executor).
			r.Payload, r.Entries, r.NProcessed = p, []any{}, 0
			inv.log.Info("dry run: nothing was changed on disk", "changes", len(out.DryRun.Changes)+out.DryRun.More, "asked_by", inv.dryBy)
		}
		r.Sandbox, r.Policy = out.Sandbox, out.Policy
		r.ElapsedMS = time.Since(start).Milliseconds()
		logPriority(inv.log, out.Priority)
		// Weaker than every layer the OS has (what this machine lacks,
		// or a layer that failed for this run), or than the machine's
		// best when this run fell short of it: say why.
		r.SandboxDowngradeReason = out.Reason
		if r.SandboxDowngradeReason == "" && out.Sandbox != a.best {
			r.SandboxDowngradeReason = fmt.Sprintf("ran under %s, weaker than this machine's %s", out.Sandbox, a.best)
		}
		inv.net, inv.egress = out.Network, req.Policy.Egress
		if out.Network != nil {
			// What the narrowing did goes where the server shows it: the
			// reason, and the error of a run that failed with
			// connections refused (the narrowing may be why).
			if say := netSummary(req.Policy.Egress, out.Network); say != "" {
				r.SandboxDowngradeReason = joinReason(r.SandboxDowngradeReason, say)
			}
			if !r.OK && out.Network.Refused > 0 {
				r.Error += fmt.Sprintf(" (the device refused %d of this run's network connections, the first to %s: %s)", out.Network.Refused, out.Network.FirstRefused, out.Network.FirstReason)
			}
		}
		return r, false
	}
}

// netSummary says, for the result's reason, how a run's network was
// narrowed and what the narrowing refused: only what is worth a look
// (refusals, hints that name no host, a narrowing the sandbox could
// not enforce); "" for a run that reached only what it named.
func netSummary(e *policy.Egress, n *sandbox.NetReport) string {
	var say []string
	if !n.Enforced {
		say = append(say, "the network narrowing to the manifest's hosts is not enforced here: only programs that use the proxy variables go through it")
	}
	if n.Refused > 0 {
		say = append(say, fmt.Sprintf("network narrowed to the manifest's hosts: %d connection(s) refused, the first to %s: %s", n.Refused, n.FirstRefused, n.FirstReason))
	}
	if e != nil && len(e.Ignored) > 0 {
		q := make([]string, len(e.Ignored))
		for i, h := range e.Ignored {
			q[i] = strconv.Quote(h)
		}
		say = append(say, "network hints that name no host, ignored (they allow nothing): "+strings.Join(q, ", "))
	}
	return strings.Join(say, "; ")
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// shimHas reports whether the shim in dir has the module named (dotted),
// as a file or a package.
func shimHas(dir, module string) bool {
	p := filepath.Join(dir, filepath.FromSlash(strings.ReplaceAll(module, ".", "/")))
	return isFile(p+".py") || isFile(filepath.Join(p, "__init__.py"))
}

// stderrTail is the end of an executor's stderr, for an error message.
func stderrTail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	if len(s) > 600 {
		s = "…" + s[len(s)-600:]
	}
	return "; stderr: " + s
}

// request builds the sandbox request of one invocation from the signed
// manifest and the arguments (docs/protocol.md §8, §12.1): the capabilities' grants,
// the manifest's min_sandbox, the executor, the shim and the
// interpreter read-only, the user data folder writable, a clean
// environment, the arguments on stdin. It reads the arguments as
// [invocation.readArgs] left them.
func (a *Agent) request(inv *invocation, shimDir string, limit time.Duration) (sandbox.Request, error) {
	ex := inv.ex
	data := a.userData()
	if err := os.MkdirAll(data, 0o700); err != nil {
		return sandbox.Request{}, fmt.Errorf("user data folder: %w", err)
	}
	for _, p := range []string{a.cfg.Layout.UserState(), a.cfg.Layout.UserConfig(), a.cfg.Layout.Workspace()} {
		// Executors write shimdata: a link in place of one of these is
		// theirs, and is replaced rather than followed.
		if fi, err := os.Lstat(p); err == nil && !fi.IsDir() {
			a.log.Warn("replacing what an executor left in place of a user data folder", "path", p)
			os.Remove(p)
		}
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return sandbox.Request{}, fmt.Errorf("user data folder: %w", err)
		}
	}
	extra := []policy.Grant{
		{Path: ex.Dir, Access: policy.Read, Own: true, Why: "executor " + ex.Name},
		{Path: shimDir, Access: policy.Read, Own: true, Why: "shim"},
		{Path: data, Access: policy.Write, Own: true, Why: "METNOS_USER_DATA"},
	}
	in := policy.DeriveInput{
		Manifest: ex.Manifest.Facts,
		// The capabilities' when clauses read the arguments by name;
		// the grants read their strings.
		Args:  inv.Args,
		Extra: extra,
		Host:  inv.host,
	}
	pol, err := policy.Derive(in)
	if err != nil {
		return sandbox.Request{}, fmt.Errorf("executor %s: %w", ex.Name, err)
	}
	if !sandbox.Visible(pol, a.python.Path) {
		if a.python.Prefix == "/" || fspath.Within(inv.host.Home, a.python.Prefix) {
			return sandbox.Request{}, fmt.Errorf("python %s: its installation would be %s, which the sandbox would have to show whole; set METNOS_PYTHON to an interpreter installed in a folder of its own", a.python.Path, a.python.Prefix)
		}
		in.Extra = append(in.Extra, policy.Grant{Path: a.python.Prefix, Access: policy.Read, Own: fspath.Within(a.python.Prefix, a.cfg.Layout.Cache), Why: "python " + a.python.Source})
		if pol, err = policy.Derive(in); err != nil {
			return sandbox.Request{}, fmt.Errorf("executor %s: %w", ex.Name, err)
		}
	}
	for _, n := range pol.Notes {
		if !inv.noted {
			inv.log.Info("capability noted, nothing added for it", "note", n)
		}
	}
	inv.noted = true
	opts := a.cfg.Sandbox
	// The owner's priority in force now: the limits file may have
	// changed since the agent started.
	opts.Priority = PriorityOf(inv.lim)
	return sandbox.Request{
		Argv:       []string{a.python.Path, ex.Entry},
		Stdin:      bytes.NewReader(inv.stdin),
		Env:        a.env(inv, shimDir, pol.ExecPath),
		Dir:        a.cfg.Layout.Workspace(),
		Policy:     pol,
		Limits:     sandbox.Limits{Timeout: limit, MemoryBytes: a.cfg.MemoryBytes},
		MinSandbox: a.cfg.MinSandbox,
		Logger:     a.log,
		Options:    opts,
		// The sandbox adds METNOS_DRY_RUN=1 to a dry run's environment.
		DryRun: a.dryRunOf(inv, pol),
	}, nil
}

// env is the executor's environment (docs/protocol.md §8): a few inherited variables,
// the Python settings, the server's env_injections, then the agent's
// own variables, which win. execPath are the folders of the programs
// the manifest's code:exec names (policy.Policy.ExecPath): they join
// PATH after its own folders.
func (a *Agent) env(inv *invocation, shimDir string, execPath []string) []string {
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	getOr := func(v, def string) string {
		if v != "" {
			return v
		}
		return def
	}
	path := getOr(a.cfg.Path, "/usr/bin:/bin")
	for _, d := range execPath {
		if !slices.Contains(filepath.SplitList(path), d) {
			path += string(os.PathListSeparator) + d
		}
	}
	set("PATH", path)
	set("PYTHONPATH", shimDir+string(os.PathListSeparator)+inv.ex.Dir)
	set("METNOS_RUNTIME", shimDir)
	set("PYTHONDONTWRITEBYTECODE", "1")
	set("PYTHONUTF8", "1")
	set("PYTHONIOENCODING", "utf-8")
	set("LANG", getOr(a.cfg.Lang, "C.UTF-8"))
	set("HOME", inv.host.Home)
	for _, k := range slices.Sorted(maps.Keys(inv.Env)) {
		if why := refusedEnv(k); why != "" {
			inv.log.Warn("env_injections: variable dropped", "name", k, "why", why)
			continue
		}
		set(k, inv.Env[k])
	}
	data := a.userData()
	set("METNOS_USER_DATA", data)
	set("METNOS_USER_STATE", a.cfg.Layout.UserState())
	set("METNOS_USER_CONFIG", a.cfg.Layout.UserConfig())
	set("METNOS_WORKSPACE", a.cfg.Layout.Workspace())
	if exe, err := os.Executable(); err == nil {
		set("METNOS_CLIENT_EXE", exe)
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+vars[k])
	}
	return env
}
