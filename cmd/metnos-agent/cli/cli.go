// Package cli implements the metnos-agent command line: a small map of
// subcommands, each parsing its own flags with the standard flag package.
// cmd/metnos-agent only calls [Main].
package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	goruntime "runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/metnos/agent/internal/term"
)

// Version is the agent's version, set at build time with
//
//	-ldflags "-X github.com/metnos/agent/cmd/metnos-agent/cli.Version=v1.2.3"
//
// When it is left at "dev", the module version recorded in the binary
// (go install ...@v1.2.3) is used instead, if there is one.
var Version = "dev"

// Commit is the source revision the agent was built from, set at build
// time (by goreleaser) with
//
//	-ldflags "-X github.com/metnos/agent/cmd/metnos-agent/cli.Commit=abc1234"
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
	// maxArgs is how many positional arguments the command takes after
	// its flags (and its subcommand, for audit and runtime); -1: any,
	// and flags only before the first (exec).
	maxArgs int
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
			usage:   "exec [flags] [--] COMMAND [ARG...]",
			short:   "run a command in the sandbox",
			maxArgs: -1,
			run:     runExec,
		},
		"history": {
			usage: "history [--json] [-n N]",
			short: "show the changes executors made on this device, and what undo would do",
			run:   runHistory,
		},
		"limits": {
			usage: "limits [--json]\nlimits edit",
			short: "show the device owner's limits in force (limits.toml), or edit them",
			run:   runLimits,
		},
		"undo": {
			usage:   "undo (INVOCATION_ID | --last) [--dry-run] [--offline]",
			short:   "put a change back on this device, without the server",
			maxArgs: 1,
			run:     runUndo,
		},
		"register": {
			usage: "register --server URL --token TOKEN [--name NAME]",
			short: "pair this device with a Metnos server",
			run:   runRegister,
		},
		"pair": {
			usage:   "pair LINK [--install] [--name NAME] [--force]",
			short:   "pair this device from the join link (or one-liner) the admin sent",
			maxArgs: 1,
			run:     runPair,
		},
		"whoami": {
			usage: "whoami",
			short: "show this device's identity and pairing",
			run:   runWhoami,
		},
		"update": {
			usage: "update [--check]",
			short: "update this agent from the paired server now (or only --check)",
			run:   runUpdate,
		},
		"unpair": {
			usage: "unpair",
			short: "forget the pairing (the device key stays)",
			run:   runUnpair,
		},
		"runtime": {
			usage: "runtime install (--url URL|FILE --sha256 HEX [--size N] | --from-server NAME)\nruntime status [--json]",
			short: "install or show the standalone Python executors run with",
			run:   runRuntime,
		},
		"run": {
			usage: "run [--server URL] [--min-sandbox LEVEL] [--wait]",
			short: "serve the paired server: poll, run invocations in the sandbox, send results",
			run:   runRun,
		},
		"fetch": {
			usage:   "fetch URL --sha256 HEX -o (FILE|FOLDER) [--size N]",
			short:   "download a file in resumable chunks, installed only if it matches its pin",
			maxArgs: 1,
			run:     runFetch,
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
			usage:   "help [COMMAND]",
			short:   "show help for a command",
			maxArgs: 1,
			run:     runHelp,
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
	e, err := processEnvironment()
	level := slog.LevelWarn // a command's stderr carries only what needs attention...
	if e.cfg.LogLevelSet {
		level = e.cfg.LogLevel // ...unless METNOS_LOG says otherwise
	}
	std := stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr, env: &envResult{e, err}}
	setupLogging(stderrOf(std), level)
	for _, w := range e.cfg.Warnings {
		slog.Warn(w)
	}
	return run(std, args)
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
		fmt.Fprintf(std.err, "metnos-agent: unknown command %s; run \"metnos-agent help\" for the list\n", quoted(name))
		return exitUsage
	}
	return cmd.run(std, args[1:])
}

// usage writes the agent's synopsis and command list to w.
func usage(w io.Writer) {
	fmt.Fprint(w, "metnos-agent is the Metnos device agent: it runs commands in the strongest\n")
	fmt.Fprint(w, "sandbox this machine offers.\n\n")
	fmt.Fprint(w, "Usage:\n\n    metnos-agent <command> [arguments]\n\nThe commands are:\n\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintln(w, wrap(fmt.Sprintf("    %-10s %s", n, commands[n].short), strings.Repeat(" ", 15)))
	}
	fmt.Fprint(w, "\nUse \"metnos-agent help <command>\" for more about a command.\n")
}

// helpWidth is the width help texts are wrapped at.
const helpWidth = 80

// flagSink is a flag set's output: it keeps what package flag writes
// (parseFlags says it in one line of its own) and where help and errors
// go.
type flagSink struct {
	name, help string
	std        stdio
	buf        bytes.Buffer
}

func (s *flagSink) Write(p []byte) (int, error) { return s.buf.Write(p) }

// newFlagSet returns the flag set of a subcommand. [parseFlags] prints
// its help (the synopsis, help and the flags) to std.out on -h and
// --help, and one line to std.err on a bad flag.
func newFlagSet(name string, std stdio, help string) *flag.FlagSet {
	fs := flag.NewFlagSet("metnos-agent "+name, flag.ContinueOnError)
	fs.SetOutput(&flagSink{name: name, help: help, std: std})
	fs.Usage = func() {} // parseFlags prints what is needed
	return fs
}

// commandHelp writes the help of command name, whose flags are fs, to
// w, wrapped at helpWidth columns.
func commandHelp(w io.Writer, name, help string, fs *flag.FlagSet) {
	var b strings.Builder
	for i, u := range strings.Split(commands[name].usage, "\n") {
		lead := "usage: "
		if i > 0 {
			lead = "       "
		}
		b.WriteString(wrap(lead+"metnos-agent "+u, "           "))
		b.WriteString("\n")
	}
	if help = strings.TrimSpace(help); help != "" {
		b.WriteString("\n")
		for _, l := range strings.Split(help, "\n") {
			b.WriteString(wrap(l, leadingSpace(l)))
			b.WriteString("\n")
		}
	}
	var hasFlags bool
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		b.WriteString("\nFlags:\n")
		fs.VisitAll(func(f *flag.Flag) {
			arg, text := flag.UnquoteUsage(f)
			dash := "--"
			if len(f.Name) == 1 {
				dash = "-" // as the synopses write them: -o FILE, -n N
			}
			b.WriteString("  " + dash + f.Name)
			if arg != "" {
				b.WriteString(" " + arg)
			}
			b.WriteString("\n")
			if !isZeroDefault(f) && !strings.Contains(text, "default") {
				if fmt.Sprintf("%T", f.Value) == "*flag.stringValue" {
					text += fmt.Sprintf(" (default %q)", f.DefValue)
				} else {
					text += fmt.Sprintf(" (default %s)", f.DefValue)
				}
			}
			b.WriteString(wrap("        "+text, "        "))
			b.WriteString("\n")
		})
	}
	io.WriteString(w, b.String())
}

// isZeroDefault reports whether f's default is its type's zero value,
// which the help does not show.
func isZeroDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "0", "false", "0s", "[]":
		return true
	}
	return false
}

// leadingSpace returns the spaces and tabs s begins with.
func leadingSpace(s string) string {
	return s[:len(s)-len(strings.TrimLeft(s, " \t"))]
}

// wrap breaks line at spaces so that no line is wider than helpWidth
// columns (a single word wider than that stays whole); lines after the
// first begin with indent. A line that fits is left as it is.
func wrap(line, indent string) string {
	var b strings.Builder
	for utf8.RuneCountInString(line) > helpWidth {
		lead := len(leadingSpace(line))
		cut, col := -1, 0 // col: the runes before line[i]
		for i, r := range line {
			if r == ' ' && i > lead {
				if col <= helpWidth || cut < 0 {
					cut = i
				}
				if col > helpWidth {
					break
				}
			}
			col++
		}
		if cut < 0 {
			break // one word wider than the line
		}
		b.WriteString(strings.TrimRight(line[:cut], " ") + "\n")
		line = indent + strings.TrimLeft(line[cut:], " ")
	}
	b.WriteString(line)
	return b.String()
}

// parseFlags parses args into fs, accepting flags before and after the
// positional arguments, as users type them ("undo ID --offline"); "--"
// ends the flags. Afterwards fs.Args() are the positional arguments. The
// command exec, whose arguments after its COMMAND are that command's,
// takes flags only before it.
//
// It returns the exit status to return at once when parsing ends the
// command: 0 after printing the help for -h or --help, 2 after a one-line
// error for a bad flag or an unexpected argument.
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	sink, ok := fs.Output().(*flagSink)
	if !ok || commands[sink.name] == nil {
		panic("parseFlags: " + fs.Name() + " was not made by newFlagSet for a command")
	}
	cmd := commands[sink.name]
	err := parseInterspersed(fs, args, cmd.maxArgs >= 0)
	switch {
	case errors.Is(err, flag.ErrHelp):
		commandHelp(sink.std.out, sink.name, sink.help, fs)
		return exitOK, true
	case err != nil:
		return usageError(sink.std.err, sink.name, "%s", flagError(err)), true
	case cmd.maxArgs >= 0 && fs.NArg() > cmd.maxArgs:
		return usageError(sink.std.err, sink.name, "unexpected argument %q to %s", fs.Arg(cmd.maxArgs), sink.name), true
	}
	return 0, false
}

// parseInterspersed parses args into fs, and when interspersed, goes on
// past each positional argument until "--"; fs.Args() are then all the
// positional arguments, in order.
func parseInterspersed(fs *flag.FlagSet, args []string, interspersed bool) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		used := args[:len(args)-len(rest)]
		if !interspersed || (len(used) > 0 && used[len(used)-1] == "--") {
			pos = append(pos, rest...)
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	// Flags already set stay set: this only makes pos fs.Args().
	return fs.Parse(append([]string{"--"}, pos...))
}

// usageError prints one line, "metnos-agent: msg", and where to read
// more, and returns the usage exit status.
// goFlagName matches a flag as package flag's errors name it, with one
// dash, and the words before it.
var goFlagName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(flag provided but not defined: |flag needs an argument: |for flag |for )-([A-Za-z0-9][A-Za-z0-9_.-]*)`)
})

// flagError says a parse error of package flag the way the help shows
// flags: --name (a one-letter flag keeps its one dash, as the synopses
// write it), "unknown flag" for one that is not defined, and the user's
// text sanitised.
func flagError(err error) string {
	msg := goFlagName().ReplaceAllStringFunc(err.Error(), func(m string) string {
		sub := goFlagName().FindStringSubmatch(m)
		name := "-" + sub[2]
		if len(sub[2]) > 1 {
			name = "--" + sub[2]
		}
		switch sub[1] {
		case "flag provided but not defined: ":
			return "unknown flag " + name
		case "flag needs an argument: ":
			return name + " needs a value"
		}
		return sub[1] + name
	})
	switch {
	case strings.HasPrefix(msg, "invalid boolean value") && strings.HasSuffix(msg, ": parse error"):
		msg = strings.TrimSuffix(msg, ": parse error") + ": give true or false, or the flag alone"
	case strings.HasSuffix(msg, ": parse error"):
		msg = strings.TrimSuffix(msg, ": parse error") + ": not a number"
	case strings.HasSuffix(msg, ": value out of range"):
		msg = strings.TrimSuffix(msg, ": value out of range") + ": too large"
	}
	return term.Sanitize(msg)
}

// quoted is s in double quotes, sanitised for the terminal.
func quoted(s string) string { return `"` + term.Sanitize(s) + `"` }

func usageError(w io.Writer, name, format string, args ...any) int {
	fmt.Fprintf(w, "metnos-agent: %s; see \"metnos-agent help %s\"\n", fmt.Sprintf(format, args...), name)
	return exitUsage
}

func runHelp(std stdio, args []string) int {
	fs := newFlagSet("help", std, "Show the list of commands, or the help of COMMAND: its synopsis, what it does and its flags. \"metnos-agent COMMAND --help\" shows the same.")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() == 0 {
		usage(std.out)
		return exitOK
	}
	cmd, ok := commands[fs.Arg(0)]
	if !ok {
		fmt.Fprintf(std.err, "metnos-agent: unknown command %q; run \"metnos-agent help\" for the list\n", fs.Arg(0))
		return exitUsage
	}
	// Every command prints its full help on -h.
	return cmd.run(std, []string{"-h"})
}

func runVersion(std stdio, args []string) int {
	fs := newFlagSet("version", std, "Print the agent's version, the commit it was built from, the Go version and the target (GOOS/GOARCH).")
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

// setupLogging sends log/slog records to stderr, from level on
// (METNOS_LOG; warn when it is unset, so that a command's own output
// stays clean).
func setupLogging(stderr stderrLog, level slog.Level) {
	slog.SetDefault(stderr.logger(level))
}
