package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"time"

	"github.com/metnos/agent/policy"
)

// Request is one command to run in a sandbox.
type Request struct {
	// Argv is the command and its arguments. Argv[0] is looked up in
	// the PATH given in Env (or a default system PATH) when it has no
	// slash.
	Argv []string
	// Stdin is the command's standard input; nil means empty. An
	// *os.File that is a pipe is handed to the command as it is, so that
	// the command reads it as it goes and nothing is read ahead or held
	// in memory; any other file or reader is copied to the command as it
	// reads (a descriptor of the caller's, such as a file open for
	// writing, never reaches it), then closed. An invocation's bytes come
	// as a [bytes.Reader].
	Stdin io.Reader
	// Env is the command's whole environment, as "KEY=value". The
	// sandbox starts from nothing: no variable of the agent's own
	// environment reaches the command unless it is listed here.
	Env []string
	// Dir is the working directory; it must be visible in the sandbox.
	// Empty means "/" (or the first grant, when there is one).
	Dir string
	// Policy says what the command may touch.
	Policy policy.Policy
	// Limits bound the run; zero fields take this system's defaults
	// (see [Limits]).
	Limits Limits
	// MinSandbox is the agent-wide minimum; the stronger of it and
	// Policy.MinSandbox applies.
	MinSandbox policy.Level
	// Logger receives what the caller should know of the run that is
	// not in its Output: a fall back to a weaker sandbox and why, what
	// could not be cleaned up. Nil discards it. The sandbox logs
	// nowhere else.
	Logger *slog.Logger
	// Options are the caller's settings of the sandbox (which bwrap and
	// shim, where the placeholder locks go, whether it is off).
	Options Options
	// DryRun runs the command with every folder it may write behind a
	// copy-on-write layer that is thrown away afterwards (Linux, with
	// bubblewrap: see the package doc), and with METNOS_DRY_RUN=1 in its
	// environment; Output.DryRun lists what it would have changed.
	// Where the layer cannot be made (another system, no bubblewrap, the
	// sandbox off, a policy whose root is writable, a kernel that will
	// not mount it), Run refuses with a [*RefusedError] whose DryRun is
	// set: it never runs the command for real instead.
	DryRun bool
}

// Output is what a run produced and how it was isolated.
type Output struct {
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	// ExitCode is the command's exit status, or -1 when it was killed
	// by a signal.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the command, if one did.
	Signal string `json:"signal,omitempty"`
	// Wall is the elapsed time from start to the end of the tree.
	Wall time.Duration `json:"wall_ns"`
	// TimedOut is true when the deadline killed the tree.
	TimedOut bool `json:"timed_out,omitempty"`
	// OOMKilled is true when the memory limit ended the run: the kernel
	// reported an OOM kill in the run's cgroup (memory.events) and the
	// command's main process died of SIGKILL, or the command could not
	// even start under the limit. A child process killed by the limit
	// while the main process went on and ended by itself does not count:
	// the command's exit status and output are then its own. Rlimit
	// failures show up as the command's own errors instead.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// CPUTimeExceeded is true when the CPU-time limit ended the run
	// (Priority.CPUTime): the command's main process was killed by it
	// (SIGXCPU on Linux and macOS; on Windows the job's user time ran
	// out). A child it killed while the main process went on does not
	// count, as for OOMKilled.
	CPUTimeExceeded bool `json:"cpu_time_exceeded,omitempty"`
	// Priority says what of Options.Priority was applied to the run and
	// what was not, and why; nil when the command did not start.
	Priority *PriorityReport `json:"priority,omitempty"`
	// Limits are the limits the run had, with the defaults of this
	// system in the fields the Request left unset: what a message about
	// a limit must name.
	Limits Limits `json:"limits"`
	// Sandbox names the layers actually applied, joined by "+":
	// "bwrap+landlock+seccomp", "landlock+seccomp", "seccomp", "none".
	Sandbox string `json:"sandbox"`
	// Reason says why Sandbox is weaker than every layer
	// ("bwrap+landlock+seccomp"): what this machine lacks, or what
	// turned a layer off; and what the run shares with the host (the
	// host's PID namespace, for a Policy with HostPIDs). Empty when all
	// were applied and nothing is shared.
	Reason string `json:"reason,omitempty"`
	// Limits says how the limits were enforced: "cgroup" or "rlimit".
	LimitsBy string `json:"limits_by,omitempty"`
	// Policy is the fingerprint of the Policy that was applied.
	Policy string `json:"policy"`
	// Network is what the run's egress proxy saw, for a Policy with
	// Egress (and Network false); nil otherwise.
	Network *NetReport `json:"network,omitempty"`
	// Timing is where the run's time went, where the platform measures
	// it (Linux); nil elsewhere.
	Timing *Timing `json:"timing,omitempty"`
	// DryRun is what a dry run (Request.DryRun) would have changed; nil
	// for any other run.
	DryRun *DryRun `json:"dry_run,omitempty"`
}

// ErrRefused is wrapped by every error that refuses a run because the
// sandbox this machine can give is weaker than the Policy, the
// manifest or the agent requires. Nothing was started.
var ErrRefused = errors.New("sandbox refused")

// RefusedError is the error Run returns when it will not start the
// command. It wraps [ErrRefused].
type RefusedError struct {
	// Have is the sandbox word this machine could give.
	Have string
	// Why explains what was required and what is missing.
	Why string
	// DryRun is set when the refusal is a dry run's (Request.DryRun):
	// its layer cannot be made here, and the command is not run for
	// real instead.
	DryRun bool
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("sandbox refused: %s (this machine gives %q)", e.Why, e.Have)
}

// Unwrap returns [ErrRefused].
func (e *RefusedError) Unwrap() error { return ErrRefused }

// Run runs req.Argv in the strongest sandbox this machine offers for
// req.Policy and returns what it printed and how it ended.
//
// A command that runs and fails is not an error: its exit status is in
// the Output. Run returns an error only when the command could not be
// started, or when it refused to start it (a [*RefusedError]): the
// Policy needs a kernel network cut or a minimum sandbox this machine
// cannot give.
//
// On Linux the first Run makes the calling process a child subreaper
// (PR_SET_CHILD_SUBREAPER): what a run leaves behind once bubblewrap's
// outer process has exited (its child, the sandbox's pid 1) is
// reparented to it rather than to PID 1, and Run reaps it, or kills and
// reaps it, before it returns. A caller that starts processes of its own
// gets their orphans too, and must wait for them.
func Run(ctx context.Context, req Request) (Output, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return Output{}, errors.New("sandbox: empty command")
	}
	req.Limits = limitsFor(runtime.GOOS, req.Limits)
	req.Policy.Normalize()
	if req.Logger == nil {
		req.Logger = slog.New(slog.DiscardHandler)
	}
	if req.DryRun {
		req.Env = setEnv(req.Env, "METNOS_DRY_RUN", "1")
		if why := dryRunOS(runtime.GOOS); why != "" {
			pl := PlanFor(req.Options, req.Policy, req.MinSandbox)
			return Output{Policy: req.Policy.Fingerprint(), Sandbox: "none", Limits: req.Limits}, &RefusedError{Have: pl.Sandbox, Why: why, DryRun: true}
		}
	}
	out, err := run(ctx, req)
	out.Limits = req.Limits
	return out, err
}

// FormatBytes writes a size of n bytes the way limits are given and
// read: "256 MiB", "1.5 MiB", "64 KiB", "1 byte".
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	case n == 1:
		return "1 byte"
	}
	return fmt.Sprintf("%d bytes", n)
}

// Timing splits a run's time into its stages, each measured by the
// agent (the shim's ready line marks the end of the set-up).
type Timing struct {
	// Prepare is the plan, the layout, the cgroup, the placeholder
	// locks and the descriptors, before anything is started.
	Prepare time.Duration `json:"prepare_ns"`
	// Setup is from the start of bwrap (or the shim) to the shim's
	// ready line, just before it executes the command: namespaces,
	// mounts, Landlock, seccomp. 0 when no ready line came.
	Setup time.Duration `json:"setup_ns"`
	// Bwrap, Shim, Landlock and Seccomp split Setup by the shim's own
	// clock (shim.Clock), zero where it reported none: Bwrap runs to
	// the shim's main (bwrap, its namespaces and mounts, the shim's exec
	// and its Go runtime's start); Shim is the shim's work before
	// Landlock (cgroups, environment, rlimits, capabilities,
	// no_new_privs); Landlock and Seccomp are their enforcing. What is
	// left of Setup is the ready line's way back.
	Bwrap    time.Duration `json:"bwrap_ns,omitempty"`
	Shim     time.Duration `json:"shim_ns,omitempty"`
	Landlock time.Duration `json:"landlock_ns,omitempty"`
	Seccomp  time.Duration `json:"seccomp_ns,omitempty"`
	// Command is from the ready line to the command's exit (for a
	// Python executor, the interpreter's start, its imports and the
	// executor's own work).
	Command time.Duration `json:"command_ns"`
	// Finish is the reaping and reading of the outcome after the exit.
	Finish time.Duration `json:"finish_ns"`
}
