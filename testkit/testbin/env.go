package testbin

import (
	"errors"
	"os"
	"runtime"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/sandbox/egress"
)

// SandboxOptions are the sandbox.Options the agent's command line would
// pass in this process's environment, as a test set it (t.Setenv of
// METNOS_SANDBOX, METNOS_BWRAP, METNOS_SHIM, PATH): for the tests that
// call the sandbox in-process. A test helper may read the environment;
// the libraries may not. A malformed variable fails the caller's test
// through panic, as a test's setup mistake.
func SandboxOptions() sandbox.Options {
	cfg, lay := current()
	return sandbox.Options{
		Disabled:       cfg.SandboxDisabled,
		Bwrap:          cfg.Bwrap,
		SearchPath:     cfg.Path,
		Shim:           cfg.Shim,
		LockDir:        lay.PlaceholderLocks(os.Getuid(), os.TempDir()),
		EgressResolver: egress.ResolverAt(cfg.EgressDNS),
		StrictEgress:   cfg.NetStrict,
	}
}

// Host is the policy.Host the agent's command line would build in this
// process's environment: the home folder and the agent's folders of its
// layout, the session's sockets.
func Host() (policy.Host, error) {
	cfg, lay := current()
	if lay.Home == "" {
		return policy.Host{}, errors.New("testbin: the home folder is not known")
	}
	return policy.Host{
		Home:          lay.Home,
		UID:           os.Getuid(),
		RuntimeDir:    cfg.Paths.XDGRuntimeDir,
		DBusSession:   cfg.DBusSessionBus,
		SSHAuthSock:   cfg.SSHAuthSock,
		AgentDataDirs: lay.AgentDirs(),
	}, nil
}

// current reads the configuration and the layout from the environment.
func current() (config.Config, layout.Layout) {
	cfg, err := config.FromEnv(runtime.GOOS, os.Getenv)
	if err != nil {
		panic(err)
	}
	lay, err := layout.CurrentWith(cfg.Paths.Getenv)
	if err != nil {
		panic(err)
	}
	return cfg, lay
}
