package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/metnos/agent/cmd/metnos-agent/internal/service"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/sandbox"
)

const installHelp = `
Install the agent as this user's service and start it: a systemd user
unit on Linux (and linger, so that it runs without a login session), a
LaunchAgent on macOS, a logon task on Windows. It runs "metnos-agent run
--wait" from this binary's path (started while another agent runs, it
waits for that one to stop), and is restarted whenever it stops.

If the Rust client (metnos-client) is installed, its service is stopped
and disabled; the device key and pairing, in the same data directory,
are kept, so the device stays paired. Where no systemd user manager runs
(a container, CI), the unit is written and install says what to run,
exiting 1.`

// serviceArgs are the arguments the service runs the agent with: run,
// waiting for an agent already running (a `run` in a terminal) rather
// than exiting 3 at every restart.
var serviceArgs = []string{"run", "--wait"}

// envFlag collects --env K=V.
type envFlag []service.EnvVar

func (e *envFlag) String() string { return "" }

func (e *envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New("want NAME=VALUE")
	}
	*e = append(*e, service.EnvVar{Key: k, Value: v})
	return nil
}

// newService returns the service manager for this user and OS.
func newService(std stdio, dryRun bool) (*service.Manager, error) {
	e, err := std.environment()
	if err != nil {
		return nil, err
	}
	data, cache := e.lay.Data, e.lay.Cache
	s := &service.Manager{
		GOOS: goruntime.GOOS, DataDir: data, CacheDir: cache, Dir: e.lay.ServiceDir(),
		LingerDir: "/var/lib/systemd/linger",
		Runner:    service.ExecRunner{}, Out: std.out, DryRun: dryRun,
		UID: os.Getuid(),
	}
	// USERDOMAIN\USERNAME on Windows, USER elsewhere, when the user
	// database gives no name.
	s.User = e.cfg.User
	s.Home = e.lay.Home
	if goruntime.GOOS == "windows" {
		if u, err := user.Current(); err == nil {
			s.User = u.Username // DOMAIN\name
		}
		return s, nil
	}
	if s.Home == "" {
		return nil, errors.New("the home folder is not known: set $HOME")
	}
	if u, err := user.Current(); err == nil {
		s.User = u.Username
	}
	return s, nil
}

func runInstall(std stdio, args []string) int {
	fs := newFlagSet("install", std, installHelp)
	dryRun := fs.Bool("dry-run", false, "print what would be written and run, and change nothing")
	var env envFlag
	fs.Var(&env, "env", "set `NAME=VALUE` in the service's environment (repeatable; not on Windows)")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "install", "install takes no arguments")
	}
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return fail(std, fmt.Errorf("finding this binary's path for the service: %w", err))
	}
	if strings.Contains(filepath.ToSlash(exe), "/go-build") && !*dryRun {
		// "go run" builds in a temporary folder that is gone afterwards.
		return fail(std, fmt.Errorf("this binary (%s) is a temporary build of `go run`, which the service could not start later: build or install metnos-agent, then run its install", exe))
	}
	if e, err := std.environment(); err == nil && !*dryRun {
		if err := pairing.CheckHome(e.lay); err != nil { // never create a missing home
			return fail(std, err)
		}
	}
	s, err := newService(std, *dryRun)
	if err != nil {
		return fail(std, err)
	}
	c := service.Config{Exe: exe, Args: serviceArgs, DataDir: s.DataDir, User: s.User}
	// The service must use the directories this command uses.
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	for _, k := range []string{"METNOS_DATA_DIR", "METNOS_CACHE_DIR"} {
		if e.cfg.Paths.Getenv(k) != "" && !hasEnv(env, k) {
			v := s.DataDir
			if k == "METNOS_CACHE_DIR" {
				v = s.CacheDir
			}
			c.Env = append(c.Env, service.EnvVar{Key: k, Value: v})
		}
	}
	c.Env = append(c.Env, env...)
	if st, err := pairing.LoadState(e.lay); err == nil && st.Paired() {
		fmt.Fprintf(std.out, "this device is paired (device %s); the service uses the key and pairing in %s\n", *st.DeviceID, s.DataDir)
	} else {
		fmt.Fprintf(std.out, "this device is not paired yet: run \"metnos-agent register\"; the service waits for it (data in %s)\n", s.DataDir)
	}
	err = s.Install(context.Background(), c)
	if errors.Is(err, service.ErrNotEnabled) {
		fmt.Fprintf(std.err, "metnos-agent: %v\n", err)
		return exitFailure
	}
	if err != nil {
		return fail(std, err)
	}
	return exitOK
}

func hasEnv(env envFlag, k string) bool {
	for _, e := range env {
		if e.Key == k {
			return true
		}
	}
	return false
}

func runUninstall(std stdio, args []string) int {
	fs := newFlagSet("uninstall", std, `
Stop the agent's service and remove it. The device key, the pairing and
the caches stay, so a later install (or the Rust client) finds them;
--purge removes them too, unless the Rust client, which shares them, is
installed or an agent still runs. The Rust client's own service, which
install disabled, is left as it is unless --restore-rust-client, which
enables and starts it again: the device goes back to it, paired as it
was.`)
	dryRun := fs.Bool("dry-run", false, "print what would be removed and run, and change nothing")
	purge := fs.Bool("purge", false, "also remove the data directory (key, pairing, spool, history) and the cache")
	restore := fs.Bool("restore-rust-client", false, "enable and start the Rust client's service again, giving the device back to it")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "uninstall", "uninstall takes no arguments")
	}
	s, err := newService(std, *dryRun)
	if err != nil {
		return fail(std, err)
	}
	e, _ := std.environment()
	opts := sandboxOptions(e)
	log := warnLogger(std)
	if !*dryRun {
		// What a killed run left, while the ledger is still there
		// (--purge removes it).
		if _, err := sandbox.RecoverGrants(opts, log); err != nil {
			return fail(std, fmt.Errorf("removing the access entries runs left: %w", err))
		}
	}
	if err := s.Uninstall(context.Background(), service.UninstallOptions{Purge: *purge, RestoreRust: *restore}); err != nil {
		return fail(std, err)
	}
	if *dryRun {
		return exitOK
	}
	// The stopped agent's run, if it was cut short.
	if _, err := sandbox.RecoverGrants(opts, log); err != nil {
		return fail(std, fmt.Errorf("removing the access entries runs left: %w", err))
	}
	if err := sandbox.DeleteContainerProfile(opts); err != nil {
		return fail(std, err)
	}
	return exitOK
}

func runStatus(std stdio, args []string) int {
	fs := newFlagSet("status", std, "Show whether the agent's service is installed, enabled and running, and whether the Rust client's is present.")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "status", "status takes no arguments")
	}
	s, err := newService(std, false)
	if err != nil {
		return fail(std, err)
	}
	st, err := s.Status(context.Background())
	if err != nil {
		return fail(std, err)
	}
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	w := std.out
	fmt.Fprintf(w, "supervisor:  %s\n", st.Supervisor)
	fmt.Fprintf(w, "file:        %s\n", st.File)
	fmt.Fprintf(w, "installed:   %s\n", yes(st.Installed))
	fmt.Fprintf(w, "enabled:     %s\n", yes(st.Enabled))
	running := yes(st.Running)
	if st.Running && st.PID > 0 {
		running += fmt.Sprintf(" (process %d)", st.PID)
	}
	fmt.Fprintf(w, "running:     %s\n", running)
	if st.Running {
		if e, err := std.environment(); err == nil {
			printLiveStatus(w, e.lay, st.PID, time.Now())
		}
	}
	if st.Supervised != "" {
		fmt.Fprintf(w, "supervisor says: %s\n", st.Supervised)
	}
	if st.Restarts > 0 {
		fmt.Fprintf(w, "restarts:    %d since it was last started by hand\n", st.Restarts)
	}
	switch st.Failed {
	case "":
	case "start-limit-hit":
		fmt.Fprintf(w, "failed:      it stopped starting: it failed to stay up too many times in a row (start-limit-hit).\n")
		fmt.Fprintf(w, "             See why: journalctl --user -u metnos-agent -n 50\n")
		fmt.Fprintf(w, "             Then: systemctl --user reset-failed metnos-agent && systemctl --user start metnos-agent\n")
	default:
		fmt.Fprintf(w, "failed:      %s; see journalctl --user -u metnos-agent -n 50\n", st.Failed)
	}
	if st.Linger != "" {
		fmt.Fprintf(w, "linger:      %s\n", st.Linger)
	}
	if st.RustClient != "" {
		fmt.Fprintf(w, "rust client: %s (enabled: %s)\n", st.RustClient, yes(st.RustEnabled))
	} else {
		fmt.Fprintf(w, "rust client: none\n")
	}
	fmt.Fprintf(w, "data:        %s\n", s.DataDir)
	return exitOK
}
