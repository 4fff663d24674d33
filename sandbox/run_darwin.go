//go:build darwin

package sandbox

// The macOS backend: the command runs under /usr/bin/sandbox-exec with
// the SBPL profile that seatbeltProfile (sbpl.go) generates from the
// Policy, every path passed as a -D parameter.
//
// NOTHING HERE HAS BEEN RUN. This project has no macOS machine: this file
// is built (GOOS=darwin, amd64 and arm64) and vetted, and the profile and
// the plan are golden- and unit-tested on Linux, but no sandbox-exec has
// ever parsed the profile or run a command through it. Before macOS is
// called supported, the hostile tests (test/hostile) must pass on a Mac.

import (
	"bytes"
	"context"
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
)

// sandboxExec is the only sandbox-exec the backend uses; one found on
// PATH could be anyone's.
const sandboxExec = "/usr/bin/sandbox-exec"

// Probe reports what this machine offers with o. Caps has no macOS
// fields yet: [PlanFor] says whether sandbox-exec is there.
func Probe(o Options) Caps {
	return Caps{OS: runtime.GOOS, Disabled: o.Disabled}
}

// planFor is the macOS planner: seatbelt when /usr/bin/sandbox-exec
// exists and c does not say the sandbox is disabled (see seatbeltPlan).
func planFor(c Caps, p policy.Policy, min policy.Level) Plan {
	_, err := os.Stat(sandboxExec)
	s, b, r, ref := seatbeltPlan(err == nil, c.Disabled, p, min)
	return Plan{Sandbox: s, Best: b, Reason: r, Refused: ref}
}

// run runs req under sandbox-exec (see the file comment: untested on a
// Mac). The command gets exactly req.Env, with TMPDIR set to a private
// folder made for the run and removed afterwards; it starts in req.Dir
// ("/" when empty) in a process group of its own, which the deadline
// kills, as it kills whatever the command leaves behind when it exits.
func run(ctx context.Context, req Request) (Output, error) {
	p := req.Policy
	pl := planFor(Probe(req.Options), p, req.MinSandbox)
	out := Output{Policy: p.Fingerprint(), Sandbox: "none", LimitsBy: "rlimit"}
	if pl.Refused != "" {
		return out, &RefusedError{Have: pl.Sandbox, Why: pl.Refused}
	}
	// The agent's own binary runs outside the sandbox next time: no grant
	// may reach it.
	if self, err := os.Executable(); err == nil {
		p.Masks = append(append([]policy.Mask(nil), p.Masks...), policy.Mask{Path: self, Kind: policy.MaskFile, Why: "the agent's binary"})
		if r, err := filepath.EvalSymlinks(self); err == nil && r != self {
			p.Masks = append(p.Masks, policy.Mask{Path: r, Kind: policy.MaskFile, Why: "the agent's binary"})
		}
		p.Normalize()
	}
	scratch, err := os.MkdirTemp("", fmt.Sprintf("metnos-run-%d-", os.Getpid()))
	if err != nil {
		return out, fmt.Errorf("sandbox: private temporary directory: %w", err)
	}
	defer os.RemoveAll(scratch)
	// Seatbelt matches resolved paths (/private/var/folders/..., not
	// /var/folders/...).
	if scratch, err = filepath.EvalSymlinks(scratch); err != nil {
		return out, fmt.Errorf("sandbox: private temporary directory: %w", err)
	}
	env := setEnv(req.Env, "TMPDIR", scratch)
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}

	var argv []string
	seatbelt := pl.Sandbox == seatbeltWord
	proxyPort := 0
	var rp *runProxy
	if e := egressOf(p); e != nil {
		// The proxy listens on the host's loopback; the profile lets
		// the command reach that port alone, on every loopback address
		// ("localhost:PORT"), so the proxy holds it on ::1 too.
		l, l6, err := loopbackPair()
		if err != nil {
			return out, err
		}
		proxyPort = l.Addr().(*net.TCPAddr).Port
		rp = newRunProxy(*e, req.Options, l.Addr().String(), seatbelt)
		go rp.serve(l)
		if l6 != nil {
			go rp.p.Serve(l6)
		}
		defer rp.stop()
		env = proxyEnv(env, rp.addr)
	}
	if seatbelt {
		prof, params, err := seatbeltProfile(seatbeltInput{Policy: p, Scratch: scratch, ProxyPort: proxyPort})
		if err != nil {
			return out, err
		}
		argv = append([]string{sandboxExec, "-p", prof}, params...)
		argv = append(argv, "--")
		argv = append(argv, req.Argv...)
	} else {
		path, err := darwinLookPath(req.Argv[0], env)
		if err != nil {
			return out, err
		}
		argv = append([]string{path}, req.Argv[1:]...)
	}

	lim := req.Limits
	// The run's priority: nice and taskpolicy execute the next program
	// with theirs (sandbox-exec, then the command), and RLIMIT_CPU goes
	// with the other rlimits.
	pp := priorityPlan(req.Options.Priority, lim.Timeout, runtime.NumCPU())
	argv, prio := pp.darwinArgv(argv, func(p string) bool { fi, err := os.Stat(p); return err == nil && fi.Mode().IsRegular() })
	cpuTime := pp.cpuTime
	if cpuTime > 0 && !cpuLimitSafe(cpuTime) {
		prio.missing("RLIMIT_CPU %s: the agent has used nearly that much processor time itself, and lowering its own limit to pass it on would end the agent", seconds(cpuTime))
		cpuTime = 0
	}
	stdout := &capped{limit: lim.OutputBytes}
	stderr := &capped{limit: lim.OutputBytes}
	outR, outW, err := os.Pipe()
	if err != nil {
		return out, fmt.Errorf("sandbox: stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return out, fmt.Errorf("sandbox: stderr pipe: %w", err)
	}
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Env: env, Dir: dir}
	cmd.Stdin = stdinFor(req.Stdin)
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.WaitDelay = 2 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	start := time.Now()
	err = startWithRlimits(cmd, lim, cpuTime)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return out, fmt.Errorf("sandbox: starting %s: %w", argv[0], err)
	}
	if seatbelt {
		out.Sandbox = seatbeltWord
	}
	out.Reason = pl.Reason
	if cpuTime > 0 {
		prio.CPUTime = cpuTime
		prio.applied("RLIMIT_CPU %s per process (soft: SIGXCPU)", seconds(cpuTime))
	}
	out.Priority = prio
	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); _, _ = io.Copy(stdout, outR) }()
	go func() { defer copies.Done(); _, _ = io.Copy(stderr, errR) }()
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()

	pgid := cmd.Process.Pid
	timer := time.NewTimer(lim.Timeout)
	defer timer.Stop()
	var ctxErr error
	select {
	case <-waitc:
	case <-timer.C:
		out.TimedOut = true
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-waitc
	case <-ctx.Done():
		ctxErr = ctx.Err()
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-waitc
	}
	// Whatever the command left running in its group dies with it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	out.Wall = time.Since(start)
	if rp != nil {
		out.Network = rp.stop()
	}
	// A process that left the group may still hold the pipes: read what
	// comes for a moment, then stop.
	done := make(chan struct{})
	go func() { copies.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		outR.Close()
		errR.Close()
		<-done
	}
	outR.Close()
	errR.Close()
	out.Stdout, out.StdoutTruncated = stdout.buf, stdout.dropped
	out.Stderr, out.StderrTruncated = stderr.buf, stderr.dropped

	out.ExitCode, out.Signal = exitStatus(cmd.ProcessState, false)
	out.CPUTimeExceeded = !out.TimedOut && ctxErr == nil && out.Signal == "SIGXCPU"
	if out.TimedOut {
		out.ExitCode, out.Signal = -1, "SIGKILL"
		return out, ctxErr
	}
	// sandbox-exec reports its own failures (a profile it will not
	// compile, a command it cannot exec) on stderr, prefixed with its name,
	// and exits non-zero: the command never ran.
	if seatbelt && ctxErr == nil && out.ExitCode > 0 && bytes.HasPrefix(out.Stderr, []byte("sandbox-exec:")) {
		line, _, _ := strings.Cut(string(out.Stderr), "\n")
		return out, fmt.Errorf("sandbox: could not start %s under sandbox-exec: %s", req.Argv[0], strings.TrimSpace(line))
	}
	return out, ctxErr
}

// cpuLimitSafe reports whether this process may lower its own
// RLIMIT_CPU to limit for the moment of a fork (startWithRlimits): only
// when it has used well below that much processor time itself, or the
// kernel would send it SIGXCPU.
func cpuLimitSafe(limit time.Duration) bool {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return false
	}
	used := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return used+10*time.Second < limit
}

// rlimitMu serializes the moments when this process lowers its own
// rlimits so that the command inherits them.
var rlimitMu sync.Mutex

// startWithRlimits starts cmd with the run's rlimits: Go cannot set them
// for a child alone on macOS, so this process lowers its own soft limits
// for the fork and restores them at once. RLIMIT_NPROC counts every
// process of the user, so its limit is what already runs plus MaxProcs.
// Memory is not limited: macOS does not enforce RLIMIT_AS. cpuTime is
// RLIMIT_CPU's soft limit (0: none): SIGXCPU past it.
func startWithRlimits(cmd *exec.Cmd, lim Limits, cpuTime time.Duration) error {
	ps, err := unix.SysctlKinfoProcSlice("kern.proc.uid", os.Getuid())
	if err != nil {
		// Guessing would set a limit below what already runs, and every
		// run would fail: refuse instead.
		return fmt.Errorf("sandbox: counting this user's processes for RLIMIT_NPROC: %w", err)
	}
	procs := len(ps)
	set := []struct {
		res int
		val uint64
	}{
		{unix.RLIMIT_FSIZE, uint64(lim.FileBytes)},
		{unix.RLIMIT_CORE, 0},
		{unix.RLIMIT_NPROC, uint64(procs + lim.MaxProcs)},
	}
	if cpuTime > 0 {
		set = append(set, struct {
			res int
			val uint64
		}{unix.RLIMIT_CPU, uint64(cpuTime / time.Second)})
	}
	rlimitMu.Lock()
	defer rlimitMu.Unlock()
	for _, s := range set {
		var old unix.Rlimit
		if err := unix.Getrlimit(s.res, &old); err != nil {
			return fmt.Errorf("sandbox: reading rlimit %d: %w", s.res, err)
		}
		n := old
		n.Cur = min(s.val, old.Max)
		if err := unix.Setrlimit(s.res, &n); err != nil {
			return fmt.Errorf("sandbox: setting rlimit %d: %w", s.res, err)
		}
		defer func() { _ = unix.Setrlimit(s.res, &old) }()
	}
	return cmd.Start()
}

// darwinLookPath finds name on the PATH of env (or the default system
// PATH) when it has no slash; only for a run without sandbox-exec, which
// does the lookup itself otherwise.
func darwinLookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/bin:/bin:/usr/sbin:/sbin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if !filepath.IsAbs(d) {
			continue
		}
		f := filepath.Join(d, name)
		if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", fmt.Errorf("sandbox: %s: %w", name, exec.ErrNotFound)
}

// networkNote says how a run of p planned as pl holds its network.
func networkNote(_ Caps, p policy.Policy, pl Plan) string {
	switch {
	case p.Network:
		return "open: the host's network"
	case egressOf(p) != nil:
		return "narrowed to the hosts the manifest names, through the run's egress proxy: the seatbelt profile allows the proxy's loopback port alone"
	}
	return "cut: the seatbelt profile denies every IP socket"
}

// SweepOrphans kills what half-set-up sandboxes of this user were left
// behind by an agent that died starting them; there are none here (no
// bubblewrap).
func SweepOrphans(*slog.Logger) int { return 0 }

// loopbackPair listens on 127.0.0.1 and [::1] at one port, so that
// nothing else holds that port on a loopback address; l6 is nil where
// the machine has no IPv6 loopback.
func loopbackPair() (l, l6 net.Listener, err error) {
	for range 20 {
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, nil, fmt.Errorf("sandbox: the egress proxy's listener: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l6, err = net.Listen("tcp", net.JoinHostPort("::1", strconv.Itoa(port)))
		if err == nil {
			return l, l6, nil
		}
		if errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT) {
			return l, nil, nil // no IPv6 loopback: nothing can hold it
		}
		l.Close() // the port is someone's on ::1: another one
	}
	return nil, nil, fmt.Errorf("sandbox: the egress proxy's listener: no port free on both 127.0.0.1 and ::1: %w", err)
}
