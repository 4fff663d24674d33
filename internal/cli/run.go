package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/metnos/agent/agent"
	"github.com/metnos/agent/platform"
	"github.com/metnos/agent/sandbox"
)

// exitLocked is the status when another agent already runs (§9.2).
const exitLocked = 3

func runRun(std stdio, args []string) int {
	fs := newFlagSet("run", std.err, "Serve the paired server: long-poll for invocations, run each in the sandbox, send back the results. Stops on SIGINT or SIGTERM.")
	server := fs.String("server", "", "the server URL (default: the one paired with)")
	var minSandbox levelFlag
	fs.Var(&minSandbox, "min-sandbox", "refuse any executor run weaker than this (none, contained, isolated, full)")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	data, cache, err := dirs()
	if err != nil {
		return fail(std, err)
	}
	lock, err := platform.Lock(filepath.Join(data, "client.lock"))
	if errors.Is(err, platform.ErrLocked) {
		fmt.Fprintf(std.err, "metnos-agent: another agent is already running for this user: %v\n", err)
		return exitLocked
	}
	if err != nil {
		return fail(std, err)
	}
	defer lock.Release()
	logf, err := platform.OpenLog(filepath.Join(data, "client.log"))
	if err != nil {
		return fail(std, err)
	}
	defer logf.Close()
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv("METNOS_LOG"))); err != nil {
		level = slog.LevelInfo
	}
	log := platform.Logger(logf, std.err, level)
	a, err := agent.New(agent.Config{
		DataDir: data, CacheDir: cache, ServerURL: *server, Logger: log,
		Version: version(), MinSandbox: sandbox.Level(minSandbox),
	})
	if err != nil {
		log.Error("cannot start", "err", err)
		return exitFailure
	}
	defer a.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := a.Run(ctx); err != nil {
		log.Error("stopped", "err", err)
		return exitFailure
	}
	return exitOK
}
