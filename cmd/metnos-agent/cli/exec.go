package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/sandbox/changes"
)

const execHelp = `
Exec runs COMMAND in the strongest sandbox this machine offers for the
policy of --profile (default supervised): the system directories
read-only, plus the paths given with --read and --write. The device
nucleus (~/.ssh, ~/.gnupg, browser profiles, the agent's own key, ...) and
the session's IPC stay hidden whatever is granted.

Profiles: supervised (system paths and the grants only), readonly (the
whole root readable, nothing writable but a private /tmp), full (the
whole root writable, the network open), full-fs-no-net (the real root
writable, the network cut, refused rather than weakened).

A COMMAND without a slash is looked up on the agent's PATH; when it lies
outside what the policy shows, its directory is granted read-only (and
a line on stderr says so). The command gets only PATH (filtered to what it
can see), HOME, LANG, and TERM and TZ when set: nothing else of the
agent's environment. Its working directory is the current one if the
policy shows it, else /. Standard input, when it is not a terminal, is
the command's own: it reads it as it goes (the agent reads none of it).

The command's stdout and stderr are kept up to --max-output each (8M by
default) and printed once it ends; past that the rest is dropped, and
exec says so and exits 1 even when the command succeeded.

With --dry-run, every folder the command may write (--write, the
folder of a --write file) is put behind a copy-on-write layer that is
thrown away when it ends (Linux, with bubblewrap): the command runs as
usual, gets METNOS_DRY_RUN=1, and changes nothing on disk; exec then
lists on stderr what it would have changed (with --json, in the
result's dry_run). Where the layer cannot be made (another system, no
bubblewrap, the sandbox off, a root profile), exec refuses, exit 125,
and runs nothing. See docs/dryrun.md.

The exit status is the command's own, 128+N when signal N killed it (or
stopped exec: 130 for Ctrl-C, 143 for SIGTERM), 124 when --timeout
killed it, 1 when its output passed --max-output, and 125 when the
sandbox refused to run it or it could not be started.
`

// execFlags are the parsed flags of exec.
type execFlags struct {
	read, write stringList
	net         bool
	allowNet    stringList
	profile     string
	timeout     durationFlag
	memory      byteSize
	maxOutput   byteSize
	maxProcs    int
	minSandbox  levelFlag
	json        bool
	cwd         string
	dryRun      bool
	// stoppedBy returns the signal that stopped the run, or nil.
	stoppedBy func() os.Signal
}

func runExec(std stdio, args []string) int {
	fs := newFlagSet("exec", std, execHelp)
	var f execFlags
	fs.Var(&f.read, "read", "grant read access beneath `PATH` (repeatable)")
	fs.Var(&f.write, "write", "grant write access beneath `PATH` (repeatable)")
	fs.BoolVar(&f.net, "net", false, "let the command use the whole network")
	fs.Var(&f.allowNet, "allow-net", "let the command reach `HOST[:PORT],...` only, through a proxy of the agent's (repeatable; *.domain, * for any public host, an address or CIDR)")
	fs.StringVar(&f.profile, "profile", string(policy.ProfileSupervised), "policy `NAME`: supervised, readonly, full or full-fs-no-net")
	f.timeout = durationFlag(sandbox.DefaultLimits().Timeout)
	fs.Var(&f.timeout, "timeout", "kill the command after `DUR` (with a unit: 90s, 5m, 1h)")
	fs.Var(&f.memory, "memory", "cap memory at `BYTES` (suffixes K, M, G, T: powers of 1024; default $METNOS_EXEC_MEM_MB MiB, else 1G, on Windows 512M per process)")
	fs.IntVar(&f.maxProcs, "max-procs", sandbox.DefaultLimits().MaxProcs, "cap processes and threads at `N`")
	f.maxOutput = byteSize(sandbox.DefaultLimits().OutputBytes)
	fs.Var(&f.maxOutput, "max-output", "keep at most `BYTES` of the command's stdout, and as much of its stderr (suffixes K, M, G: powers of 1024); past it the rest is dropped and exec exits 1")
	fs.Var(&f.minSandbox, "min-sandbox", "refuse to run in a sandbox weaker than `LEVEL`: none, contained, isolated or full")
	fs.BoolVar(&f.json, "json", false, "print the result as one JSON object instead of the command's output")
	fs.StringVar(&f.cwd, "cwd", "", "run the command in `DIR` (default: the current directory if visible, else /)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "change nothing on disk: the writable folders behind a layer thrown away afterwards; list what the command would have changed")
	if code, done := parseFlags(fs, args); done {
		return code
	}
	argv := fs.Args()
	if len(argv) == 0 || argv[0] == "" {
		return usageError(std.err, "exec", "exec needs a command")
	}
	prof := policy.Profile(f.profile)
	switch prof {
	case policy.ProfileSupervised, policy.ProfileReadonly, policy.ProfileFull, policy.ProfileFullFSNoNet:
	default:
		return usageError(std.err, "exec", "unknown profile %q (want supervised, readonly, full or full-fs-no-net)", f.profile)
	}
	if prof == policy.ProfileFullFSNoNet && f.net {
		return usageError(std.err, "exec", "--net contradicts --profile full-fs-no-net, which cuts the network")
	}
	allowNet, err := allowNetDests(f.allowNet)
	if err != nil {
		return usageError(std.err, "exec", "%v", err)
	}
	if len(allowNet) > 0 && (f.net || prof == policy.ProfileFull || prof == policy.ProfileFullFSNoNet) {
		return usageError(std.err, "exec", "--allow-net narrows the network to the hosts named; it contradicts --net and the profiles full and full-fs-no-net")
	}
	if f.timeout <= 0 {
		return usageError(std.err, "exec", "--timeout %s: give a positive duration, e.g. 30s", time.Duration(f.timeout))
	}
	if f.maxProcs <= 0 {
		return usageError(std.err, "exec", "--max-procs %d: give a positive number of processes", f.maxProcs)
	}
	if int64(f.maxOutput) > math.MaxInt {
		return usageError(std.err, "exec", "--max-output %s is more than this system can hold", f.maxOutput.String())
	}

	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	if f.memory == 0 {
		// Unset: METNOS_EXEC_MEM_MB, else the sandbox's default for
		// this system.
		f.memory = byteSize(e.cfg.ExecMemoryBytes)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)
	var got atomic.Value // the os.Signal that stopped the run
	go func() {
		select {
		case sig := <-sigc:
			got.Store(sig)
			cancel()
		case <-ctx.Done():
		}
	}()
	f.stoppedBy = func() os.Signal {
		sig, _ := got.Load().(os.Signal)
		return sig
	}
	return execute(ctx, std, e, f, argv)
}

func execute(ctx context.Context, std stdio, e environment, f execFlags, argv []string) int {
	fail := func(err error) int {
		// The sandbox's errors start with "sandbox: "; ours says who speaks.
		msg := term.Sanitize(strings.TrimPrefix(err.Error(), "sandbox: "))
		fmt.Fprintf(std.err, "metnos-agent: %s\n", msg)
		if f.json {
			writeJSON(std, execError{Error: msg, Refused: errors.Is(err, sandbox.ErrRefused)})
		}
		return exitAgent
	}
	// The agent's own folders, where this OS keeps them, are in the
	// host: the key and the pairing are never visible to a command.
	host, err := deviceHost(e, os.Getuid())
	if err != nil {
		return fail(err)
	}
	in := execInput(f, host)
	pol, err := policy.ForProfile(in)
	if err != nil {
		return fail(err)
	}

	// The command: looked up on the host PATH and its directory granted
	// when the policy does not show it.
	cmdPath, resolved, err := findCommand(argv[0], e.cfg.Path)
	if err != nil {
		return fail(err)
	}
	if !sandbox.Visible(pol, resolved) {
		dir := filepath.Dir(resolved)
		fmt.Fprintf(std.err, "metnos-agent: granting read of %s to run %s\n", term.Sanitize(dir), term.Sanitize(argv[0]))
		in.Read = append(append([]string(nil), in.Read...), dir)
		if pol, err = policy.ForProfile(in); err != nil {
			return fail(err)
		}
	}
	// Keep the name the command was found under (multi-call binaries
	// look at argv[0]) when the sandbox shows it, else use its target.
	if !sandbox.Visible(pol, filepath.Dir(cmdPath)) {
		cmdPath = resolved
	}
	argv = append([]string{cmdPath}, argv[1:]...)

	dir, err := workDir(pol, f.cwd)
	if err != nil {
		return fail(err)
	}
	req := sandbox.Request{
		Argv:   argv,
		Stdin:  stdinFor(std.in),
		Env:    commandEnv(pol, host, e.cfg),
		Dir:    dir,
		Policy: pol,
		Limits: sandbox.Limits{
			Timeout:     time.Duration(f.timeout),
			MemoryBytes: int64(f.memory),
			MaxProcs:    f.maxProcs,
			OutputBytes: int(f.maxOutput),
		},
		MinSandbox: policy.Level(f.minSandbox),
		Logger:     slog.Default(),
		Options:    sandboxOptions(e),
		DryRun:     f.dryRun,
	}
	if slog.Default().Enabled(ctx, slog.LevelDebug) {
		// The fingerprint (the policy normalised, encoded and hashed)
		// only when it is logged.
		slog.Debug("exec", "argv", req.Argv, "dir", req.Dir, "policy", pol.Fingerprint(), "profile", pol.Profile)
	}

	out, err := sandbox.Run(ctx, req)
	if err != nil && !(errors.Is(err, context.Canceled) && ctx.Err() != nil) {
		return fail(err)
	}
	code := exitCode(out)
	interrupted := ctx.Err() != nil
	if interrupted {
		code = 128 + int(syscall.SIGINT)
		if f.stoppedBy != nil && f.stoppedBy() == syscall.SIGTERM {
			code = 128 + int(syscall.SIGTERM)
		}
	}
	truncated := out.StdoutTruncated || out.StderrTruncated
	if truncated && code == exitOK {
		// Not everything the command wrote reached the caller: that is
		// no success.
		code = exitFailure
	}
	if f.json {
		writeJSON(std, execResult{Output: out, Stdout: string(out.Stdout), Stderr: string(out.Stderr)})
	} else {
		if out.Reason != "" {
			fmt.Fprintf(std.err, "metnos-agent: sandbox %s: %s\n", out.Sandbox, term.Sanitize(out.Reason))
		}
		std.out.Write(out.Stdout)
		std.err.Write(out.Stderr)
		if n := out.Network; n != nil && n.Refused > 0 {
			fmt.Fprintf(std.err, "metnos-agent: the network proxy refused %d connection(s), the first to %s (%s): allow it with --allow-net\n", n.Refused, term.Sanitize(n.FirstRefused), term.Sanitize(n.FirstReason))
		}
		if out.DryRun != nil {
			printDryRun(std.err, out.DryRun)
		}
	}
	if truncated {
		more := byteSize(4 * int64(out.Limits.OutputBytes))
		fmt.Fprintf(std.err, "metnos-agent: the command wrote more than --max-output %s to %s; the rest was dropped: run it again with a larger --max-output (e.g. --max-output %s)\n",
			sandbox.FormatBytes(int64(out.Limits.OutputBytes)), truncatedStreams(out), more.String())
	}
	switch {
	case interrupted && code == 128+int(syscall.SIGTERM):
		fmt.Fprint(std.err, "metnos-agent: interrupted by SIGTERM; the command was stopped\n")
	case interrupted:
		fmt.Fprint(std.err, "metnos-agent: interrupted; the command was stopped\n")
	case out.TimedOut:
		fmt.Fprintf(std.err, "metnos-agent: timed out after %v\n", time.Duration(f.timeout))
	case out.OOMKilled:
		fmt.Fprintf(std.err, "metnos-agent: the command was killed by the memory limit of %s (raise it with --memory)\n", sandbox.FormatBytes(out.Limits.MemoryBytes))
	case out.CPUTimeExceeded && out.Priority != nil:
		fmt.Fprintf(std.err, "metnos-agent: the command used its CPU-time limit of %v of processor time and was stopped\n", out.Priority.CPUTime)
	case mayBeOutOfMemory(out):
		fmt.Fprintf(std.err, "metnos-agent: the command may have run out of memory: here --memory caps each process's address space at %s (raise it with --memory)\n", sandbox.FormatBytes(out.Limits.MemoryBytes))
	}
	return code
}

// printDryRun says on w what a dry run would have changed, a line a
// change.
func printDryRun(w io.Writer, d *sandbox.DryRun) {
	n := len(d.Changes) + d.More
	if n == 0 {
		fmt.Fprintf(w, "metnos-agent: dry run: nothing was changed, and the command would have changed nothing in %s\n", term.Sanitize(strings.Join(d.Layered, ", ")))
		return
	}
	fmt.Fprintf(w, "metnos-agent: dry run: nothing was changed; the command would have made %d change(s):\n", n)
	for _, c := range d.Changes {
		line := fmt.Sprintf("  %-8s %s", c.Op, c.Path)
		if c.From != "" {
			line = fmt.Sprintf("  %-8s %s -> %s", c.Op, c.From, c.Path)
		}
		switch {
		case c.Kind != changes.File:
			line += " (" + string(c.Kind) + ")"
		case c.Before != nil && c.After != nil && c.Before.Size != nil && c.After.Size != nil:
			line += fmt.Sprintf(" (%d -> %d bytes)", *c.Before.Size, *c.After.Size)
		case c.After != nil && c.After.Size != nil:
			line += fmt.Sprintf(" (%d bytes)", *c.After.Size)
		case c.Before != nil && c.Before.Size != nil:
			line += fmt.Sprintf(" (%d bytes)", *c.Before.Size)
		}
		if c.LinksOutside > 0 {
			line += fmt.Sprintf(" [also under %d name(s) outside the writable folders]", c.LinksOutside)
		}
		fmt.Fprintln(w, term.Sanitize(line))
	}
	if d.More > 0 {
		fmt.Fprintf(w, "  ... and %d more (see --json)\n", d.More)
	}
}

// memoryFailures are what a process says when an address-space limit
// stopped it: the dynamic loader, libc, Python.
var memoryFailures = []string{"failed to map segment", "Cannot allocate memory", "cannot allocate memory", "MemoryError", "out of memory"}

// mayBeOutOfMemory reports whether a failed run looks like the memory
// limit's doing where an rlimit, not a cgroup, holds it: the kernel
// then kills nothing and says nothing, and the command crashes or
// reports failed allocations itself. It is a hint, said as one.
func mayBeOutOfMemory(out sandbox.Output) bool {
	if out.LimitsBy == "cgroup" || out.LimitsBy == "cgroup(memory)+rlimit" || out.ExitCode == 0 {
		return false
	}
	switch out.Signal {
	case "SIGSEGV", "SIGBUS", "SIGABRT", "SIGKILL":
		return true
	}
	for _, s := range memoryFailures {
		if strings.Contains(string(out.Stderr), s) {
			return true
		}
	}
	return false
}

// truncatedStreams names the streams the output limit cut.
func truncatedStreams(out sandbox.Output) string {
	switch {
	case out.StdoutTruncated && out.StderrTruncated:
		return "stdout and stderr"
	case out.StdoutTruncated:
		return "stdout"
	}
	return "stderr"
}

// execInput is the policy input of exec's flags on host.
func execInput(f execFlags, host policy.Host) policy.ProfileInput {
	return policy.ProfileInput{
		Profile:  policy.Profile(f.profile),
		Read:     f.read,
		Write:    f.write,
		Network:  f.net,
		AllowNet: mustAllowNet(f.allowNet),
		Host:     host,
	}
}

// allowNetDests reads --allow-net's entries: each flag may hold several,
// separated by commas.
func allowNetDests(flags []string) ([]policy.Dest, error) {
	var out []policy.Dest
	for _, f := range flags {
		for _, s := range strings.Split(f, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			d, err := policy.ParseOwnerDest(s)
			if err != nil {
				return nil, fmt.Errorf("--allow-net: %w", err)
			}
			d.Why = "--allow-net " + s
			out = append(out, d)
		}
	}
	return out, nil
}

// mustAllowNet is allowNetDests of flags runExec has already checked.
func mustAllowNet(flags []string) []policy.Dest {
	d, _ := allowNetDests(flags)
	return d
}

// execResult is what exec --json prints when the command ran: the
// sandbox's Output with the command's output as strings.
type execResult struct {
	sandbox.Output
	// Stdout and Stderr shadow the byte slices of Output, which
	// encoding/json would write in base64.
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
}

// execError is what exec --json prints when the command did not run.
type execError struct {
	Error string `json:"error"`
	// Refused is true when the sandbox refused the run.
	Refused bool `json:"refused"`
}

func writeJSON(std stdio, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintf(std.err, "metnos-agent: %v\n", err)
		return
	}
	std.out.Write(append(b, '\n'))
}

// exitCode maps how the command ended to the agent's exit status.
func exitCode(out sandbox.Output) int {
	switch {
	case out.TimedOut:
		return exitTimeout
	case out.Signal != "":
		if n := signalNum(out.Signal); n > 0 {
			return 128 + n
		}
		return exitFailure
	case out.ExitCode < 0:
		return exitFailure
	}
	return out.ExitCode
}

// findCommand returns the absolute path of the command name, as found
// (on path, the agent's PATH as config read it, when it has no slash),
// and with symlinks resolved.
func findCommand(name, path string) (found, resolved string, err error) {
	found = name
	if !strings.ContainsAny(name, "/"+string(filepath.Separator)) {
		if found = lookPath(name, path); found == "" {
			return "", "", fmt.Errorf("%s: not found on PATH", name)
		}
	}
	if found, err = filepath.Abs(found); err != nil {
		return "", "", err
	}
	if resolved, err = filepath.EvalSymlinks(found); err != nil {
		return "", "", fmt.Errorf("%s: %w", name, unwrapPathError(err))
	}
	if err := runnable(resolved); err != nil {
		return "", "", fmt.Errorf("%s: %w", name, err)
	}
	return found, resolved, nil
}

// runnable refuses, before any sandbox is set up, a command path that
// is a folder or, outside Windows, a file with no execute bit.
func runnable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return unwrapPathError(err)
	case fi.IsDir():
		return errors.New("is a folder, not a command")
	case runtime.GOOS != "windows" && fi.Mode()&0o111 == 0:
		return errors.New("is not executable (chmod +x it, or run it with its interpreter)")
	}
	return nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// workDir returns the command's working directory: cwd when set (made
// absolute), else the current directory when the policy shows it,
// else "/".
func workDir(p policy.Policy, cwd string) (string, error) {
	if cwd != "" {
		abs, err := filepath.Abs(cwd)
		if err != nil {
			return "", fmt.Errorf("--cwd %s: %w", cwd, err)
		}
		if r, err := filepath.EvalSymlinks(abs); err == nil {
			abs = r
		}
		fi, err := os.Stat(abs)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return "", fmt.Errorf("--cwd %s: does not exist", cwd)
		case err != nil:
			return "", fmt.Errorf("--cwd %s: %w", cwd, unwrapPathError(err))
		case !fi.IsDir():
			return "", fmt.Errorf("--cwd %s: not a folder", cwd)
		}
		if !sandbox.Visible(p, abs) {
			return "", fmt.Errorf("--cwd %s: not visible in the sandbox (grant it with --read or --write)", cwd)
		}
		return abs, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "/", nil
	}
	if r, err := filepath.EvalSymlinks(wd); err == nil {
		wd = r
	}
	if sandbox.Visible(p, wd) {
		return wd, nil
	}
	return "/", nil
}

// defaultPath is the command's PATH when none of the agent's PATH
// directories is visible.
const defaultPath = "/usr/local/bin:/usr/bin:/bin"

// lookPath finds the executable name in the folders of the list path,
// as a shell would, but reading no environment (exec.LookPath reads the
// process's PATH): "" when none holds it. Relative folders are passed
// over. On Windows it also tries name with the usual executable
// extensions.
func lookPath(name, path string) string {
	exts := []string{""}
	if runtime.GOOS == "windows" {
		exts = append(exts, ".exe", ".com", ".bat", ".cmd")
	}
	for _, d := range filepath.SplitList(path) {
		if !filepath.IsAbs(d) {
			continue
		}
		for _, ext := range exts {
			p := filepath.Join(d, name+ext)
			fi, err := os.Stat(p)
			if err == nil && fi.Mode().IsRegular() && (runtime.GOOS == "windows" || fi.Mode()&0o111 != 0) {
				return p
			}
		}
	}
	return ""
}

// commandEnv is the command's whole environment: PATH (the agent's,
// filtered to the directories the policy shows), HOME, LANG, and TERM
// and TZ when set, from cfg. Nothing else of the agent's environment
// goes in: it may hold secrets.
func commandEnv(p policy.Policy, h policy.Host, cfg config.Config) []string {
	var dirs []string
	seen := map[string]bool{}
	for _, d := range filepath.SplitList(cfg.Path) {
		if !filepath.IsAbs(d) || seen[d] {
			continue
		}
		seen[d] = true
		if sandbox.Visible(p, d) {
			dirs = append(dirs, filepath.Clean(d))
		}
	}
	path := strings.Join(dirs, ":")
	if path == "" {
		path = defaultPath
	}
	lang := cfg.Lang
	if lang == "" {
		lang = config.DefaultLang
	}
	env := []string{"PATH=" + path, "HOME=" + h.Home, "LANG=" + lang}
	for _, kv := range [][2]string{{"TERM", cfg.Term}, {"TZ", cfg.TZ}} {
		if kv[1] != "" {
			env = append(env, kv[0]+"="+kv[1])
		}
	}
	return env
}

// stdinFor is the command's standard input: f itself, which the
// command reads as it goes (a pipe is never read ahead, so an endless
// or a slow producer costs no memory and delays nothing; the sandbox
// copies other files rather than hand them over), unless f is a
// terminal or missing: the command then gets an empty input rather than
// waiting on the user.
func stdinFor(f *os.File) io.Reader {
	if f == nil {
		return nil
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice != 0 {
		return nil
	}
	return f
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// byteSize is a size flag: plain bytes, or a number with a K, M, G or T
// suffix (powers of 1024, "KiB" and "KB" accepted alike).
type byteSize int64

func (b *byteSize) String() string {
	if b == nil {
		return "0"
	}
	v := int64(*b)
	for _, u := range []string{"T", "G", "M", "K"} {
		m := unitBytes[u]
		if v >= m && v%m == 0 {
			return strconv.FormatInt(v/m, 10) + u
		}
	}
	return strconv.FormatInt(v, 10)
}

var unitBytes = map[string]int64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

func (b *byteSize) Set(s string) error {
	num := strings.TrimSpace(s)
	mult := int64(1)
	u := strings.ToUpper(num)
	u = strings.TrimSuffix(strings.TrimSuffix(u, "IB"), "B")
	if u != "" {
		if m, ok := unitBytes[u[len(u)-1:]]; ok {
			mult = m
			u = u[:len(u)-1]
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(u), 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size (want bytes, or a number with K, M, G or T, e.g. 512M)", s)
	}
	*b = byteSize(n * mult)
	return nil
}

// durationFlag is a duration flag whose error says that a number
// needs a unit.
type durationFlag time.Duration

func (d *durationFlag) String() string {
	if d == nil {
		return "0s"
	}
	return time.Duration(*d).String()
}

func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("a duration needs a unit: give e.g. %ss", s)
		}
		return fmt.Errorf("not a duration: give e.g. 90s, 5m or 1h")
	}
	*d = durationFlag(v)
	return nil
}

// levelFlag is a sandbox.Level flag.
type levelFlag policy.Level

func (l *levelFlag) String() string {
	if l == nil {
		return policy.LevelNone.String()
	}
	return policy.Level(*l).String()
}

func (l *levelFlag) Set(s string) error {
	v, err := policy.ParseLevel(s)
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "sandbox: "))
	}
	*l = levelFlag(v)
	return nil
}

var _ flag.Value = (*levelFlag)(nil)
