package sandbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox/internal/filter"
	"github.com/metnos/agent/sandbox/shim"
)

// planFor is the Linux planner: the layers c offers, fewer when the
// sandbox is disabled, and whether p (with the agent-wide minimum min)
// is refused with them.
func planFor(c Caps, p policy.Policy, min policy.Level) Plan {
	best := layers{bwrap: c.BwrapUsable, landlock: c.LandlockABI > 0, seccomp: c.Seccomp}
	use := best
	var why []string
	if c.Disabled != "" {
		use = layers{}
		why = append(why, c.Disabled)
	}
	if !c.BwrapUsable {
		why = append(why, c.BwrapError)
	}
	if c.LandlockABI == 0 {
		why = append(why, "the kernel has no Landlock (needs Linux 5.13+ with landlock in the lsm= list)")
	}
	if !c.Seccomp {
		why = append(why, "the kernel does not support seccomp filters")
	}
	pl := Plan{Sandbox: use.word(), Best: best.word(), lay: use}
	if use != (layers{true, true, true}) {
		pl.Reason = strings.Join(why, "; ")
	}
	if p.HostPIDs {
		pl.Reason = joinReason(pl.Reason, hostPIDsShared)
	}
	netView := p.HostNetView && !p.Network
	if netView {
		pl.Reason = joinReason(pl.Reason, hostNetViewShared)
	}
	need := p.MinSandbox
	if min > need {
		need = min
	}
	proxied := egressOf(p) != nil
	switch {
	case proxied && netView:
		pl.Refused = "the run asks for the host's network interfaces (system:read network_interfaces) and for a network narrowed to named hosts (network:*): the first needs the host's network namespace, the second a namespace with nothing in it but the run's proxy"
	case proxied && !use.bwrap:
		pl.Refused = "the run's network is narrowed to the hosts its manifest names, which needs a network namespace of its own (bubblewrap): in the host's, Landlock's TCP rules go by port alone and would let the command reach any address on the proxy's port: " + pl.Reason
	case p.HostPIDs && (!use.landlock || c.LandlockABI < 6 || !use.seccomp):
		pl.Refused = hostPIDsRefusal(c, use)
	case netView && (!use.seccomp || (p.UnixSockets && (!use.landlock || c.LandlockABI < 6))):
		pl.Refused = hostNetViewRefusal(c, use)
	case p.NoFallback && !use.bwrap:
		pl.Refused = fmt.Sprintf("profile %s needs bubblewrap's namespaces and will not fall back: %s", p.Profile, pl.Reason)
	case p.UnixSockets && !use.bwrap && len(p.Masks) > 0:
		// Landlock (ABI < 9) does not check connect(2) on a unix socket
		// path, so without bwrap's masks a masked socket (the session
		// bus) would be reachable.
		pl.Refused = "the policy allows unix sockets, and without bwrap nothing here can keep the masked session sockets out of reach: " + pl.Reason
	case !p.Network && !use.bwrap && !use.seccomp:
		pl.Refused = "the policy cuts the network, and without bwrap or seccomp nothing here can enforce the cut: " + pl.Reason
	case use.level() < need:
		pl.Refused = fmt.Sprintf("minimum sandbox %q not met: %s", need, pl.Reason)
	}
	return pl
}

// hostPIDsRefusal says why a run sharing the host's PID namespace is
// refused with the layers use: without a user namespace or Landlock,
// nothing keeps it from the other processes' environment and memory
// (Landlock's ptrace check); without Landlock ABI 6 (signal scoping) and
// seccomp (ptrace, process_vm_*, pidfd_*, kcmp), nothing keeps it from
// signalling or tracing them.
func hostPIDsRefusal(c Caps, use layers) string {
	var missing []string
	switch {
	case c.Disabled != "":
		missing = append(missing, c.Disabled)
	case !use.landlock:
		missing = append(missing, "this kernel has no Landlock (needs ABI 6, Linux 6.12, which scopes signals)")
	case c.LandlockABI < 6:
		missing = append(missing, fmt.Sprintf("this kernel's Landlock ABI %d cannot keep the command from signalling host processes (needs ABI 6, Linux 6.12)", c.LandlockABI))
	}
	if !use.seccomp && c.Disabled == "" {
		missing = append(missing, "seccomp filters are not available, so ptrace, process_vm_readv and pidfd_getfd would reach host processes")
	}
	return "system:read processes needs the host's process list, and this sandbox cannot show it without letting the command signal or read other processes: " +
		strings.Join(missing, "; ")
}

// hostNetViewRefusal says why a run that reads the host's network
// interfaces with the network cut is refused: in the host's network
// namespace only the seccomp filter keeps it from AF_INET, AF_INET6
// and AF_PACKET sockets (Landlock has no UDP rules); and where unix
// sockets are allowed, only Landlock's scope (ABI 6) keeps it from the
// host's abstract sockets, which live in the network namespace.
func hostNetViewRefusal(c Caps, use layers) string {
	why := "unix sockets are allowed, and without Landlock ABI 6 (Linux 6.12) nothing keeps the command from the host's abstract unix sockets"
	switch {
	case c.Disabled != "":
		why = c.Disabled
	case !use.seccomp:
		why = "seccomp filters are not available"
	}
	return "system:read network_interfaces needs the host's network namespace, and without seccomp nothing here keeps the command from sending traffic there: " + why
}

func run(ctx context.Context, req Request) (Output, error) {
	out, bwrapBroke, err := runWith(ctx, req, runCaps(req.Options))
	if bwrapBroke {
		// bwrap failed before the command started. If it cannot make
		// its namespaces here at all, plan again without it; nothing
		// has run yet, so nothing runs twice.
		if c := Probe(req.Options); !c.BwrapUsable {
			req.Logger.Warn("sandbox: bubblewrap is not usable here; falling back", "reason", c.BwrapError)
			out, _, err = runWith(ctx, req, c)
		}
	}
	return out, err
}

// runWith runs req with the layers c offers. The bool reports that bwrap
// itself failed before the shim started the command. Its steps: plan,
// lay the Policy out for this run (runLayout), say what the shim applies
// (shimSpec), set the launch up with bwrap or without it (newLaunch),
// run it (execute), and read how it went (outcome).
func runWith(ctx context.Context, req Request, c Caps) (Output, bool, error) {
	began := time.Now()
	pl := planFor(c, req.Policy, req.MinSandbox)
	out := Output{Policy: req.Policy.Fingerprint(), Sandbox: "none"}
	if req.DryRun {
		// Said first: a dry run that cannot be made is refused for that,
		// whatever else this plan lacks.
		if why := dryRunRefusal(c, pl, req.Policy); why != "" {
			return out, false, &RefusedError{Have: pl.Sandbox, Why: why, DryRun: true}
		}
	}
	if pl.Refused != "" {
		return out, false, &RefusedError{Have: pl.Sandbox, Why: pl.Refused}
	}
	exe, err := shimExecutable(req.Options.Shim)
	if err != nil {
		return out, false, err
	}
	l := runLayout(req.Policy, pl.lay, c, exe)
	spec, err := shimSpec(l, pl.lay, req.Limits)
	if err != nil {
		return out, false, err
	}
	var dry *dryRun
	if req.DryRun {
		if dry, err = newDryRun(l, req.Options, pl.Sandbox, req.Logger); err != nil {
			return out, false, err
		}
		defer dry.remove()
	}
	ln, err := newLaunch(req, c, pl.lay, l, spec, exe, dry)
	defer ln.cleanup()
	if err != nil {
		return out, false, err
	}
	out.LimitsBy = ln.cg.by()
	prepared := time.Now()
	ex, err := ln.execute(ctx, req.Stdin, req.Limits)

	if ln.proxy != nil {
		// The tree is gone: what it left open through the proxy ends
		// with it.
		out.Network = ln.proxy.stop()
	}
	if err != nil {
		return out, false, err
	}
	if pl.lay.bwrap {
		out.Sandbox = "bwrap" // until the shim says what it applied
	}
	o, broke, err := outcome(out, pl, ln, ex, req.Argv[0])
	o.Timing = ex.timing(prepared.Sub(began))
	if dry != nil && err == nil && !broke {
		// The run's whole tree is gone: what it wrote is all there.
		o.DryRun, err = dry.report()
	}
	return o, broke, err
}

// runLayout is p as this run mounts it. The agent's own binary and the
// shim run outside the sandbox on the next invocation: no grant may
// reach them. Inside bwrap the shim is a read-only mount already;
// everywhere else both are masked. Where Landlock (ABI 3 or later,
// which confines truncate) and seccomp (which keeps mode, owner, time
// and xattr changes off the parent's other entries) apply, removable
// grants get their parent mounted in their stead.
func runLayout(p policy.Policy, use layers, c Caps, exe string) layout {
	p.Masks = append([]policy.Mask(nil), p.Masks...)
	if self, err := os.Executable(); err == nil && (self != exe || !use.bwrap) {
		p.Masks = append(p.Masks, policy.Mask{Path: self, Kind: policy.MaskFile, Why: "the agent's binary"})
	}
	if !use.bwrap {
		p.Masks = append(p.Masks, policy.Mask{Path: exe, Kind: policy.MaskFile, Why: "the sandbox shim"})
	}
	p.Normalize()
	if use.landlock && use.seccomp && c.LandlockABI >= 3 {
		return withRemovableParents(p, use.bwrap)
	}
	return layout{Policy: p}
}

// shimSpec is what the shim applies for l with the layers use, before
// the launch adds its rules, descriptors and process limit.
func shimSpec(l layout, use layers, lim Limits) (shim.Spec, error) {
	spec := shim.Spec{
		Landlock: use.landlock,
		Seccomp:  use.seccomp,
		NetCut:   !l.Network,
		Unix:     l.UnixSockets,
		HostPIDs: l.HostPIDs,
		NetView:  l.HostNetView && !l.Network,
		Proxy:    proxyPortOf(l.Policy),
		Rlimits: map[string]uint64{
			"as":    uint64(lim.MemoryBytes),
			"fsize": uint64(lim.FileBytes),
			"core":  0,
		},
	}
	if use.seccomp {
		// Without bwrap's mount view, Landlock alone cannot keep chmod,
		// chown, utimes and xattrs off masked files: they are denied. So
		// they are when the parent of a removable grant is mounted
		// writable, for its other entries.
		var err error
		if spec.Filters, err = filter.Programs(filter.Options{NetCut: spec.NetCut, Unix: spec.Unix, Metadata: use.bwrap && len(l.parentOf) == 0, HostPIDs: l.HostPIDs, NetView: spec.NetView, Proxied: spec.Proxy > 0}); err != nil {
			return spec, err
		}
	}
	return spec, nil
}

// fdTable is the descriptors the child inherits after stdin, stdout
// and stderr, in order: the child sees the i-th as descriptor 3+i. The
// shim's status pipe comes first, as shim.StatusFD.
type fdTable struct{ files []*os.File }

// add appends f and returns the descriptor the child will see it as.
func (t *fdTable) add(f *os.File) int {
	t.files = append(t.files, f)
	return 3 + len(t.files) - 1
}

// launch is one run set up: the command line that starts it (bwrap or
// the shim), the descriptors it inherits, its cgroup, its environment,
// and what must be undone once it is over.
type launch struct {
	argv      []string
	env       []string
	fds       fdTable
	statusR   *os.File
	statusW   *os.File
	cg        *runCgroup
	bwrap     bool
	supervise bool
	// infoR is the read end of bwrap's --info-fd, which names bwrap's
	// child, the sandbox's pid 1 (see reapOrphan); nil without bwrap.
	infoR, infoW *os.File
	log          *slog.Logger
	undo         []func()
	// lockDir is Options.LockDir.
	lockDir string
	// prio is the run's priority plan; autogroup the nice value the
	// shim gives the run's autogroup (0: none), which this process
	// keeps trying to set when the kernel refused it for now and no
	// supervising shim does (keepAutogroup).
	prio          prioPlan
	autogroup     int
	keepAutogroup bool
	// proxy is the run's egress proxy, and proxyChild the end of the
	// socket pair over which the shim hands it its listener (closed
	// here once the child has it).
	proxy      *runProxy
	proxyChild *os.File
	// dry is a dry run's layers (nil for any other run).
	dry *dryRun
}

// cleanup undoes, last first, what the launch set up.
func (ln *launch) cleanup() {
	for i := len(ln.undo) - 1; i >= 0; i-- {
		ln.undo[i]()
	}
}

// newLaunch sets the run up: the status pipe, the cgroup, then the
// bwrap view (viaBwrap) or the shim alone (alone), then the environment
// and the shim's arguments. The returned launch is never nil; its
// cleanup undoes what was done, also on error.
func newLaunch(req Request, c Caps, use layers, l layout, spec shim.Spec, exe string, dry *dryRun) (*launch, error) {
	ln := &launch{bwrap: use.bwrap, log: req.Logger, lockDir: req.Options.LockDir, dry: dry}
	var err error
	if ln.statusR, ln.statusW, err = os.Pipe(); err != nil {
		return ln, fmt.Errorf("sandbox: status pipe: %w", err)
	}
	ln.undo = append(ln.undo, func() { ln.statusR.Close(); ln.statusW.Close() })
	if fd := ln.fds.add(ln.statusW); fd != shim.StatusFD {
		return ln, fmt.Errorf("sandbox: the status pipe would be descriptor %d, not %d", fd, shim.StatusFD)
	}
	ln.env = append([]string(nil), req.Env...)
	if !hasEnv(ln.env, "PATH") {
		ln.env = append(ln.env, "PATH=/usr/local/bin:/usr/bin:/bin")
	}
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}
	lim := req.Limits
	// A cgroup, where this process may make one, bounds the whole tree
	// (RLIMIT_NPROC does not hold for root at all, and RLIMIT_AS bounds
	// each process alone); the rlimits it replaces are not set.
	ln.prio = priorityPlan(req.Options.Priority, lim.Timeout, runtime.NumCPU())
	ln.cg = newRunCgroup(lim.MaxProcs, lim.MemoryBytes, weightsOf(ln.prio))
	ln.undo = append(ln.undo, ln.cg.remove)
	if ln.cg != nil {
		for i, f := range ln.cg.procs {
			if i == ln.cg.cpuV1 && ln.prio.p.CPU == CPUNormal {
				continue // see runCgroup.cpuV1
			}
			spec.CgroupFDs = append(spec.CgroupFDs, ln.fds.add(f))
		}
		if ln.cg.memory {
			delete(spec.Rlimits, "as")
		}
	}
	if use.bwrap {
		err = ln.viaBwrap(&spec, c, l, exe, dir, lim)
	} else {
		err = ln.alone(&spec, l, exe, dir, lim)
	}
	if err != nil {
		return ln, err
	}
	ln.supervise = spec.Supervise
	ln.prioritySpec(&spec)
	if e := egressOf(l.Policy); e != nil {
		if err := ln.startProxy(req, &spec, *e); err != nil {
			return ln, err
		}
	}
	// The command's environment goes to the shim in a sealed memfd;
	// bwrap (a host program, not confined) and the shim start with none,
	// and it is in no command line.
	envFile, err := envMemfd(ln.env)
	if err != nil {
		return ln, err
	}
	ln.undo = append(ln.undo, func() { envFile.Close() })
	spec.EnvFD = ln.fds.add(envFile)
	sargs, err := shim.EncodeArgs(spec, req.Argv)
	if err != nil {
		return ln, err
	}
	ln.argv = append(ln.argv, sargs...)
	if dry != nil {
		// bwrap becomes what the dry run's layer stage executes.
		if ln.argv, err = dry.wrap(exe, ln.argv); err != nil {
			return ln, err
		}
	}
	return ln, nil
}

// viaBwrap sets up a run inside bwrap: the shim's rules mirror the
// mounts, each grant is opened now and bound by descriptor, and the
// masks' placeholders are locked and prepared.
func (ln *launch) viaBwrap(spec *shim.Spec, c Caps, l layout, exe, dir string, lim Limits) error {
	// A new user namespace counts its own processes, so the limit is
	// exact there.
	if ln.cg == nil || !ln.cg.pids {
		spec.Rlimits["nproc"] = uint64(lim.MaxProcs)
	}
	spec.Rules = landlockRules(l, true, "")
	// Without a PID namespace of its own, nothing ends the tree with
	// bwrap: the supervisor does.
	spec.Supervise = l.SharePID || l.HostPIDs
	locks, err := placeholderLocks(l.Policy, ln.lockDir)
	if err != nil {
		return err
	}
	ln.undo = append(ln.undo, func() { releasePlaceholders(locks, ln.log) })
	// Each grant is opened now, without following any symbolic link,
	// and bwrap binds the descriptor: a path swapped for a link since
	// the Policy was made cannot redirect the bind.
	grantFDs, grantFiles, err := openGrants(l.Policy, &ln.fds)
	if err != nil {
		return err
	}
	ln.undo = append(ln.undo, func() { closeFiles(grantFiles) })
	bargs, phs, err := bwrapArgs(l, exe, dir, grantFDs)
	if err != nil {
		return err
	}
	if ln.dry != nil {
		// Placeholders and the folders above them go into the layers:
		// nothing is made on the host, so nothing is recorded.
		if err := ln.dry.bind(l.Policy, grantFDs, phs); err != nil {
			return err
		}
	} else {
		recordPlaceholders(locks, phs)
		// bwrap resolves every bind source before it mounts anything, so the
		// directories above a placeholder, which it binds onto themselves,
		// must exist beforehand.
		for _, ph := range phs {
			if err := os.MkdirAll(filepath.Dir(ph.Path), 0o755); err != nil {
				return fmt.Errorf("sandbox: placeholder for %s: %w", ph.Path, err)
			}
		}
	}
	// bwrap names its child on the info descriptor: the process this
	// one reaps when bwrap's outer process is gone (reapOrphan).
	if ln.infoR, ln.infoW, err = os.Pipe(); err != nil {
		return fmt.Errorf("sandbox: bwrap's info pipe: %w", err)
	}
	ln.undo = append(ln.undo, func() { ln.infoR.Close(); ln.infoW.Close() })
	ln.argv = append([]string{c.Bwrap, "--info-fd", strconv.Itoa(ln.fds.add(ln.infoW))}, bargs...)
	return nil
}

// alone sets up a run of the shim without bwrap: a private temporary
// directory, rules that split around every mask, and a supervising
// shim that kills the tree.
func (ln *launch) alone(spec *shim.Spec, l layout, exe, dir string, lim Limits) error {
	// Without a user namespace RLIMIT_NPROC counts every process of this
	// uid, so the limit is what already runs plus MaxProcs.
	if ln.cg == nil || !ln.cg.pids {
		spec.Rlimits["nproc"] = uint64(countTasks(os.Getuid()) + lim.MaxProcs)
	}
	removeStaleTemps()
	tmp, err := os.MkdirTemp("", fmt.Sprintf("metnos-run-%d-", os.Getpid()))
	if err != nil {
		return fmt.Errorf("sandbox: private temporary directory: %w", err)
	}
	ln.undo = append(ln.undo, func() { os.RemoveAll(tmp) })
	ln.env = setEnv(ln.env, "TMPDIR", tmp)
	spec.Rules = landlockRules(l, false, tmp)
	spec.Supervise = true
	spec.Dir = dir
	ln.argv = []string{exe}
	return nil
}

// proxyPortOf is the egress proxy's port for a run of p, 0 for none.
func proxyPortOf(p policy.Policy) int {
	if egressOf(p) == nil {
		return 0
	}
	return ProxyPort
}

// startProxy sets up the run's egress proxy: a socket pair whose child
// end the shim gets (spec.ProxyFD) to hand back the listener it makes
// in the run's network namespace, a goroutine that serves it, and the
// proxy variables in the command's environment.
func (ln *launch) startProxy(req Request, spec *shim.Spec, e policy.Egress) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sandbox: the egress proxy's socket pair: %w", err)
	}
	parent := os.NewFile(uintptr(fds[0]), "egress-parent")
	ln.proxyChild = os.NewFile(uintptr(fds[1]), "egress-child")
	spec.ProxyFD = ln.fds.add(ln.proxyChild)
	addr := hostPort("127.0.0.1", ProxyPort)
	rp := newRunProxy(e, req.Options, addr, true)
	ln.proxy = rp
	ln.env = proxyEnv(ln.env, addr)
	got := make(chan bool, 1)
	go func() {
		l, err := receiveListener(parent)
		got <- err == nil
		if err != nil {
			close(rp.done)
			if !errors.Is(err, io.EOF) {
				ln.log.Warn("sandbox: the egress proxy got no listener", "err", err)
			}
			return
		}
		rp.serve(l)
	}()
	ln.undo = append(ln.undo, func() {
		// Wakes the receive if the shim never sent (it failed first).
		unix.Shutdown(int(parent.Fd()), unix.SHUT_RDWR)
		<-got
		rp.stop()
		parent.Close()
		ln.proxyChild.Close()
	})
	return nil
}

// receiveListener reads the listener the shim sends on c.
func receiveListener(c *os.File) (net.Listener, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(int(c.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	switch {
	case err != nil:
		return nil, fmt.Errorf("receiving the egress listener: %w", err)
	case n == 0 && oobn == 0:
		return nil, io.EOF
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("receiving the egress listener: no descriptor in the message (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("receiving the egress listener: want one descriptor, got %d (%v)", len(fds), err)
	}
	f := os.NewFile(uintptr(fds[0]), "egress-listener")
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("the egress listener: %w", err)
	}
	return l, nil
}

// executed is how the launched process ended.
type executed struct {
	stdout, stderr *capped
	statuses       []shim.Status
	state          *os.ProcessState
	werr, ctxErr   error
	timedOut       bool
	wall           time.Duration
	// started, ready and ended are when the launch started, when the
	// shim's ready line came (zero: none) and when it ended.
	started, ready, ended time.Time
	// clock is the shim's clock from its ready line (nil: none).
	clock *shim.Clock
	// autogroupAt is when this process saw the run's autogroup at its
	// nice value after the shim was refused it (zero: never).
	autogroupAt time.Time
}

// timing is ex's stages, with prepare before them; Finish runs to now.
func (ex executed) timing(prepare time.Duration) *Timing {
	t := &Timing{Prepare: prepare, Finish: time.Since(ex.ended)}
	if ex.ready.IsZero() || ex.ready.After(ex.ended) {
		t.Command = ex.ended.Sub(ex.started)
		return t
	}
	t.Setup, t.Command = ex.ready.Sub(ex.started), ex.ended.Sub(ex.ready)
	t.Bwrap, t.Shim, t.Landlock, t.Seccomp = setupSteps(ex.started, ex.clock)
	return t
}

// setupSteps splits a run's set-up, from started (this process's wall
// clock when it started the launch) by the shim's clock c. A step whose
// instants are out of order, as when the wall clock was set meanwhile,
// is left zero rather than reported wrong.
func setupSteps(started time.Time, c *shim.Clock) (bwrap, shimWork, landlock, seccomp time.Duration) {
	if c == nil || c.Main == 0 || c.Done == 0 {
		return
	}
	step := func(from, to int64) time.Duration {
		if from == 0 || to < from {
			return 0
		}
		return time.Duration(to - from)
	}
	// Each step runs to the next one the shim took.
	next := func(ts ...int64) int64 {
		for _, t := range ts {
			if t != 0 {
				return t
			}
		}
		return 0
	}
	bwrap = step(started.UnixNano(), c.Main)
	shimWork = step(c.Main, next(c.Landlock, c.Seccomp, c.Done))
	landlock = step(c.Landlock, next(c.Seccomp, c.Done))
	seccomp = step(c.Seccomp, c.Done)
	return
}

// execute starts the launch and waits for it until it exits, the
// deadline passes or ctx is done; then it kills the whole tree.
func (ln *launch) execute(ctx context.Context, stdin io.Reader, lim Limits) (executed, error) {
	ex := executed{stdout: &capped{limit: lim.OutputBytes}, stderr: &capped{limit: lim.OutputBytes}}
	cmd := &exec.Cmd{Path: ln.argv[0], Args: ln.argv, Env: []string{}, Dir: "/"}
	// A pipe goes to the command as its descriptor 0 (os/exec copies
	// nothing); nil is /dev/null; see stdinFor.
	cmd.Stdin = stdinFor(stdin)
	cmd.Stdout, cmd.Stderr = ex.stdout, ex.stderr
	cmd.ExtraFiles = ln.fds.files
	cmd.WaitDelay = 2 * time.Second
	sig := syscall.SIGKILL
	if ln.supervise {
		sig = syscall.SIGTERM
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: sig}
	if ln.dry != nil {
		ln.dry.namespaces(cmd.SysProcAttr)
	}

	start := time.Now()
	ex.started = start
	err := cmd.Start()
	ln.statusW.Close()
	if ln.proxyChild != nil {
		ln.proxyChild.Close()
	}
	var childc chan bwrapChild
	var child bwrapChild
	known := make(chan struct{})
	if ln.infoW != nil {
		ln.infoW.Close()
		childc = make(chan bwrapChild, 1)
		go func() {
			c := readChild(ln.infoR)
			child = c
			close(known)
			childc <- c
		}()
	}
	if err != nil {
		return ex, fmt.Errorf("sandbox: starting %s: %w", ln.argv[0], err)
	}
	// Whichever way the run ends, what bwrap left is reaped before it
	// is reported ended.
	defer ln.reapOrphan(childc)
	statusc := make(chan []shim.Status, 1)
	readyc := make(chan time.Time, 1)
	// The run's autogroup, where the shim could not set its nice value
	// yet, is set from here: bwrap's child is in the command's session.
	var agWait sync.WaitGroup
	agStop := make(chan struct{})
	onReady := func(s shim.Status) {
		if !ln.keepAutogroup || childc == nil || s.Prio == nil || !s.Prio.AutogroupDeferred {
			return
		}
		agWait.Go(func() {
			select {
			case <-known:
			case <-agStop:
				return
			}
			if child.pid <= 0 {
				return
			}
			alive := func() bool { _, start := procStat(child.pid); return start == child.start }
			ex.autogroupAt = shim.KeepAutogroup(child.pid, ln.autogroup, ownSchedGroup().autogroup, agStop, alive)
		})
	}
	go func() { statusc <- readStatus(ln.statusR, readyc, onReady) }()
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()

	timer := time.NewTimer(lim.Timeout)
	defer timer.Stop()
	var ok bool
	select {
	case ex.werr = <-waitc:
	case <-timer.C:
		// After a pause of this process (SIGSTOP, a VM pause) the
		// deadline and the command's own end come due together: a
		// command that has already exited ended by itself.
		if ok, ex.werr = exitedBy(cmd, waitc); !ok {
			ex.timedOut = true
			ex.werr = killTree(cmd, ln.supervise, waitc)
		}
	case <-ctx.Done():
		if ok, ex.werr = exitedBy(cmd, waitc); !ok {
			ex.ctxErr = ctx.Err()
			ex.werr = killTree(cmd, ln.supervise, waitc)
		}
	}
	ex.ended = time.Now()
	ex.wall = ex.ended.Sub(start)
	ex.statuses = <-statusc
	close(agStop)
	agWait.Wait()
	select {
	case ex.ready = <-readyc:
	default:
	}
	for _, s := range ex.statuses {
		if s.Ready {
			ex.clock = s.Clock
		}
	}
	ex.state = cmd.ProcessState
	return ex, nil
}

// outcome reads how the run went into out: the layers the shim reported
// applying, the exit status, the kills. The bool reports that bwrap
// failed before the shim started the command.
func outcome(out Output, pl Plan, ln *launch, ex executed, name string) (Output, bool, error) {
	out.Wall = ex.wall
	out.TimedOut = ex.timedOut
	out.Stdout, out.StdoutTruncated = ex.stdout.buf, ex.stdout.dropped
	out.Stderr, out.StderrTruncated = ex.stderr.buf, ex.stderr.dropped

	var ready, final *shim.Status
	var execFailed string
	for i := range ex.statuses {
		switch s := &ex.statuses[i]; {
		case s.Ready:
			ready = s
		case s.Exited:
			final = s
		case s.Error != "" && ready == nil && s.Layer:
			// A dry run's layer stage failed: bwrap never started.
			return out, false, &RefusedError{Have: pl.Sandbox, DryRun: true,
				Why: "a dry run's copy-on-write layer could not be made here, and the run is refused rather than run for real: " + s.Error}
		case s.Error != "" && ready == nil:
			return out, false, fmt.Errorf("sandbox: could not start %s: %s", name, s.Error)
		case s.Error != "":
			// Everything was in place, and execve itself failed.
			execFailed = s.Error
		}
	}
	if ready == nil {
		if out.TimedOut || ex.ctxErr != nil {
			return out, false, ex.ctxErr
		}
		if ln.cg.oomKilled() {
			// The shim joins the run's cgroup first thing: a limit too
			// small for anything to start kills it there.
			out.OOMKilled, out.ExitCode, out.Signal = true, -1, "SIGKILL"
			return out, false, nil
		}
		return out, ln.bwrap, fmt.Errorf("sandbox: the sandbox for %s failed before the command started: %s", name, firstLine(ex.stderr.buf, ex.werr))
	}
	out.Sandbox = layers{bwrap: ln.bwrap, landlock: ready.Landlock, seccomp: ready.Seccomp}.word()
	// pl.Reason is empty unless the plan was weaker than every layer or
	// the run shares the host's PID namespace.
	out.Reason = pl.Reason
	if want := pl.lay.word(); out.Sandbox != want {
		out.Reason = joinReason(out.Reason, fmt.Sprintf("the shim applied %q where %q was planned", out.Sandbox, want))
	}
	if execFailed != "" && !out.TimedOut && ex.ctxErr == nil {
		return out, false, fmt.Errorf("sandbox: could not start %s: %s", name, execFailed)
	}
	switch {
	case final != nil:
		out.ExitCode, out.Signal = final.ExitCode, final.Signal
	default:
		out.ExitCode, out.Signal = exitStatus(ex.state, ln.bwrap)
	}
	if out.TimedOut {
		out.ExitCode, out.Signal = -1, "SIGKILL"
	}
	// The cgroup's OOM counter counts every task of the run: a child the
	// limit killed while the main process went on to end by itself is
	// the command's own business (its exit status and output stand).
	// Only the main process dying of SIGKILL makes the run a memory
	// failure.
	out.OOMKilled = !out.TimedOut && out.Signal == "SIGKILL" && ln.cg.oomKilled()
	out.Priority = ln.priorityReport(ready, final, ex)
	// RLIMIT_CPU sends SIGXCPU, which nothing else sends a sandboxed
	// command: the CPU-time limit ended it.
	out.CPUTimeExceeded = !out.TimedOut && out.Signal == "SIGXCPU"
	return out, false, ex.ctxErr
}

// subreaper is whether this process is a child subreaper (it becomes
// one at its first run): then a process a run's bwrap leaves behind is
// reparented to it, and reaped by reapOrphan.
var subreaper = sync.OnceValue(func() bool {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == nil
})

// bwrapChild is bwrap's child: its pid, and its start time, which
// tells it from a later process given the same pid.
type bwrapChild struct {
	pid   int
	start string
}

// readChild reads the pid of bwrap's child from its --info-fd, and its
// start time while it is alive (zero when bwrap named none: it failed
// first).
func readChild(r *os.File) bwrapChild {
	var info struct {
		ChildPID int `json:"child-pid"`
	}
	if json.NewDecoder(r).Decode(&info) != nil || info.ChildPID <= 0 {
		return bwrapChild{}
	}
	_, start := procStat(info.ChildPID)
	return bwrapChild{pid: info.ChildPID, start: start}
}

// procStat reads a process's parent pid and start time from
// /proc/<pid>/stat (0 and "" when it is gone).
func procStat(pid int) (int, string) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, ""
	}
	// pid (comm) state ppid ... starttime (field 22); comm may hold
	// spaces and parentheses.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return 0, ""
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid, f[19]
}

// reapOrphan reaps bwrap's child, the sandbox's pid 1. bwrap's outer
// process exits as soon as the command's status is known, before that
// child, which the kernel then reparents to this process (a subreaper):
// left alone it would be a zombie per run. It is waited for (a moment),
// killed if it is still there (which ends what is left of the run's
// PID namespace), then reaped. Only that pid is waited for: the other
// children of this process are their own callers' to wait for.
func (ln *launch) reapOrphan(childc chan bwrapChild) {
	if childc == nil || !subreaper() {
		return
	}
	var child bwrapChild
	select {
	case child = <-childc:
	case <-time.After(time.Second):
		// bwrap named no child, and something still holds its info pipe.
		// bwrap was killed while setting the run up: its child, if it
		// made one, waits for it forever.
		ln.log.Warn("sandbox: bubblewrap did not name its child; looking for one it left half set up")
		SweepOrphans(ln.log)
		return
	}
	pid := child.pid
	if ppid, start := procStat(pid); pid <= 0 || ppid != os.Getpid() || start != child.start {
		// Not reparented here: bwrap waited for it, or it went to
		// another subreaper; the pid may be another process's by now.
		return
	}
	wait := time.Now().Add(2 * time.Second)
	killed := false
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG|unix.WALL, nil)
		if got == pid || err != nil {
			// Reaped, or not this process's child (ECHILD).
			return
		}
		if time.Now().After(wait) {
			if killed {
				ln.log.Warn("sandbox: bubblewrap's child did not end after SIGKILL; it is reaped when it does", "pid", pid)
				go unix.Wait4(pid, &ws, unix.WALL, nil)
				return
			}
			_ = unix.Kill(pid, unix.SIGKILL)
			killed, wait = true, time.Now().Add(5*time.Second)
		}
		time.Sleep(time.Millisecond)
	}
}

// exitedBy reports whether cmd's process has already exited by itself
// (it is a zombie, or Wait has reaped it), and if so waits for Wait's
// result; it reaps nothing itself.
func exitedBy(cmd *exec.Cmd, waitc chan error) (bool, error) {
	select {
	case err := <-waitc:
		return true, err
	default:
	}
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	// ECHILD: Wait reaped it meanwhile.
	if (err == nil && info.Signo != 0) || errors.Is(err, unix.ECHILD) {
		return true, <-waitc
	}
	return false, nil
}

// killTree ends the run's whole process tree: inside bwrap's PID
// namespace killing bwrap is enough; a supervisor is asked first (it
// kills its descendants), then the group is killed.
func killTree(cmd *exec.Cmd, supervised bool, waitc chan error) error {
	pid := cmd.Process.Pid
	if supervised {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		select {
		case err := <-waitc:
			return err
		case <-time.After(3 * time.Second):
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	return <-waitc
}

// readStatus reads the shim's status lines until the pipe closes, and
// sends on ready (buffered) when the line that says it is ready came,
// which it also passes to onReady (nil: none).
func readStatus(r *os.File, ready chan<- time.Time, onReady func(shim.Status)) []shim.Status {
	var out []shim.Status
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var s shim.Status
		if json.Unmarshal(sc.Bytes(), &s) == nil {
			if s.Ready && len(ready) == 0 {
				ready <- time.Now()
				if onReady != nil {
					onReady(s)
				}
			}
			out = append(out, s)
		}
	}
	return out
}

func firstLine(b []byte, err error) string {
	s := strings.TrimSpace(string(b))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if s == "" && err != nil {
		s = err.Error()
	}
	return s
}

// shimExecutable finds the shim: Options.Shim (given), else this
// executable itself, which must call shim.MainIfShim first thing in
// main.
func shimExecutable(given string) (string, error) {
	if given != "" {
		return given, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("sandbox: locating the shim: %w", err)
	}
	return self, nil
}

// countTasks counts the tasks (threads included, as RLIMIT_NPROC does)
// whose real uid is uid.
func countTasks(uid int) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	want := strconv.Itoa(uid)
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		var mine bool
		threads := 1
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 {
				switch f[0] {
				case "Uid:":
					mine = f[1] == want
				case "Threads:":
					threads, _ = strconv.Atoi(f[1])
				}
			}
		}
		if mine {
			n += threads
		}
	}
	return n
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// placeholderLocks takes, shared, one lock per masked path visible in
// p's bwrap view, before the run looks at the host to plan its masks,
// and holds them until bwrap is gone. The locks are files named after
// each path, shared by every run of this user in any process: a
// placeholder that one run created must not vanish while another run,
// having seen it, is about to mount over it. A run that creates
// placeholders records them in their lock files; whichever run is last
// out (it can take a lock exclusively) removes them, when still empty.
func placeholderLocks(p policy.Policy, lockDir string) (map[string]*os.File, error) {
	binds := viewBinds(p)
	var paths []string
	for i, m := range p.Masks {
		if coveredByEarlier(p.Masks[:i], m.Path) {
			continue
		}
		if vis, _ := lookupView(binds, m.Path); vis {
			paths = append(paths, m.Path)
		}
	}
	if len(paths) == 0 {
		return nil, nil
	}
	dir, err := placeholderLockDir(lockDir)
	if err != nil {
		return nil, err
	}
	locks := map[string]*os.File{}
	for _, path := range paths {
		sum := sha256.Sum256([]byte(path))
		name := filepath.Join(dir, hex.EncodeToString(sum[:12])+".lock")
		f, err := lockShared(name)
		if err != nil {
			closeLocks(locks)
			return nil, fmt.Errorf("sandbox: placeholder lock for %s: %w", path, err)
		}
		locks[path] = f
	}
	return locks, nil
}

// recordPlaceholders notes in each placeholder's lock file the path
// components bwrap is about to create, so that whichever run is last out
// can remove them.
func recordPlaceholders(locks map[string]*os.File, phs []placeholder) {
	for _, ph := range phs {
		if f := locks[ph.Path]; f != nil {
			b, _ := json.Marshal(ph.Created)
			_, _ = f.WriteAt(b, 0)
		}
	}
}

func closeLocks(locks map[string]*os.File) {
	for _, f := range locks {
		f.Close()
	}
}

// releasePlaceholders removes the recorded placeholders whose lock no
// other run holds (when they are still empty), then releases every lock.
// What it must leave in place it says to log.
func releasePlaceholders(locks map[string]*os.File, log *slog.Logger) {
	defer closeLocks(locks)
	for mask, f := range locks {
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			continue
		}
		b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<16))
		if err != nil || len(b) == 0 {
			// No run made a placeholder: the path exists on the host
			// (/etc/shadow, say). The lock file stays, empty, for the
			// next run: creating and unlinking one per mask and run
			// cost more than the rest of the locking.
			continue
		}
		// Last one out: once its placeholders are gone the lock file
		// goes too (lockShared retries a lock on an unlinked file).
		defer os.Remove(f.Name())
		var created []string
		if json.Unmarshal(b, &created) != nil {
			continue
		}
		for i := len(created) - 1; i >= 0; i-- {
			p := created[i]
			if !within(mask, p) {
				// Only the mask's own path and its parents are ever
				// recorded; anything else is not ours to remove.
				break
			}
			if fi, err := os.Lstat(p); err == nil && !fi.IsDir() && fi.Size() != 0 {
				break
			}
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				log.Debug("sandbox: placeholder left in place", "path", p, "err", err)
				break
			}
		}
		_ = f.Truncate(0)
	}
}

// lockShared opens and locks name shared. The last run out unlinks the
// lock file (see releasePlaceholders), so a lock taken on a file that was
// unlinked meanwhile is retried on the new one.
func lockShared(name string) (*os.File, error) {
	for {
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
			f.Close()
			return nil, err
		}
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Lstat(name, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return f, nil
		}
		f.Close()
	}
}

var staleTempsOnce sync.Once

// removeStaleTemps removes, once per process, the private temporary
// directories of landlock-only runs whose agent was killed mid-run
// (named metnos-run-<pid>-*, for a pid that no longer exists).
func removeStaleTemps() {
	staleTempsOnce.Do(func() {
		matches, _ := filepath.Glob(filepath.Join(os.TempDir(), "metnos-run-*-*"))
		for _, m := range matches {
			rest := strings.TrimPrefix(filepath.Base(m), "metnos-run-")
			pidText, _, _ := strings.Cut(rest, "-")
			pid, err := strconv.Atoi(pidText)
			if err != nil || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
				continue
			}
			if fi, err := os.Lstat(m); err == nil && fi.IsDir() && writableByMode(fi) {
				_ = os.RemoveAll(m)
			}
		}
	})
}

// openGrants opens every grant of p with O_PATH and RESOLVE_NO_SYMLINKS
// (the paths are canonical, so a symbolic link anywhere in one means it
// changed since the Policy was made), adds them to the child's
// descriptors t and returns the descriptor each has there, by grant
// path. Where openat2 is missing (Linux < 5.6) it returns nothing and
// bwrap binds by path.
func openGrants(p policy.Policy, t *fdTable) (map[string]int, []*os.File, error) {
	var files []*os.File
	for _, g := range p.Grants {
		fd, err := unix.Openat2(unix.AT_FDCWD, g.Path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
		if errors.Is(err, unix.ENOSYS) {
			closeFiles(files)
			return nil, nil, nil
		}
		if err != nil {
			closeFiles(files)
			return nil, nil, fmt.Errorf("sandbox: grant %s changed since the policy was made (it is now a symbolic link or gone): %w", g.Path, err)
		}
		files = append(files, os.NewFile(uintptr(fd), g.Path))
	}
	fds := map[string]int{}
	for _, f := range files {
		fds[f.Name()] = t.add(f)
	}
	return fds, files, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// placeholderLockDir is where the placeholder locks live: dir
// (Options.LockDir), the caller's one folder per uid, whatever HOME
// says, since every run of this uid must see the same locks; else a
// private directory of this uid in the temporary folder. It must be a
// private directory of this user. No sandboxed command sees it: the
// caller puts it in a masked folder (the session's runtime folder) or
// in the host's /tmp, which every bwrap view replaces.
func placeholderLockDir(dir string) (string, error) {
	if dir == "" {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("sandbox-placeholders-%d", os.Getuid()))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("sandbox: placeholder locks: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("sandbox: placeholder locks: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("sandbox: placeholder locks: %s is not a private directory of this user (%v); remove it", dir, fi.Mode())
	}
	return dir, nil
}

// envMemfd returns a sealed memfd holding env, NUL-separated.
func envMemfd(env []string) (*os.File, error) {
	fd, err := unix.MemfdCreate("metnos-env", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("sandbox: memfd for the environment: %w", err)
	}
	f := os.NewFile(uintptr(fd), "metnos-env")
	if _, err := f.WriteString(strings.Join(env, "\x00")); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: writing the environment: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: sealing the environment: %w", err)
	}
	return f, nil
}

// networkNote says how a run of p planned as pl holds its network.
func networkNote(c Caps, p policy.Policy, pl Plan) string {
	use := pl.lay
	var by []string
	tcp := use.landlock && c.LandlockABI >= 4
	switch {
	case p.Network:
		return "open: the host's network"
	case egressOf(p) != nil:
		by = append(by, "its own empty network namespace, where the agent's proxy listens on "+hostPort("127.0.0.1", ProxyPort))
		if tcp {
			by = append(by, "Landlock lets it connect to that port alone and bind none")
		}
		if use.seccomp {
			by = append(by, "seccomp allows TCP sockets only")
		}
		return "narrowed to the hosts the manifest names, through the run's egress proxy: " + strings.Join(by, "; ")
	case p.HostNetView:
		by = append(by, "the host's network namespace, read-only")
	case use.bwrap:
		by = append(by, "an empty network namespace")
	}
	if tcp {
		by = append(by, "Landlock TCP rules (no connect, no bind)")
	}
	if use.seccomp {
		by = append(by, "seccomp (no internet or packet socket)")
	}
	return "cut: " + strings.Join(by, "; ")
}
