package cli

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"strings"

	"github.com/metnos/agent/agent"
	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/sandbox/egress"
)

// environment is what every command runs with: the configuration, read
// once from the process environment, and the agent's layout computed
// from it. Nothing below the command line reads the environment: each
// command passes these down.
type environment struct {
	cfg config.Config
	lay layout.Layout
	// lim are the owner's limits (limits.toml with the environment's
	// overrides), limErr why the file is refused: every command that
	// builds a policy (run, exec, doctor) fails with it, naming the file.
	lim    config.Limits
	limErr error
}

// readEnvironment reads the configuration from getenv and computes the
// layout on this system. A malformed variable is an error naming it.
func readEnvironment(getenv func(string) string) (environment, error) {
	return withLayout(config.FromEnv(goruntime.GOOS, getenv))
}

// processEnvironment reads the configuration of this process
// ([config.FromProcess]) and computes the layout from it.
func processEnvironment() (environment, error) { return withLayout(config.FromProcess()) }

// withLayout computes the layout from the configuration cfg that
// config read with the error cerr. Where cerr is not nil the command
// fails with it, but the layout, from cfg's folders, is still there for
// run's early update boot.
func withLayout(cfg config.Config, cerr error) (environment, error) {
	lay, err := layout.CurrentWith(cfg.Paths.Getenv)
	if cerr != nil {
		return environment{lay: lay}, cerr
	}
	if err != nil {
		return environment{cfg: cfg}, err
	}
	e := environment{cfg: cfg, lay: lay}
	e.lim, e.limErr = config.LoadLimits(lay.Limits(), lay.Home, cfg)
	return e, nil
}

// environment returns the environment Main read, or reads it now when
// the command was run without Main (a test's in-process run).
func (std stdio) environment() (environment, error) {
	if std.env != nil {
		return std.env.e, std.env.err
	}
	return processEnvironment()
}

// envResult is one reading of the environment, and its error.
type envResult struct {
	e   environment
	err error
}

// deviceHost describes this device to the policy: the home folder and
// the agent's own folders from the layout, the session's sockets from
// the configuration. run, exec and doctor all build their Host here, so
// that they derive the same policy for the same profile.
func deviceHost(e environment, uid int) (policy.Host, error) {
	if e.lay.Home == "" {
		return policy.Host{}, errors.New("sandbox: the home folder is not known: set $HOME")
	}
	if e.limErr != nil {
		return policy.Host{}, e.limErr
	}
	var programs []string
	if goruntime.GOOS == "windows" {
		// Windows has no usual program folders to look code:exec's
		// programs up in: they are where PATH says.
		for _, d := range filepath.SplitList(e.cfg.Path) {
			if filepath.IsAbs(d) {
				programs = append(programs, d)
			}
		}
	}
	allow, err := ownerDests(netListName(e.lim, "network.allow"), e.lim.Network.Allow)
	if err != nil {
		return policy.Host{}, err
	}
	deny, err := ownerDests(netListName(e.lim, "network.deny"), e.lim.Network.Deny)
	if err != nil {
		return policy.Host{}, err
	}
	return policy.Host{
		Never:         e.lim.Never,
		NetAllow:      allow,
		NetDeny:       deny,
		Home:          e.lay.Home,
		UID:           uid,
		RuntimeDir:    e.cfg.Paths.XDGRuntimeDir,
		DBusSession:   e.cfg.DBusSessionBus,
		SSHAuthSock:   e.cfg.SSHAuthSock,
		AgentDataDirs: e.lay.AgentDirs(),
		ProgramDirs:   programs,
	}, nil
}

// netListName names where the owner's network list key comes from,
// for its errors and its entries' Why: the variable that overrides it,
// or the place in limits.toml ("…/limits.toml:4:9 [network] allow").
func netListName(l config.Limits, key string) string {
	for _, s := range l.Settings() {
		if s.Key == key && s.Var != "" {
			return s.Var
		}
	}
	table, k, _ := strings.Cut(key, ".")
	return fmt.Sprintf("%s [%s] %s", l.Where(key), table, k)
}

// ownerDests reads the entries of the owner's network list named name
// (a variable, or the place in limits.toml).
func ownerDests(name string, entries []string) ([]policy.Dest, error) {
	var out []policy.Dest
	for _, s := range entries {
		d, err := policy.ParseOwnerDest(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		d.Why = "owner " + name
		out = append(out, d)
	}
	return out, nil
}

// agentConfig is the agent's configuration from e: its layout, the Host
// of [deviceHost], the sandbox's options and the settings of the
// environment. The caller adds the client, the logger and the rest.
func agentConfig(e environment) (agent.Config, error) {
	host, err := deviceHost(e, os.Getuid())
	if err != nil {
		return agent.Config{}, err
	}
	return agent.Config{
		Layout:           e.lay,
		Host:             host,
		Limits:           e.lim,
		ReloadLimits:     reloadLimits(e),
		Sandbox:          sandboxOptions(e),
		Python:           e.cfg.Python,
		Path:             e.cfg.Path,
		Lang:             e.cfg.Lang,
		MemoryBytes:      e.cfg.ExecMemoryBytes,
		SpoolRetention:   e.cfg.SpoolRetention,
		HistoryRetention: e.cfg.HistoryRetention,
		JournalRetention: e.cfg.JournalRetention,
		AuditRetention:   e.cfg.AuditRetention,
		HistoryQuota:     e.cfg.HistoryQuotaBytes,
		BytecodeOff:      e.cfg.BytecodeOff,
	}, nil
}

// reloadLimits reads the owner's limits file of e again, with the
// environment's overrides, and the Host they make: what `run` does when
// the file changes while it runs.
func reloadLimits(e environment) func() (config.Limits, policy.Host, error) {
	return func() (config.Limits, policy.Host, error) {
		e.lim, e.limErr = config.LoadLimits(e.lay.Limits(), e.lay.Home, e.cfg)
		if e.limErr != nil {
			return config.Limits{}, policy.Host{}, e.limErr
		}
		host, err := deviceHost(e, os.Getuid())
		return e.lim, host, err
	}
}

// sandboxOptions are the sandbox's settings from the configuration and
// the layout: METNOS_SANDBOX, METNOS_BWRAP (else bwrap on PATH),
// METNOS_SHIM (else metnos-shim beside metnos-agent) and the layout's
// placeholder locks.
func sandboxOptions(e environment) sandbox.Options {
	return sandbox.Options{
		Disabled:       e.cfg.SandboxDisabled,
		Bwrap:          e.cfg.Bwrap,
		SearchPath:     e.cfg.Path,
		Shim:           shimPath(e.cfg.Shim),
		LockDir:        e.lay.PlaceholderLocks(os.Getuid(), os.TempDir()),
		EgressResolver: egress.ResolverAt(e.cfg.EgressDNS),
		DryRunScratch:  e.cfg.DryRunScratch,
		StrictEgress:   e.cfg.NetStrict,
		NoAppContainer: e.cfg.AppContainerOff,
		GrantLedger:    e.lay.SandboxGrants(),
		// Executors run below the owner's programs unless the owner's
		// file says otherwise.
		Priority: agent.PriorityOf(e.lim),
	}
}

// shimPath is the sandbox shim: given (METNOS_SHIM) when set, else
// metnos-shim next to this executable when this is metnos-agent (the
// lean shim of a release), else "" (the sandbox runs this executable as
// its shim).
func shimPath(given string) string {
	if given != "" || goruntime.GOOS != "linux" {
		return given
	}
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	sib, ok := strings.CutSuffix(self, "metnos-agent")
	if !ok {
		return ""
	}
	sib += "metnos-shim"
	if fi, err := os.Stat(sib); err == nil && fi.Mode()&0o111 != 0 && sameBuild(sib) {
		return sib
	}
	return ""
}

// sameBuild reports whether the program at path was built from the same
// source as this one: the same Go, module version and VCS revision,
// time and changes flag (their dependencies differ: the shim links
// fewer). A self-update
// replaces metnos-agent alone, so a metnos-shim left beside it from
// another release is not used (the agent is then its own shim, a little
// slower to start) rather than trusted to speak the agent's protocol.
func sameBuild(path string) bool {
	self, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	other, err := buildinfo.ReadFile(path)
	if err != nil {
		return false
	}
	return buildKey(self) == buildKey(other)
}

// buildKey is what sameBuild compares of a program's build information.
func buildKey(bi *debug.BuildInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s@%s", bi.GoVersion, bi.Main.Path, bi.Main.Version)
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision", "vcs.modified", "vcs.time":
			fmt.Fprintf(&b, " %s=%s", s.Key, s.Value)
		case "-ldflags":
			// Releases stamp the commit into both programs (the shim
			// records it, unused), which holds without VCS stamping.
			for _, f := range strings.Fields(s.Value) {
				if c, ok := strings.CutPrefix(f, "github.com/metnos/agent/cmd/metnos-agent/cli.Commit="); ok {
					fmt.Fprintf(&b, " commit=%s", c)
				}
			}
		}
	}
	return b.String()
}

// findPython is the interpreter the agent would give executors here:
// [agent.FindPython] with the Host of [deviceHost], so that an
// interpreter the sandbox hides is skipped as `run` skips it (none is
// skipped when the sandbox is off).
func findPython(e environment) (agent.Python, error) {
	host, err := deviceHost(e, os.Getuid())
	if err != nil || e.cfg.SandboxDisabled != "" {
		host = policy.Host{}
	}
	return agent.FindPython(e.lay, host, e.cfg.Python, e.cfg.Path)
}
