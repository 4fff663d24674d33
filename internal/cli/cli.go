// Package cli implements the metnos-agent command line: a small map of
// subcommands, each parsing its own flags with the standard flag package.
// cmd/metnos-agent only calls [Main].
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	goruntime "runtime"
	"runtime/debug"
	"sort"
	"strings"
)

// Version is the agent's version, set at build time with
//
//	-ldflags "-X github.com/metnos/agent/internal/cli.Version=v1.2.3"
//
// When it is left at "dev", the module version recorded in the binary
// (go install ...@v1.2.3) is used instead, if there is one.
var Version = "dev"

// Commit is the source revision the agent was built from, set at build
// time (by goreleaser) with
//
//	-ldflags "-X github.com/metnos/agent/internal/cli.Commit=abc1234"
//
// When it is empty, the VCS revision recorded by the go command is
// used, with "+dirty" when the tree had changes; "unknown" without one.
var Commit = ""

// Exit statuses of the agent itself; a command run by exec passes its
// own status through.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitTimeout = 124 // as timeout(1)
	exitAgent   = 125 // as timeout(1) and env(1): the agent failed, or the sandbox refused
)

// stdio is where a command reads and writes, and the environment it
// runs with; tests may swap it.
type stdio struct {
	in       *os.File
	out, err io.Writer
	// env is the environment Main read once; nil: read it when a
	// command asks (see stdio.environment).
	env *envResult
}

// command is one subcommand.
type command struct {
	// usage is the synopsis after "metnos-agent ".
	usage string
	// short is the one-line description shown in the command list.
	short string
	// run runs the command on its arguments and returns the exit status.
	run func(std stdio, args []string) int
}

var commands map[string]*command

func init() {
	// Assigned in init: help refers to commands.
	commands = map[string]*command{
		"audit": {
			usage: "audit verify [--json]",
			short: "check the local audit log for edited, removed or reordered lines",
			run:   runAudit,
		},
		"demo": {
			usage: "demo [--keep] [-v]",
			short: "run the whole chain on loopback: server, pairing, three executors, undo",
			run:   runDemo,
		},
		"doctor": {
			usage: "doctor [--json]",
			short: "report what sandbox this machine can give each profile",
			run:   runDoctor,
		},
		"exec": {
			usage: "exec [flags] [--] COMMAND [ARG...]",
			short: "run a command in the sandbox",
			run:   runExec,
		},
		"history": {
			usage: "history [--json] [-n N]",
			short: "show the changes executors made on this device, and what undo would do",
			run:   runHistory,
		},
		"undo": {
			usage: "undo (INVOCATION_ID | --last) [--dry-run] [--offline]",
			short: "put a change back on this device, without the server",
			run:   runUndo,
		},
		"register": {
			usage: "register --server URL --token TOKEN [--name NAME]",
			short: "pair this device with a Metnos server",
			run:   runRegister,
		},
		"whoami": {
			usage: "whoami",
			short: "show this device's identity and pairing",
			run:   runWhoami,
		},
		"unpair": {
			usage: "unpair",
			short: "forget the pairing (the device key stays)",
			run:   runUnpair,
		},
		"runtime": {
			usage: "runtime install (--url URL --sha256 HEX [--size N] | --from-server NAME) | runtime status [--json]",
			short: "install or show the standalone Python executors run with",
			run:   runRuntime,
		},
		"run": {
			usage: "run [--server URL] [--min-sandbox LEVEL]",
			short: "serve the paired server: poll, run invocations in the sandbox, send results",
			run:   runRun,
		},
		"fetch": {
			usage: "fetch URL --sha256 HEX -o FILE [--size N]",
			short: "download a file in resumable chunks, installed only if it matches its pin",
			run:   runFetch,
		},
		"install": {
			usage: "install [--dry-run] [--env NAME=VALUE]...",
			short: "install and start the agent as this user's service (taking over from the Rust client)",
			run:   runInstall,
		},
		"uninstall": {
			usage: "uninstall [--dry-run] [--purge]",
			short: "stop and remove the agent's service (--purge: also the key and pairing)",
			run:   runUninstall,
		},
		"status": {
			usage: "status",
			short: "show whether the agent's service is installed, enabled and running",
			run:   runStatus,
		},
		"help": {
			usage: "help [COMMAND]",
			short: "show help for a command",
			run:   runHelp,
		},
		"version": {
			usage: "version",
			short: "print the agent's version, commit, Go version and target",
			run:   runVersion,
		},
	}
}

// Main runs the metnos-agent command line on args (without the program
// name) and returns the process exit status.
//
// It reads the environment once, here: a variable that is not valid
// makes every command that needs the configuration fail, naming it;
// a value replaced by its default is logged as a warning.
func Main(args []string) int {
	e, err := readEnvironment(os.Getenv)
	level := slog.LevelWarn // a command's stderr carries only what needs attention...
	if e.cfg.LogLevelSet {
		level = e.cfg.LogLevel // ...unless METNOS_LOG says otherwise
	}
	setupLogging(os.Stderr, level)
	for _, w := range e.cfg.Warnings {
		slog.Warn(w)
	}
	return run(stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr, env: &envResult{e, err}}, args)
}

func run(std stdio, args []string) int {
	if len(args) == 0 {
		usage(std.err)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		usage(std.out)
		return exitOK
	case "-v", "-version", "--version":
		name = "version"
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(std.err, "metnos-agent: unknown command %q\n\n", name)
		usage(std.err)
		return exitUsage
	}
	return cmd.run(std, args[1:])
}

// usage writes the agent's synopsis and command list to w.
func usage(w io.Writer) {
	fmt.Fprint(w, "metnos-agent is the Metnos device agent: it runs commands in the strongest\n")
	fmt.Fprint(w, "sandbox this machine offers.\n\n")
	fmt.Fprint(w, "Usage:\n\n\tmetnos-agent <command> [arguments]\n\nThe commands are:\n\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "\t%-10s %s\n", n, commands[n].short)
	}
	fmt.Fprint(w, "\nUse \"metnos-agent help <command>\" for more about a command.\n")
}

// newFlagSet returns the flag set of a subcommand, printing its usage
// and then help (the flag descriptions follow) to w on errors and -h.
func newFlagSet(name string, w io.Writer, help string) *flag.FlagSet {
	fs := flag.NewFlagSet("metnos-agent "+name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Usage = func() {
		fmt.Fprintf(w, "usage: metnos-agent %s\n", commands[name].usage)
		if help != "" {
			fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(help))
		}
		var hasFlags bool
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprint(w, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses args into fs. It returns the exit status to return
// at once when parsing ends the command: 0 for -h, 2 for a bad flag.
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		return exitOK, true
	}
	return exitUsage, true // flag has printed the error and the usage
}

// usageError prints "metnos-agent: msg" and the command's synopsis, and
// returns the usage exit status.
func usageError(w io.Writer, name, format string, args ...any) int {
	fmt.Fprintf(w, "metnos-agent: "+format+"\n", args...)
	fmt.Fprintf(w, "usage: metnos-agent %s\n", commands[name].usage)
	fmt.Fprintf(w, "Run \"metnos-agent help %s\" for details.\n", name)
	return exitUsage
}

func runHelp(std stdio, args []string) int {
	switch len(args) {
	case 0:
		usage(std.out)
		return exitOK
	case 1:
	default:
		fmt.Fprint(std.err, "metnos-agent: help takes at most one command\n")
		return exitUsage
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(std.err, "metnos-agent: unknown command %q; run \"metnos-agent help\" for the list\n", args[0])
		return exitUsage
	}
	// Every command prints its full help on -h.
	return cmd.run(stdio{in: std.in, out: std.out, err: std.out, env: std.env}, []string{"-h"})
}

func runVersion(std stdio, args []string) int {
	fs := newFlagSet("version", std.err, "Print the agent's version, the commit it was built from, the Go version and the target (GOOS/GOARCH).")
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "version", "version takes no arguments")
	}
	fmt.Fprintf(std.out, "metnos-agent %s\ncommit %s\n%s %s/%s\n", version(), commit(), goruntime.Version(), goruntime.GOOS, goruntime.GOARCH)
	return exitOK
}

// commit returns Commit, or the VCS revision in the build information
// ("+dirty" when modified), or "unknown".
func commit() string {
	if Commit != "" {
		return Commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return "unknown"
	}
	return rev + dirty
}

// version returns Version, or the module version from the build
// information when Version was not set.
func version() string {
	if Version != "dev" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return Version
}

// setupLogging sends log/slog records to w, from level on (METNOS_LOG;
// warn when it is unset, so that a command's own output stays clean).
func setupLogging(w io.Writer, level slog.Level) {
	slog.SetDefault(slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})))
}
