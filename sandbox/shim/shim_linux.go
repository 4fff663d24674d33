package shim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unsafe"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// landlockConfig is the Landlock ABI the shim is written against (V7:
// file access, TCP bind/connect, abstract-socket and signal scoping). On
// an older kernel the shim applies what the kernel has and reports the
// ABI it got; it never asks for more than V7 without a code change.
// applyLandlock copies it; it is unexported so that no importer can
// weaken what every run asks for.
var landlockConfig = landlock.V7

func run(status *os.File, spec Spec, argv []string) int {
	if spec.ProxyFD > 0 {
		err := proxyListen(spec.Proxy, spec.ProxyFD)
		unix.Close(spec.ProxyFD)
		spec.ProxyFD = 0 // a supervisor's child does not listen again
		if err != nil {
			return fail(status, err)
		}
	}
	if spec.Supervise {
		return supervise(status, spec, argv)
	}
	// Everything below is per thread (the cgroups on a v1 hierarchy,
	// capabilities, no_new_privs, Landlock and seccomp without TSYNC);
	// execve keeps this thread's credentials and cgroups, so the thread
	// stays locked until exec.
	runtime.LockOSThread()
	// Only the confined shim joins the run's cgroups, so that the
	// memory limit's OOM killer can never pick the supervisor. On a v1
	// hierarchy the descriptor is the cgroup's tasks file, which moves
	// this thread alone: the thread that executes the command (the
	// others end with execve), and without the global lock whose taking
	// costs cgroup.procs an RCU grace period, 5 to 15 ms a run.
	for _, fd := range spec.CgroupFDs {
		f := os.NewFile(uintptr(fd), "cgroup")
		_, err := f.Write([]byte("0"))
		f.Close()
		if err != nil {
			return fail(status, fmt.Errorf("joining the run's cgroup: %w", err))
		}
	}
	unix.CloseOnExec(StatusFD)
	var err error

	// The command's environment comes from spec.EnvFD (the shim's own is
	// empty, so that nothing in it, LD_PRELOAD above all, acts on a host
	// program). Reading its own environment here is not configuration:
	// it is the shim's startup, in the process the sandbox made, and
	// the only place outside the command line allowed to (test/repo).
	env := os.Environ()
	if spec.EnvFD > 0 {
		if env, err = readEnv(spec.EnvFD); err != nil {
			return fail(status, err)
		}
	}
	path, err := lookPath(argv[0], env)
	if err != nil {
		return fail(status, lookError(argv[0], err))
	}
	if spec.Dir != "" {
		if err := os.Chdir(spec.Dir); err != nil {
			return fail(status, fmt.Errorf("working directory: %w", err))
		}
	}
	// RLIMIT_AS goes on last, right before execve: the Go runtime of
	// this shim may already hold more address space than the command
	// is allowed, and must not allocate under the limit.
	asLimit, hasAS := spec.Rlimits["as"]
	delete(spec.Rlimits, "as")
	if err := setRlimits(spec.Rlimits); err != nil {
		return fail(status, err)
	}
	var st Status
	if st.CapsDropped, err = dropCapabilities(); err != nil {
		return fail(status, err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail(status, fmt.Errorf("setting no_new_privs: %w", err))
	}
	st.NoNewPrivs = true
	// The run's priority, on this thread, before the command (or
	// anything of it) runs, and before Landlock makes /proc (the
	// autogroup) read-only; after the shim's own work, which it would
	// only slow down. RLIMIT_NICE 0 is already in force: it keeps the
	// command from lowering its nice value, not this from raising it.
	st.Prio = applyPriority(spec)
	if _, ok := spec.Rlimits["cpu"]; ok {
		var cpu unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_CPU, &cpu) == nil && cpu.Cur != unix.RLIM_INFINITY {
			st.Prio.CPUTime = cpu.Cur
		}
	}
	st.LandlockABI, _ = llsys.LandlockGetABIVersion()
	// A rule that keeps the writable mount of a removable grant's parent
	// to removing empty directories is the only thing holding it: no
	// such run goes on without Landlock that confines truncate (ABI 3).
	for _, r := range spec.Rules {
		if r.RemoveDir && (!spec.Landlock || st.LandlockABI < 3) {
			return fail(status, fmt.Errorf("the plan needs Landlock ABI 3 for %s, and this kernel gives %d", r.Path, st.LandlockABI))
		}
	}
	clock := &Clock{Main: mainAt.UnixNano()}
	if spec.Landlock && st.LandlockABI > 0 {
		clock.Landlock = time.Now().UnixNano()
		if err := applyLandlock(spec); err != nil {
			return fail(status, err)
		}
		st.Landlock = true
	}
	if spec.Seccomp {
		clock.Seccomp = time.Now().UnixNano()
		if err := applySeccomp(spec.Filters); err != nil {
			return fail(status, err)
		}
		st.Seccomp = true
	}
	// Every host process is a pid away: only Landlock's signal scope
	// (ABI 6) and ptrace check, and the seccomp filter, keep the command
	// from them. The agent planned them; a kernel that gave less is not
	// run on.
	if spec.HostPIDs && (!st.Landlock || st.LandlockABI < 6 || !st.Seccomp) {
		return fail(status, fmt.Errorf("the run shares the host's PID namespace and needs Landlock ABI 6 (signal scoping) and seccomp; this kernel gave Landlock ABI %d (applied: %t), seccomp applied: %t", st.LandlockABI, st.Landlock, st.Seccomp))
	}
	// In the host's network namespace only the seccomp filter keeps
	// the command from sending anything.
	if spec.NetView && spec.NetCut && !st.Seccomp {
		return fail(status, fmt.Errorf("the run reads the host's network interfaces with the network cut and needs seccomp, which was not applied"))
	}
	// Descriptors the agent itself inherited without close-on-exec
	// must not reach the command: only 0, 1 and 2 do.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fail(status, fmt.Errorf("closing inherited descriptors: %w", err))
	}
	st.Ready = true
	clock.Done = time.Now().UnixNano()
	st.Clock = clock
	report(status, st)
	pathp, err := syscall.BytePtrFromString(path)
	if err != nil {
		return fail(status, err)
	}
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return fail(status, err)
	}
	envp, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return fail(status, err)
	}
	if hasAS {
		lim := unix.Rlimit{Cur: asLimit, Max: asLimit}
		var old unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_AS, &old) == nil && old.Max < asLimit {
			lim = old
		}
		if _, _, e := unix.RawSyscall6(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_AS, uintptr(unsafe.Pointer(&lim)), 0, 0, 0); e != 0 {
			return fail(status, fmt.Errorf("setting rlimit as: %w", e))
		}
	}
	_, _, e := unix.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(pathp)), uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])))
	// Only reached when exec failed. Allocating may now fail under the
	// address-space limit: the status line is what matters.
	return fail(status, execError(path, e))
}

// execError says why execve of path failed in the words the user needs:
// a file that was found but "does not exist" for execve is a script
// whose #! interpreter is missing (in the sandbox's view).
func execError(path string, e syscall.Errno) error {
	if e == unix.ENOENT {
		if interp := shebang(path); interp != "" {
			return fmt.Errorf("the script's interpreter %s named on its #! line does not exist (inside the sandbox)", interp)
		}
	}
	switch e {
	case unix.ENOEXEC:
		return fmt.Errorf("it is neither a program nor a script with a #! line (add one, e.g. #!/bin/sh, or run it with its interpreter)")
	case unix.EACCES:
		return errNotExecutable
	}
	return fmt.Errorf("executing it: %w", e)
}

// errNotExecutable is a command file that execve may not run.
var errNotExecutable = errors.New("it is not executable (chmod +x it, or run it with its interpreter)")

// lookError says why the command name was not found or cannot run,
// without repeating the name (the caller's message names it).
func lookError(name string, err error) error {
	switch {
	case errors.Is(err, fs.ErrPermission):
		if fi, serr := os.Stat(name); serr == nil && fi.IsDir() {
			return errors.New("it is a folder, not a command")
		}
		return errNotExecutable
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("it does not exist (inside the sandbox)")
	}
	return err
}

// shebang is the interpreter a script's #! line names, or "" when path
// does not start with one.
func shebang(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var buf [256]byte
	n, _ := io.ReadFull(f, buf[:])
	line, ok := strings.CutPrefix(string(buf[:n]), "#!")
	if !ok {
		return ""
	}
	line, _, _ = strings.Cut(line, "\n")
	words := strings.Fields(line)
	if len(words) == 0 {
		return ""
	}
	if strings.IndexFunc(words[0], func(r rune) bool { return !unicode.IsGraphic(r) }) >= 0 {
		// Shown on a terminal: no control characters raw.
		return strconv.Quote(words[0])
	}
	return words[0]
}

var rlimitNames = map[string]int{
	"as":     unix.RLIMIT_AS,
	"nproc":  unix.RLIMIT_NPROC,
	"fsize":  unix.RLIMIT_FSIZE,
	"nofile": unix.RLIMIT_NOFILE,
	"core":   unix.RLIMIT_CORE,
	"nice":   unix.RLIMIT_NICE,
	"cpu":    unix.RLIMIT_CPU,
}

func setRlimits(limits map[string]uint64) error {
	for name, v := range limits {
		res, ok := rlimitNames[name]
		if !ok {
			return fmt.Errorf("unknown rlimit %q", name)
		}
		lim := unix.Rlimit{Cur: v, Max: v}
		if res == unix.RLIMIT_CPU {
			// SIGXCPU at the limit, which ends a command that does not
			// handle it and says why; SIGKILL a second later if it does.
			lim.Max = v + 1
		}
		var old unix.Rlimit
		if err := unix.Getrlimit(res, &old); err == nil && old.Max < lim.Max {
			// Never raise a hard limit the agent was already given.
			lim = unix.Rlimit{Cur: old.Max, Max: old.Max}
		}
		if err := unix.Setrlimit(res, &lim); err != nil {
			return fmt.Errorf("setting rlimit %s to %d: %w", name, v, err)
		}
	}
	return nil
}

// dropCapabilities empties the bounding, ambient, inheritable, permitted
// and effective sets of this thread and locks the securebits so that
// executing as uid 0 gains nothing back. It fails if any capability
// survives.
func dropCapabilities() (bool, error) {
	const secbits = 1<<0 | 1<<1 | 1<<2 | 1<<3 | 1<<4 | 1<<5 // NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (+ locks)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("reading capabilities: %w", err)
	}
	if data[0].Permitted|data[1].Permitted|data[0].Effective|data[1].Effective != 0 {
		// Only a privileged shim can (and needs to) lock securebits and
		// shrink the bounding set: without capabilities, no_new_privs
		// already keeps exec from granting any.
		if cur, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0); err == nil && cur&secbits != secbits {
			if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(cur|secbits)&^(1<<4), 0, 0, 0); err != nil {
				return false, fmt.Errorf("locking securebits: %w", err)
			}
		}
		for c := 0; c <= unix.CAP_LAST_CAP; c++ {
			if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || in == 0 {
				continue
			}
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return false, fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
			}
		}
	}
	_ = unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	data = [2]unix.CapUserData{}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("dropping capabilities: %w", err)
	}
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("reading capabilities: %w", err)
	}
	if data[0].Permitted|data[1].Permitted|data[0].Effective|data[1].Effective|data[0].Inheritable|data[1].Inheritable != 0 {
		return false, errors.New("capabilities retained after dropping them; refusing to run")
	}
	return true, nil
}

func applyLandlock(spec Spec) error {
	cfg := landlockConfig
	if !spec.NetCut {
		cfg.HandledAccessNet = 0
	}
	var rules []landlock.Rule
	if spec.NetCut && spec.Proxy > 0 {
		rules = append(rules, landlock.ConnectTCP(uint16(spec.Proxy)))
	}
	for _, r := range spec.Rules {
		// Rule paths are canonical: open each without following any
		// symbolic link, and give Landlock the descriptor's own path,
		// so that a directory swapped for a link since the agent
		// planned the run (by a concurrent process) cannot redirect a
		// rule. A path that has become a link gets no rule at all.
		path := r.Path
		fd, err := unix.Openat2(unix.AT_FDCWD, r.Path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
		switch {
		case err == nil:
			defer unix.Close(fd)
			path = "/proc/self/fd/" + strconv.Itoa(fd)
		case errors.Is(err, unix.ENOSYS):
			// Linux < 5.6: by path, as go-landlock does.
		default:
			continue
		}
		var fr landlock.FSRule
		switch {
		case r.RemoveDir:
			fr = landlock.PathAccess(llsys.AccessFSRemoveDir, path)
		case r.File && r.Write:
			fr = landlock.RWFiles(path)
		case r.File:
			fr = landlock.ROFiles(path)
		case r.Write:
			// Refer lets files be renamed and linked between
			// directories beneath the rule; Landlock still refuses any
			// move that would give a file more rights than it had.
			fr = landlock.RWDirs(path).WithRefer()
		default:
			fr = landlock.RODirs(path)
		}
		if r.Dev {
			fr = fr.WithIoctlDev()
		}
		rules = append(rules, fr.IgnoreIfMissing())
	}
	fd, flags, err := cfg.BestEffort().NewRulesetFD(rules...)
	if err != nil {
		return fmt.Errorf("building the Landlock ruleset: %w", err)
	}
	if fd < 0 {
		return nil
	}
	defer unix.Close(fd)
	if err := llsys.LandlockRestrictSelf(fd, flags); err != nil {
		return fmt.Errorf("enforcing Landlock: %w", err)
	}
	return nil
}

// supervise runs the confined shim as a child, as a subreaper, and kills
// every descendant when the child ends or this process is told to stop
// (SIGTERM from the agent at the deadline, or the agent's death).
func supervise(status *os.File, spec Spec, argv []string) int {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail(status, fmt.Errorf("becoming a subreaper: %w", err))
	}
	_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0)
	unix.CloseOnExec(StatusFD)

	sigc := make(chan os.Signal, 16)
	signal.Notify(sigc, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)

	// The confined shim gets the same spec minus supervision, and the
	// cgroup descriptors at the same numbers.
	spec.Supervise = false
	inner, err := json.Marshal(spec)
	if err != nil {
		return fail(status, err)
	}
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	cmd := exec.Command(self, append([]string{Arg, string(inner), "--"}, argv...)...)
	cmd.Env = []string{} // the command's comes through spec.EnvFD
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{status}
	fds := append([]int(nil), spec.CgroupFDs...)
	if spec.EnvFD > 0 {
		fds = append(fds, spec.EnvFD)
	}
	slices.Sort(fds)
	for _, fd := range fds {
		for len(cmd.ExtraFiles) < fd-StatusFD {
			cmd.ExtraFiles = append(cmd.ExtraFiles, nil)
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, os.NewFile(uintptr(fd), "inherited"))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fail(status, fmt.Errorf("starting the confined shim: %w", err))
	}
	r := &reaper{main: cmd.Process.Pid}
	// The confined shim sets its autogroup's nice value itself; where
	// the kernel's rate limit refused it, it is set from here as soon as
	// the kernel allows.
	var agAt time.Time
	agDone, agStop := make(chan struct{}), make(chan struct{})
	if spec.Autogroup > 0 {
		go func() {
			defer close(agDone)
			select {
			case <-time.After(20 * time.Millisecond):
			case <-agStop:
				return
			}
			agAt = KeepAutogroup(r.main, spec.Autogroup, spec.AgentAutogroup, agStop, nil)
		}()
	} else {
		close(agDone)
	}
	for !r.done {
		r.reap()
		if r.done {
			break
		}
		if s := <-sigc; s != unix.SIGCHLD {
			_ = unix.Kill(r.main, unix.SIGKILL)
			r.killDescendants()
		}
	}
	close(agStop)
	<-agDone
	// The command is gone; nothing it left behind may outlive it.
	r.killDescendants()
	st := Status{Exited: true}
	if !agAt.IsZero() {
		st.AutogroupAt = agAt.UnixNano()
	}
	if r.status.Signaled() {
		st.ExitCode = -1
		st.Signal = unix.SignalName(r.status.Signal())
	} else {
		st.ExitCode = r.status.ExitStatus()
	}
	report(status, st)
	if st.Signal != "" {
		return 128 + int(r.status.Signal())
	}
	return st.ExitCode
}

// reaper collects the supervisor's children, keeping the main child's
// status.
type reaper struct {
	main   int
	done   bool
	status unix.WaitStatus
}

// reap collects every child that has ended, without blocking.
func (r *reaper) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		if pid <= 0 || err != nil {
			return
		}
		if pid == r.main {
			r.done, r.status = true, ws
		}
	}
}

// killDescendants SIGKILLs every process below this one until none is
// left. Orphans re-parent to us (we are a subreaper), so the tree can only
// shrink while we walk it.
func (r *reaper) killDescendants() {
	self := os.Getpid()
	for round := 0; round < 200; round++ {
		kids := descendants(self)
		if len(kids) == 0 {
			return
		}
		for _, pid := range kids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		r.reap()
		time.Sleep(time.Millisecond)
	}
}

// descendants lists the live processes below root, read from /proc.
func descendants(root int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parens.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		parent[pid] = ppid
	}
	var out []int
	for pid := range parent {
		for p, n := parent[pid], 0; p != 0 && n < 4096; p, n = parent[p], n+1 {
			if p == root {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// applySeccomp installs the programs on the calling thread only (no
// TSYNC): the shim execs from this thread, and the new program inherits
// its filters.
func applySeccomp(progs [][]byte) error {
	if len(progs) == 0 {
		return errors.New("seccomp: no filter given (refusing to run unfiltered)")
	}
	for i, b := range progs {
		if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > 4096 {
			return fmt.Errorf("seccomp: filter %d is %d bytes, not a whole program", i, len(b))
		}
		filter := make([]unix.SockFilter, len(b)/8)
		for j := range filter {
			w := b[8*j:]
			filter[j] = unix.SockFilter{Code: binary.NativeEndian.Uint16(w), Jt: w[2], Jf: w[3], K: binary.NativeEndian.Uint32(w[4:])}
		}
		fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
			return fmt.Errorf("seccomp: loading filter %d: %w", i, errno)
		}
	}
	return nil
}

// readEnv reads the NUL-separated environment from the descriptor fd
// and closes it.
func readEnv(fd int) ([]string, error) {
	f := os.NewFile(uintptr(fd), "env")
	defer f.Close()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("reading the environment: %w", err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("reading the environment: %w", err)
	}
	env := []string{}
	for _, kv := range strings.Split(string(b), "\x00") {
		if kv != "" {
			env = append(env, kv)
		}
	}
	return env, nil
}

// lookPath finds name as exec.LookPath does, in the PATH of env.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return exec.LookPath(name)
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range strings.Split(path, ":") {
		if !strings.HasPrefix(dir, "/") {
			continue // relative entries (and "") are never searched
		}
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in the PATH %s", path)
}

// proxyListen makes the run's egress proxy socket: a TCP listener on
// 127.0.0.1:port in the run's own network namespace, sent to the agent
// over the unix socket fd, which accepts on it. This process keeps no
// copy: the listener is closed here once sent.
func proxyListen(port, fd int) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("egress proxy port %d is not a port", port)
	}
	l, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("egress proxy socket: %w", err)
	}
	defer unix.Close(l)
	if err := unix.Bind(l, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fmt.Errorf("egress proxy: binding 127.0.0.1:%d in the run's network namespace: %w", port, err)
	}
	// At the number and with the backlog an agent that denies itself
	// listen(2) still allows (ProxyListenFD, ProxyBacklog); a descriptor
	// already there is not replaced.
	if _, err := unix.FcntlInt(ProxyListenFD, unix.F_GETFD, 0); err == nil {
		return fmt.Errorf("egress proxy: descriptor %d is already in use", ProxyListenFD)
	}
	if err := unix.Dup3(l, ProxyListenFD, unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("egress proxy socket: %w", err)
	}
	defer unix.Close(ProxyListenFD)
	if err := unix.Listen(ProxyListenFD, ProxyBacklog); err != nil {
		return fmt.Errorf("egress proxy: listening on 127.0.0.1:%d: %w", port, err)
	}
	if err := unix.Sendmsg(fd, []byte{0}, unix.UnixRights(ProxyListenFD), nil, 0); err != nil {
		return fmt.Errorf("egress proxy: handing the listener to the agent: %w", err)
	}
	return nil
}
