// Package shim is the small program that runs inside the sandbox, between
// bubblewrap (when there is one) and the command: it sets rlimits, drops
// every capability, sets no_new_privs, lowers its priority (nice, I/O
// class, autogroup), applies Landlock and seccomp to itself and then
// executes the command, so that the command starts already confined. Where no PID namespace holds the process tree, a second shim
// process supervises: it becomes a child subreaper, runs the confined shim
// as its child, and kills every descendant when the command ends or the
// deadline passes.
//
// The shim is re-executed for every run, so this package links nothing
// heavy: no net/http, no tsnet. It is reached either through the lean
// cmd/metnos-shim binary or through the agent binary's hidden [Arg]
// subcommand.
//
// The shim reports to its parent through file descriptor 3: one JSON
// [Status] line just before it executes the command (the layers it really
// applied), or one with Error set when it could not. The descriptor is
// close-on-exec, so end-of-file right after the ready line means the
// command is running.
package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Arg is the hidden first argument that turns a binary into the shim:
// <binary> Arg <spec JSON> -- <command> [args...].
const Arg = "__metnos-shim"

// StatusFD is the descriptor on which the shim reports its [Status].
const StatusFD = 3

// ProxyListenFD and ProxyBacklog are the descriptor number and the
// backlog with which the shim calls listen(2) on a run's egress proxy
// socket. An agent in a tailnet denies itself and its children
// listen(2) (package tailnet's DenyListen) but for this one call: the
// pair says "the proxy socket in a run's own network namespace", and
// nothing else in the agent listens with it.
//
// The number is below 64, the descriptors a process's table holds
// before it grows: growing it in a multi-threaded process waits for an
// RCU grace period, which cost every narrowed run ~15 ms.
const (
	ProxyListenFD = 63
	ProxyBacklog  = 1009
)

// ExitShimFailed is the exit status of a shim that failed before
// executing the command (its Status line says why).
const ExitShimFailed = 125

// Rule is one Landlock rule: a path and what may be done beneath it.
type Rule struct {
	Path  string `json:"p"`
	Write bool   `json:"w,omitempty"`
	// File marks a rule on a single file rather than a directory.
	File bool `json:"f,omitempty"`
	// Dev allows ioctl on device files beneath it.
	Dev bool `json:"d,omitempty"`
	// RemoveDir allows nothing but removing empty directories beneath
	// Path (the parent of a removable grant).
	RemoveDir bool `json:"r,omitempty"`
}

// Spec is what the agent asks of the shim. It travels as one argv
// element so that nothing else needs to cross bwrap.
type Spec struct {
	// Supervise makes this shim a supervisor: it runs itself again (with
	// Supervise false) as a child and kills the whole tree at the end.
	Supervise bool `json:"supervise,omitempty"`
	// Landlock applies Rules with Landlock (pinned ABI, best effort down
	// to what the kernel has). When false, no Landlock ruleset is made.
	Landlock bool   `json:"landlock,omitempty"`
	Rules    []Rule `json:"rules,omitempty"`
	// Seccomp installs Filters, raw struct sock_filter programs in native
	// byte order, in order (package sandbox/internal/filter builds them).
	Seccomp bool     `json:"seccomp,omitempty"`
	Filters [][]byte `json:"filters,omitempty"`
	// NetCut denies TCP bind/connect (Landlock) and every socket family
	// but AF_UNIX (seccomp).
	NetCut bool `json:"net_cut,omitempty"`
	// Unix allows AF_UNIX sockets (socketpair is always allowed).
	Unix bool `json:"unix,omitempty"`
	// HostPIDs marks a run that shares the host's PID namespace: the
	// shim refuses to start the command unless Landlock with signal
	// scoping (ABI 6) and seccomp are both in force.
	HostPIDs bool `json:"host_pids,omitempty"`
	// NetView marks a run with the network cut in the host's network
	// namespace (Policy.HostNetView): the shim refuses to start the
	// command unless the seccomp filter (which is all that keeps it
	// from AF_INET, AF_INET6 and AF_PACKET) is in force.
	NetView bool `json:"net_view,omitempty"`
	// Proxy, with NetCut, is the port of the run's egress proxy inside
	// its network namespace (which has nothing but a loopback): the shim
	// listens on 127.0.0.1:Proxy, hands the listening socket to the agent
	// over ProxyFD (an inherited unix socket, SCM_RIGHTS) before anything
	// else, and Landlock then lets the command connect to that port
	// alone, bind none, and seccomp lets it open TCP sockets only. The
	// agent accepts on that socket and proxies each connection; nothing
	// of the proxy runs in the sandbox, so the command can neither kill
	// it nor take its place.
	Proxy   int `json:"proxy,omitempty"`
	ProxyFD int `json:"proxy_fd,omitempty"`
	// Rlimits to set, by name: "as", "nproc", "fsize", "nofile", "core",
	// "nice", and "cpu" (seconds: SIGXCPU at the limit, SIGKILL one
	// second of processor time later).
	Rlimits map[string]uint64 `json:"rlimits,omitempty"`
	// Nice, above 0, is the nice value the command runs at; SchedIdle
	// runs it under SCHED_IDLE; IOPrio, when not 0, is its
	// ioprio_set(2) value (class<<13 | level). All three are set on the
	// thread that executes the command, after the shim's own work and
	// before Landlock, and every process the command starts inherits
	// them.
	Nice      int  `json:"nice,omitempty"`
	SchedIdle bool `json:"sched_idle,omitempty"`
	IOPrio    int  `json:"ioprio,omitempty"`
	// Autogroup, above 0, is the nice value to give the run's autogroup
	// (/proc/self/autogroup): where the kernel schedules each session as
	// a group of its own, the run's session competes with the owner's as
	// one group, whatever the nice values inside it. AgentAutogroup is
	// the agent's own autogroup, which the shim never changes (it would
	// renice the agent's session).
	Autogroup      int    `json:"autogroup,omitempty"`
	AgentAutogroup string `json:"agent_autogroup,omitempty"`
	// CgroupFDs are open cgroup.procs (v2) or tasks (v1) files
	// (inherited descriptors) the shim joins, by writing "0" from the
	// thread that executes the command, before anything else: the run's
	// cgroups for its process and memory limits.
	CgroupFDs []int `json:"cgroup_fds,omitempty"`
	// Dir is the working directory to enter before restricting.
	Dir string `json:"dir,omitempty"`
	// EnvFD is an inherited descriptor (a sealed memfd) holding the
	// command's whole environment, NUL-separated; 0 means the shim's own.
	// It travels this way so that bwrap, which runs on the host
	// unconfined, and the shim start with an empty environment (no
	// LD_PRELOAD of the command's reaches them), and so that it is not
	// in any command line, which every user of the machine can read.
	EnvFD int `json:"env_fd,omitempty"`
}

// Status is the shim's report on descriptor 3.
type Status struct {
	// Ready is true on the line written just before exec.
	Ready bool `json:"ready,omitempty"`
	// LandlockABI is the ABI the kernel gave, 0 when it has none.
	LandlockABI int `json:"landlock_abi"`
	// Landlock is true when a Landlock ruleset was enforced.
	Landlock bool `json:"landlock,omitempty"`
	// Seccomp is true when the seccomp filter was installed.
	Seccomp bool `json:"seccomp,omitempty"`
	// NoNewPrivs and CapsDropped report the privilege state checked
	// after dropping.
	NoNewPrivs  bool `json:"nnp,omitempty"`
	CapsDropped bool `json:"caps_dropped,omitempty"`
	// Error is set when the shim failed; the command did not run.
	Error string `json:"error,omitempty"`
	// Layer marks an Error of a dry run's layer stage (see [LayerArg]):
	// the layer could not be made, and bubblewrap never started.
	Layer bool `json:"layer,omitempty"`
	// Exited, ExitCode and Signal are sent by a supervisor when the
	// command has ended.
	Exited   bool   `json:"exited,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	// Clock, on the ready line, is when the shim reached each of its
	// steps, for the agent's timing of the run's set-up.
	Clock *Clock `json:"clock,omitempty"`
	// Prio, on the ready line, is what the shim applied of the run's
	// priority.
	Prio *Prio `json:"prio,omitempty"`
	// AutogroupAt, on a supervisor's line that the command ended, is
	// when the supervisor saw the run's autogroup at Spec.Autogroup (Unix
	// nanoseconds; 0 never): it keeps setting it while the kernel's rate
	// limit refuses.
	AutogroupAt int64 `json:"autogroup_at,omitempty"`
}

// Prio is what the shim applied of the run's priority before it
// executed the command: nothing that failed is in it.
type Prio struct {
	// Nice is the nice value set, SchedIdle whether SCHED_IDLE was, and
	// IOPrio the ioprio_set(2) value set (0: none).
	Nice      int  `json:"nice,omitempty"`
	SchedIdle bool `json:"sched_idle,omitempty"`
	IOPrio    int  `json:"ioprio,omitempty"`
	// Autogroup is the nice value given to the run's autogroup, and
	// AutogroupDeferred says the kernel refused it for now (it lets
	// processes without CAP_SYS_ADMIN set one ten times a second,
	// machine-wide): whoever waits for the run keeps trying.
	Autogroup         int  `json:"autogroup,omitempty"`
	AutogroupDeferred bool `json:"autogroup_deferred,omitempty"`
	// CPUTime is the RLIMIT_CPU soft limit in force, in seconds (0:
	// none).
	CPUTime uint64 `json:"cpu_time,omitempty"`
	// Failed says what was asked and not applied, and why.
	Failed []string `json:"failed,omitempty"`
}

// Clock holds wall-clock instants of the shim's run, in nanoseconds
// since the Unix epoch: the wall clock is the one the agent and the
// shim share across namespaces (bwrap makes no time namespace). Zero
// is a step the shim did not take.
type Clock struct {
	// Main is when the shim's main began: bwrap, its namespaces and
	// mounts, the shim's exec and its Go runtime's start came before.
	Main int64 `json:"main"`
	// Landlock is when it began enforcing Landlock, after the cgroups,
	// environment, rlimits, capabilities and no_new_privs.
	Landlock int64 `json:"landlock,omitempty"`
	// Seccomp is when it began installing the seccomp filters.
	Seccomp int64 `json:"seccomp,omitempty"`
	// Done is when it was about to write the ready line.
	Done int64 `json:"done"`
}

// mainAt is when Main began.
var mainAt time.Time

// EncodeArgs returns the argv, after the binary itself, that runs argv
// under the shim with spec.
func EncodeArgs(spec Spec, argv []string) ([]string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("shim: encoding spec: %w", err)
	}
	return append([]string{Arg, string(b), "--"}, argv...), nil
}

// MainIfShim runs the shim when os.Args[1] is [Arg] (or the layer stage
// of a dry run when it is [LayerArg]), and then never returns: it ends
// the process with os.Exit and the status [Main] (or [MainLayer])
// returned (or the command replaced it). Otherwise it returns at once. Binaries that can serve as the shim call
// it first thing in main (and tests in TestMain).
func MainIfShim() {
	if len(os.Args) > 1 && os.Args[1] == Arg {
		os.Exit(Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == LayerArg {
		os.Exit(MainLayer(os.Args[2:]))
	}
}

// Main runs the shim on args (spec JSON, "--", command...) and returns
// an exit status only when it fails; on success it does not return.
func Main(args []string) int {
	mainAt = time.Now()
	status := os.NewFile(StatusFD, "shim-status")
	if len(args) < 3 || args[1] != "--" {
		return fail(status, fmt.Errorf("usage: %s SPEC -- COMMAND [ARG...]", Arg))
	}
	var spec Spec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		return fail(status, fmt.Errorf("decoding spec: %w", err))
	}
	return run(status, spec, args[2:])
}

func fail(status *os.File, err error) int {
	report(status, Status{Error: err.Error()})
	fmt.Fprintf(os.Stderr, "metnos-shim: %v\n", err)
	return ExitShimFailed
}

func report(status *os.File, s Status) {
	if status == nil {
		return
	}
	b, _ := json.Marshal(s)
	status.Write(append(b, '\n'))
}
