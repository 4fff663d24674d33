package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/wire"
)

// Handle takes one invocation from a poll response through §6.2:
// shape, ledger, signature, id, then execution, and spools its result.
// An invocation that fails its checks is not run; it gets a result with
// error_class "invocation_refused", so that the server learns at once
// rather than at its timeout, and so that nothing it sends can stall
// the invocations after it.
func (a *Agent) Handle(ctx context.Context, raw any) error {
	inv, err := wire.ParseInvocation(raw)
	if err != nil {
		a.log.Error("the server sent an invocation of the wrong shape; ignored", "err", err)
		return err
	}
	log := a.log.With("invocation", inv.ID, "executor", inv.Executor)
	if !wire.ValidID(inv.ID) {
		log.Error("refusing an invocation id the server cannot issue; not run, no result possible")
		return nil
	}
	if a.spool.Executed(inv.ID) {
		log.Info("already executed on this device; not run again")
		return nil
	}
	if err := inv.Verify(a.server); err != nil {
		a.refuse(log, inv, fmt.Errorf("the invocation's signature is not the paired server's: %w", err))
		return nil
	}
	if err := wire.CheckID(inv.ID, time.Now()); err != nil {
		a.refuse(log, inv, err)
		return nil
	}
	r, keep := a.execute(ctx, inv)
	if !keep {
		log.Info("stopping before the run started; the server will hand the invocation out again")
		return nil
	}
	r.InvocationID, r.DeviceID = inv.ID, a.client.DeviceID()
	body, cut, err := r.body()
	if err != nil {
		r = DeviceError(err)
		r.InvocationID, r.DeviceID = inv.ID, a.client.DeviceID()
		body, _ = r.Body()
	}
	if cut {
		log.Warn("the result was over the server's 4 MiB limit; its payload was dropped and the result says so")
	}
	if err := a.spool.Finish(inv.ID, body); err != nil {
		log.Error("could not spool the result", "err", err)
		return nil
	}
	a.finishJournal(inv, r)
	a.auditRecord(inv, r, body)
	log.Info("executed", "ok", r.OK, "sandbox", r.Sandbox, "elapsed_ms", r.ElapsedMS, "error_class", r.ErrorClass)
	a.Flush(ctx)
	return nil
}

// refuse records and reports an invocation that is not run.
func (a *Agent) refuse(log interface {
	Warn(string, ...any)
	Error(string, ...any)
}, inv wire.Invocation, why error) {
	log.Warn("invocation refused; not run", "err", why)
	r := Result{InvocationID: inv.ID, DeviceID: a.client.DeviceID(), Entries: []any{}, Payload: map[string]any{},
		Sandbox: "none", Error: "refused by the device: " + why.Error(), ErrorClass: "invocation_refused"}
	body, err := r.Body()
	if err == nil {
		err = a.spool.Finish(inv.ID, body)
	}
	if err != nil {
		log.Error("could not spool the refusal", "err", err)
	}
	a.auditRecord(inv, r, body)
}

// execute fetches and verifies the executor, writes the STARTED marker
// and runs it under the watchdog.
func (a *Agent) execute(ctx context.Context, inv wire.Invocation) (Result, bool) {
	// Everything before the marker has no effect on the device: when the
	// agent is asked to stop meanwhile, nothing is spooled, and the server
	// hands the invocation out again later.
	limit := max(time.Duration(inv.DeadlineMS)*time.Millisecond, time.Second)
	ex, err := a.executor(ctx, inv)
	var shimDir string
	if err == nil {
		shimDir, err = a.ensureShim(ctx, false)
	}
	if err == nil {
		err = a.pyErr
	}
	var req sandbox.Request
	if err == nil {
		req, err = a.Request(inv, ex, shimDir, limit)
	}
	if err != nil {
		return DeviceError(err), ctx.Err() == nil
	}
	// A backup blob the run would restore must still be the bytes it
	// was named after.
	if err := a.checkBlobs(inv); err != nil {
		return DeviceError(fmt.Errorf("executor %s not run: %w", ex.Name, err)), true
	}
	// The marker comes after the executor is known: whether it can
	// write decides what a crash means (§12.6).
	if err := a.spool.Start(inv.ID, inv.Reversibility, ex.Manifest.Facts.Writes()); err != nil {
		return DeviceError(fmt.Errorf("writing the STARTED marker: %w", err)), true
	}
	if err := a.beginJournal(inv, ex, req); err != nil {
		// Nothing ran yet; a change that could not be journaled is not made.
		return DeviceError(fmt.Errorf("executor %s not run: %w", ex.Name, err)), true
	}
	dog := time.AfterFunc(limit+10*time.Second, func() {
		if a.cfg.Watchdog != nil {
			a.cfg.Watchdog(inv.ID)
			return
		}
		a.log.Error("execution watchdog: the run did not end 10 s after its deadline; exiting 124 for the supervisor to restart the agent", "invocation", inv.ID)
		os.Exit(124)
	})
	defer dog.Stop()
	// A started run is not cut short when the agent is asked to stop: it
	// ends by itself or at its deadline, and its result is spooled.
	return a.run(context.WithoutCancel(ctx), inv, ex, req, shimDir, limit), true
}

// executor returns the verified executor, from the cache or fetched.
func (a *Agent) executor(ctx context.Context, inv wire.Invocation) (Executor, error) {
	ex, err := Cached(a.cfg.Layout.Cache, inv.Executor, inv.ManifestSHA256, inv.CodeSHA256, a.server)
	switch {
	case err == nil:
		return ex, nil
	case errors.Is(err, ErrUnverified):
		a.log.Warn("a cached executor no longer verifies; fetching it again", "executor", inv.Executor, "err", err)
	case !errors.Is(err, fs.ErrNotExist):
		return Executor{}, err
	}
	b, err := a.client.Executor(ctx, inv.Executor)
	if err != nil {
		return Executor{}, err
	}
	return Materialize(a.cfg.Layout.Cache, b, inv.Executor, inv.ManifestSHA256, inv.CodeSHA256, a.server)
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
// per process (and again when force is set or it drifted).
func (a *Agent) ensureShim(ctx context.Context, force bool) (string, error) {
	a.shimMu.Lock()
	defer a.shimMu.Unlock()
	if a.shimDir != "" && !force {
		return a.shimDir, nil
	}
	b, err := a.client.Shim(ctx)
	if err != nil {
		return "", err
	}
	dir, sha, err := InstallShim(a.cfg.Layout.Cache, b, a.server)
	if err != nil {
		return "", err
	}
	a.shimDir, a.shimSHA = dir, sha
	return dir, nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// refusedEnv says why an env_injections name is not passed on ("" when
// it is): what the loader, the interpreter or the shell would act on
// (LD_*, PYTHON*, PATH, HOME, ...) stays the agent's to set, whatever a
// signed invocation says.
func refusedEnv(k string) string {
	u := strings.ToUpper(k)
	switch {
	case !envName.MatchString(k):
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

var noModule = regexp.MustCompile(`No module named '([A-Za-z0-9_.]+)'`)

// run runs the executor in the sandbox and maps its output; once, a
// missing shim module makes it fetch the shim again and retry (§6.4).
// req and shimDir are what execute built (and journaled the grants of);
// the request is built again only for the retry, with the shim the
// self-heal fetched (once: it used to be fetched a second time here).
func (a *Agent) run(ctx context.Context, inv wire.Invocation, ex Executor, req sandbox.Request, shimDir string, limit time.Duration) Result {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			// The self-heal below has fetched the shim into shimDir.
			var err error
			if req, err = a.Request(inv, ex, shimDir, limit-time.Since(start)); err != nil {
				return DeviceError(err)
			}
		}
		out, err := sandbox.Run(ctx, req)
		if errors.Is(err, sandbox.ErrRefused) {
			return DeviceError(fmt.Errorf("executor %s: minimum sandbox not satisfied: %w", ex.Name, err))
		}
		if err != nil {
			return DeviceError(fmt.Errorf("executor %s: %w", ex.Name, err))
		}
		var r Result
		switch {
		case out.TimedOut:
			r = Timeout(out.Sandbox)
		case out.OOMKilled:
			r = DeviceError(fmt.Errorf("executor %s was killed by the memory limit (%d MiB)", ex.Name, req.Limits.MemoryBytes>>20))
		default:
			r = FromStdout(out.Stdout)
			if r.ErrorClass == "device_error" {
				// Self-heal (§6.4), only for a module of the shim that is
				// missing from this device's copy, and only once.
				m := noModule.FindStringSubmatch(string(out.Stderr))
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
		r.Sandbox, r.policy = out.Sandbox, out.Policy
		r.ElapsedMS = time.Since(start).Milliseconds()
		// Weaker than every layer the OS has (what this machine lacks,
		// or a layer that failed for this run), or than the machine's
		// best when this run fell short of it: say why.
		r.SandboxDowngradeReason = out.Reason
		if r.SandboxDowngradeReason == "" && out.Sandbox != a.best {
			r.SandboxDowngradeReason = fmt.Sprintf("ran under %s, weaker than this machine's %s", out.Sandbox, a.best)
		}
		return r
	}
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

// Request builds the sandbox request of one invocation from the signed
// manifest and the arguments (§6.4, §8.1): the capabilities' grants,
// the manifest's min_sandbox, the executor, the shim and the
// interpreter read-only, the user data folder writable, a clean
// environment, the arguments on stdin.
func (a *Agent) Request(inv wire.Invocation, ex Executor, shimDir string, limit time.Duration) (sandbox.Request, error) {
	data := a.UserData()
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
		Args:     inv.Args,
		Extra:    extra,
		Host:     a.host,
	}
	pol, err := policy.Derive(in)
	if err != nil {
		return sandbox.Request{}, fmt.Errorf("executor %s: %w", ex.Name, err)
	}
	if !sandbox.Visible(pol, a.python.Path) {
		if a.python.Prefix == "/" || fspath.Within(a.host.Home, a.python.Prefix) {
			return sandbox.Request{}, fmt.Errorf("python %s: its installation would be %s, which the sandbox would have to show whole; set METNOS_PYTHON to an interpreter installed in a folder of its own", a.python.Path, a.python.Prefix)
		}
		in.Extra = append(in.Extra, policy.Grant{Path: a.python.Prefix, Access: policy.Read, Own: fspath.Within(a.python.Prefix, a.cfg.Layout.Cache), Why: "python " + a.python.Source})
		if pol, err = policy.Derive(in); err != nil {
			return sandbox.Request{}, fmt.Errorf("executor %s: %w", ex.Name, err)
		}
	}
	stdin, err := wire.Canonical(inv.Args)
	if err != nil {
		return sandbox.Request{}, fmt.Errorf("executor %s: arguments: %w", ex.Name, err)
	}
	return sandbox.Request{
		Argv:       []string{a.python.Path, ex.Entry},
		Stdin:      stdin,
		Env:        a.env(inv, ex, shimDir),
		Dir:        a.cfg.Layout.Workspace(),
		Policy:     pol,
		Limits:     sandbox.Limits{Timeout: limit, MemoryBytes: a.cfg.MemoryBytes},
		MinSandbox: a.cfg.MinSandbox,
		Logger:     a.log,
		Options:    a.cfg.Sandbox,
	}, nil
}

// env is the executor's environment (§6.4): a few inherited variables,
// the Python settings, the server's env_injections, then the agent's
// own variables, which win.
func (a *Agent) env(inv wire.Invocation, ex Executor, shimDir string) []string {
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
	set("PATH", getOr(a.cfg.Path, "/usr/bin:/bin"))
	set("PYTHONPATH", shimDir+string(os.PathListSeparator)+ex.Dir)
	set("METNOS_RUNTIME", shimDir)
	set("PYTHONDONTWRITEBYTECODE", "1")
	set("PYTHONUTF8", "1")
	set("PYTHONIOENCODING", "utf-8")
	set("LANG", getOr(a.cfg.Lang, "C.UTF-8"))
	set("HOME", a.host.Home)
	for _, k := range slices.Sorted(maps.Keys(inv.Env)) {
		if why := refusedEnv(k); why != "" {
			a.log.Warn("env_injections: variable dropped", "invocation", inv.ID, "name", k, "why", why)
			continue
		}
		set(k, inv.Env[k])
	}
	data := a.UserData()
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
