//go:build windows

// # What Run guarantees on Windows
//
// The rungs are in the package doc (doc.go) and their plan in winplan.go;
// on every rung (docs/protocol.md §12.4):
//
//   - The command is created suspended (CREATE_SUSPENDED, CREATE_NO_WINDOW),
//     put in a Job Object of its own, checked to be in it, and only then
//     resumed: not one instruction of it runs outside the job. What it
//     starts the ordinary way is in the job too, and the job lets nothing
//     break away (neither BREAKAWAY_OK nor SILENT_BREAKAWAY_OK is set).
//   - The deadline (and a cancelled context) terminates the job, so the
//     whole tree dies (Output.TimedOut; exit code -1). When the command
//     exits, whatever it left running is killed too. The job is
//     KILL_ON_JOB_CLOSE: if the agent dies, Windows closes its handle and
//     kills the tree.
//   - Each process may commit at most Limits.MemoryBytes (when set, else
//     512 MiB); at most 8 processes (or
//     Limits.MaxProcs, if lower) are alive at once; an unhandled
//     exception ends a process instead of waiting on an error dialog.
//     Output.LimitsBy is "job-object".
//   - The working directory is a fresh scratch folder,
//     %TEMP%\metnos-exec-<pid>-<32 hex> (or Request.Dir when set), and
//     TEMP and TMP always point to that folder, which is removed
//     afterwards. The environment is exactly Request.Env plus TEMP and
//     TMP, SystemRoot when Request.Env lacks it (the Windows folder,
//     without which Winsock fails) and, in an AppContainer, LOCALAPPDATA
//     (CreateProcess needs it); the command inherits nothing else of the
//     agent's: no variable and no handle but its three pipes.
//   - A Request or Policy whose minimum is above the rung's level, or whose profile forbids fallback
//     (full-fs-no-net), is refused with a [*RefusedError] before anything
//     starts.
//
// It does not guarantee:
//
//   - On the job-object rung, containment against a hostile command. It
//     runs as the agent's user, so it can open the agent's own process
//     and start a process with the agent as its parent
//     (PROC_THREAD_ATTRIBUTE_PARENT_PROCESS), outside the run's job, or
//     have WMI, Task Scheduler or COM start one: such a process is
//     neither limited nor killed with the tree. The low-integrity and
//     AppContainer rungs cannot open the agent's process. Run still
//     returns: output still flowing 2 s after the tree died is cut off.
//   - Batch files (.bat, .cmd) are refused: cmd.exe parses their command
//     line in ways no quoting makes safe.
//   - Below the AppContainer, file and network isolation: grants, masks
//     (the nucleus: keys, browser profiles, the agent's own state) and a
//     Policy's network cut are not enforced (on the low-integrity rung,
//     writes are); Output.Reason says so on every run.
//   - Limits.FileBytes, or OOMKilled: a process over its memory limit sees
//     its allocations fail, which shows as its own error.
//   - Under Wine (the CI), memory and process limits are accepted but not
//     enforced.
//
// With Options.Disabled (the agent's METNOS_SANDBOX=off) there is no job at all: the word
// is "none", only the direct child is killed at the deadline, and any
// minimum above "none" is refused.

package sandbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/windows"

	"github.com/metnos/agent/policy"
)

// Probe reports what this machine offers: on Windows a job object,
// unless o.Disabled turns it off.
//
// It tries each rung once per process (and set of options): a process
// started suspended in this device's AppContainer, then one with a
// low-integrity token, each checked by its token and killed before it
// runs an instruction.
func Probe(o Options) Caps {
	c := Caps{OS: runtime.GOOS, Disabled: o.Disabled}
	if c.Disabled != "" {
		return c
	}
	if o.jobOnly {
		c.AppContainerNote, c.LowIntegrityNote = "not tried (the job-object rung's tests)", "not tried (the job-object rung's tests)"
		return c
	}
	return probeRungs(o, c)
}

// planFor is the Windows planner ([winPlanFor]).
func planFor(c Caps, p policy.Policy, min policy.Level) Plan { return winPlanFor(c, p, min, false) }

func run(ctx context.Context, req Request) (Output, error) {
	c := Probe(req.Options)
	pl := winPlanFor(c, req.Policy, req.MinSandbox, req.Options.StrictEgress)
	out := Output{Policy: req.Policy.Fingerprint(), Sandbox: "none"}
	if pl.Refused != "" {
		return out, &RefusedError{Have: pl.Sandbox, Why: pl.Refused}
	}
	name := req.Argv[0]
	if req.Dir != "" && !filepath.IsAbs(name) && strings.ContainsAny(name, `\/`) {
		// A relative path names a file in the command's working
		// directory, as on the other systems, not in the agent's.
		name = filepath.Join(req.Dir, name)
	}
	exe, err := lookPath(name, req.Env, isRegularFile)
	if err != nil {
		return out, err
	}
	if ext := strings.ToLower(filepath.Ext(exe)); ext == ".bat" || ext == ".cmd" {
		// CreateProcess hands a batch file to cmd.exe, whose parsing of
		// the command line no quoting makes safe ("BatBadBut").
		return out, fmt.Errorf("sandbox: %s is a batch file, which cmd.exe would run with arguments it parses unsafely: run the program it starts instead", exe)
	}
	removeStaleScratch(req.Logger)
	scratch, err := newScratch()
	if err != nil {
		return out, err
	}
	defer func() {
		if err := removeTree(scratch); err != nil {
			req.Logger.Warn("sandbox: scratch folder left behind", "err", err)
		}
	}()
	env := withEnv(withEnv(req.Env, "TEMP", scratch), "TMP", scratch)
	if _, ok := envValue(env, "SystemRoot"); !ok {
		// Winsock, and with it every program's network, fails without it.
		if d, err := windows.GetWindowsDirectory(); err == nil {
			env = withEnv(env, "SystemRoot", d)
		}
	}
	var rp *runProxy
	if e := egressOf(req.Policy); e != nil && pl.win != rungAppContainer {
		// An AppContainer cannot reach loopback: it gets internetClient
		// instead, and its reason says the host list is not held.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return out, fmt.Errorf("sandbox: the egress proxy's listener: %w", err)
		}
		rp = newRunProxy(*e, req.Options, l.Addr().String(), false)
		go rp.serve(l)
		defer rp.stop()
		env = proxyEnv(env, rp.addr)
	}
	dir := req.Dir
	if dir == "" {
		dir = scratch
	}
	reason := pl.Reason
	var so spawnOpts
	switch pl.win {
	case rungAppContainer:
		sid, err := containerSID(containerName(req.Options))
		if err != nil {
			forgetRungs()
			return out, fmt.Errorf("sandbox: the AppContainer for %s: %w", exe, err)
		}
		l := ledgerFor(req.Options, sid.String(), req.Logger)
		if _, err := l.recover(); err != nil {
			req.Logger.Warn("sandbox: access entries a run cut short left could not all be removed", "err", err)
		}
		acl := planACLs(req.Policy, scratch, statKind)
		if len(acl.Absent) > 0 {
			reason += "; under a write grant, these nucleus paths do not exist and no entry can deny them, so the command could create them: " + strings.Join(acl.Absent, ", ")
		}
		grants, err := l.apply(nextRunID(), acl.ACEs)
		if err != nil {
			return out, fmt.Errorf("sandbox: granting the AppContainer its folders for %s: %w", exe, err)
		}
		defer func() {
			if err := grants.release(); err != nil {
				req.Logger.Warn("sandbox: the AppContainer's access entries could not all be removed; the next start tries again", "err", err)
			}
		}()
		_, names := winNetwork(req.Policy, pl.win)
		caps, err := containerCaps(names)
		if err != nil {
			return out, err
		}
		so = spawnOpts{container: sid, caps: caps}
		env = containerEnv(env)
	case rungLowIntegrity:
		if err := labelLow(scratch); err != nil {
			return out, err
		}
		t, err := lowIntegrityToken()
		if err != nil {
			forgetRungs()
			return out, fmt.Errorf("sandbox: the low-integrity token for %s: %w", exe, err)
		}
		defer t.Close()
		so = spawnOpts{token: t}
	}
	var j *job
	pp := priorityPlan(req.Options.Priority, req.Limits.Timeout, runtime.NumCPU())
	jl := jobLimitsFor(req.Limits).withPriority(pp)
	prio := &PriorityReport{}
	if c.Disabled == "" {
		if j, err = newJob(jl); err != nil {
			return out, err
		}
		defer j.close()
		out.LimitsBy = wordJobObject
		jobPriority(j, jl, pp, prio)
	}
	ch, err := startSuspended(exe, req.Argv, env, dir, so)
	if err != nil {
		return out, err
	}
	defer ch.close()
	if j != nil {
		if err := j.assign(ch.process); err != nil {
			_ = ch.kill(jobKilledExitCode)
			ch.closePipes()
			return out, fmt.Errorf("sandbox: putting %s in its job object: %w", exe, err)
		}
	}
	// What the token says, not what the calls returned: never resume a
	// process that does not run as the plan says.
	var cerr error
	switch pl.win {
	case rungAppContainer:
		cerr = checkContainer(ch.process, so.container)
	case rungLowIntegrity:
		cerr = checkLowIntegrity(ch.process)
	}
	if cerr != nil {
		_ = ch.kill(jobKilledExitCode)
		ch.closePipes()
		forgetRungs()
		return out, &RefusedError{Have: pl.Sandbox, Why: fmt.Sprintf("%s did not start as %s (%v): it was killed before it ran", exe, pl.Sandbox, cerr)}
	}
	// Still suspended: the priority class is checked, or set, before
	// the command's first instruction.
	processPriority(ch.process, j != nil, jl, prio)
	out.Priority = prio
	start := time.Now()
	if err := ch.resume(); err != nil {
		_ = ch.kill(jobKilledExitCode)
		ch.closePipes()
		return out, err
	}
	out.Sandbox, out.Reason = pl.Sandbox, reason
	res := supervise(ctx, ch, j, req)
	if rp != nil {
		out.Network = rp.stop()
	}
	out.Wall = time.Since(start)
	out.Stdout, out.StdoutTruncated = res.stdout.buf, res.stdout.dropped
	out.Stderr, out.StderrTruncated = res.stderr.buf, res.stderr.dropped
	out.TimedOut = res.timedOut
	out.ExitCode = int(res.code)
	out.CPUTimeExceeded = !res.timedOut && res.ctxErr == nil && jobTimeUsedUp(j, jl, res.code)
	if res.timedOut || res.ctxErr != nil {
		out.ExitCode = -1
	}
	if res.err != nil {
		return out, fmt.Errorf("sandbox: running %s: %w", exe, res.err)
	}
	return out, res.ctxErr
}

// supervised is how a run ended.
type supervised struct {
	stdout, stderr *capped
	code           uint32
	timedOut       bool
	ctxErr, err    error
}

// supervise feeds the child's stdin, collects its output, and waits for
// it until it exits, the deadline passes or ctx is done; then it kills
// whatever is left of the tree and waits for the output to end.
func supervise(ctx context.Context, ch *child, j *job, req Request) supervised {
	res := supervised{
		stdout: &capped{limit: req.Limits.OutputBytes},
		stderr: &capped{limit: req.Limits.OutputBytes},
	}
	go feed(ch.stdin, req.Stdin)
	ch.stdin = 0 // feed closes it
	outDone := drain(ch.stdout, res.stdout)
	errDone := drain(ch.stderr, res.stderr)

	waitc := make(chan error, 1)
	go func() {
		_, err := windows.WaitForSingleObject(ch.process, windows.INFINITE)
		waitc <- err
	}()
	timer := time.NewTimer(req.Limits.Timeout)
	defer timer.Stop()
	var werr error
	select {
	case werr = <-waitc:
	case <-timer.C:
		res.timedOut = true
		res.err = killAll(ch, j)
		werr = <-waitc
	case <-ctx.Done():
		res.ctxErr = ctx.Err()
		res.err = killAll(ch, j)
		werr = <-waitc
	}
	if werr != nil && res.err == nil {
		res.err = fmt.Errorf("waiting for process %d: %w", ch.pid, werr)
	}
	code, err := ch.exitCode()
	if err != nil && res.err == nil {
		res.err = err
	}
	res.code = code
	if j != nil {
		// The command is done: whatever it left running dies now.
		if err := j.terminate(jobKilledExitCode); err != nil && res.err == nil {
			res.err = err
		}
	}
	finishDrain(ch.stdout, outDone)
	finishDrain(ch.stderr, errDone)
	ch.stdout, ch.stderr = 0, 0
	return res
}

// killAll terminates the run: the whole job, or the child alone when
// there is no job.
func killAll(ch *child, j *job) error {
	if j != nil {
		if err := j.terminate(jobKilledExitCode); err == nil {
			return nil
		}
	}
	return ch.kill(jobKilledExitCode)
}

// feed copies r (nil: nothing) to the child's stdin as the child reads
// it, then closes it.
func feed(h windows.Handle, r io.Reader) {
	defer windows.CloseHandle(h)
	if r == nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		m, rerr := r.Read(buf)
		for b := buf[:m]; len(b) > 0; {
			var n uint32
			if err := windows.WriteFile(h, b, &n, nil); err != nil {
				return
			}
			b = b[n:]
		}
		if rerr != nil {
			return
		}
	}
}

// draining is a drain in progress: done is closed when it ends; stop
// asks it to end after its current read.
type draining struct {
	done chan struct{}
	stop atomic.Bool
}

// drain copies the pipe h into dst until the pipe ends or it is asked
// to stop.
func drain(h windows.Handle, dst *capped) *draining {
	d := &draining{done: make(chan struct{})}
	go func() {
		defer close(d.done)
		buf := make([]byte, 32<<10)
		for !d.stop.Load() {
			var n uint32
			err := windows.ReadFile(h, buf, &n, nil)
			if n > 0 {
				dst.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return d
}

// drainGrace is how long output may keep flowing once the tree is dead:
// only a process outside the job could still hold a pipe.
const drainGrace = 2 * time.Second

// finishDrain waits for a drain to end; after drainGrace (a process
// outside the job still writing) it asks the drain to stop and cancels
// its reads until it has: one cancel can fall between two reads and be
// lost. Then it closes the pipe.
func finishDrain(h windows.Handle, d *draining) {
	select {
	case <-d.done:
	case <-time.After(drainGrace):
		d.stop.Store(true)
		for stopped := false; !stopped; {
			_ = windows.CancelIoEx(h, nil)
			select {
			case <-d.done:
				stopped = true
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	windows.CloseHandle(h)
}

// networkNote says how a run of p planned as pl holds its network.
func networkNote(_ Caps, p policy.Policy, pl Plan) string {
	note, _ := winNetwork(p, pl.win)
	return note
}

// runCount numbers the runs of this process, for their ledger records.
var runCount atomic.Int64

// nextRunID names a run of this process.
func nextRunID() string {
	return fmt.Sprintf("run-%d-%d", os.Getpid(), runCount.Add(1))
}

// statKind is what path is on the disk.
func statKind(path string) pathKind {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return kindAbsent
	case fi.IsDir():
		return kindDir
	}
	return kindFile
}

// containerEnv is env with LOCALAPPDATA, which CreateProcess needs to
// start a process in an AppContainer (it fails with
// ERROR_ENVVAR_NOT_FOUND without it): this user's, from the shell's
// known folders, unless env has one.
func containerEnv(env []string) []string {
	if _, ok := envValue(env, "LOCALAPPDATA"); ok {
		return env
	}
	if p, err := windows.KnownFolderPath(windows.FOLDERID_LocalAppData, 0); err == nil {
		return withEnv(env, "LOCALAPPDATA", p)
	}
	return env
}

// SweepOrphans kills what half-set-up sandboxes of this user were left
// behind by an agent that died starting them; there are none here (no
// bubblewrap).
func SweepOrphans(*slog.Logger) int { return 0 }
