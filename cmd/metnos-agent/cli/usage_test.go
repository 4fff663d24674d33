package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/metnos/agent/testkit/golden"
)

// runCLI runs the command line on args with a fresh HOME and returns its
// exit status, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("XDG_DATA_HOME", filepath.Join(home, ".local", "share"))
	t.Setenv("XDG_STATE_HOME", filepath.Join(home, ".local", "state"))
	t.Setenv("XDG_CACHE_HOME", filepath.Join(home, ".cache"))
	var out, errb bytes.Buffer
	code := run(stdio{in: os.Stdin, out: &out, err: &errb}, args)
	return code, out.String(), errb.String()
}

// subcommand is what comes before a command's flags: "runtime install",
// "audit verify".
func subcommand(name string) []string {
	switch name {
	case "runtime":
		return []string{"runtime", "install"}
	case "audit":
		return []string{"audit", "verify"}
	}
	return []string{name}
}

// TestHelpEveryCommand: "CMD --help", "CMD -h" and "help CMD" exit 0,
// print the same help on stdout and nothing on stderr, begin with the
// command's synopsis, show flags as the synopses write them, and fit in
// 80 columns.
func TestHelpEveryCommand(t *testing.T) {
	names := []string{""}
	for n := range commands {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		forms := [][]string{{"help", name}, {name, "--help"}, {name, "-h"}}
		if name == "" {
			forms = [][]string{{"help"}, {"--help"}, {"-h"}}
		}
		var first string
		for _, args := range forms {
			args = slices.DeleteFunc(args, func(s string) bool { return s == "" })
			code, out, errs := runCLI(t, args...)
			if code != 0 || errs != "" || out == "" {
				t.Errorf("%q: exit %d, stdout %d bytes, stderr %q; want exit 0, the help on stdout and nothing on stderr", args, code, len(out), errs)
				continue
			}
			if first == "" {
				first = out
			} else if out != first {
				t.Errorf("%q prints another help than %q:\n%s\n---\n%s", args, forms[0], out, first)
			}
			if name != "" && !strings.HasPrefix(out, "usage: metnos-agent "+name) {
				t.Errorf("%q: the help does not begin with the synopsis:\n%s", args, out)
			}
			for i, l := range strings.Split(out, "\n") {
				if n := utf8.RuneCountInString(l); n > helpWidth {
					t.Errorf("%q: line %d is %d columns wide (more than %d): %q", args, i+1, n, helpWidth, l)
				}
			}
			for _, l := range strings.Split(out, "\n") {
				// "-name" for a long flag, where the synopses write --name.
				if f := strings.Fields(l); strings.HasPrefix(l, "  -") && !strings.HasPrefix(f[0], "--") && len(f[0]) != 2 {
					t.Errorf("%q: flag shown single-dash: %q", args, l)
				}
			}
		}
	}
}

// TestUsageErrorsAreOneLine: a stray argument and a bad flag value exit
// 2 with one line on stderr that says what is wrong and where the help
// is, and nothing on stdout.
func TestUsageErrorsAreOneLine(t *testing.T) {
	// A flag each command has, with a value it cannot take.
	badFlag := map[string][]string{
		"audit":     {"--json=maybe"},
		"demo":      {"--keep=maybe"},
		"doctor":    {"--json=maybe"},
		"exec":      {"--memory", "lots", "--", "true"},
		"fetch":     {"http://127.0.0.1:1/f", "--size", "many"},
		"help":      {"--nosuchflag"},
		"history":   {"-n", "three"},
		"install":   {"--dry-run=maybe"},
		"register":  {"--nosuchflag"},
		"run":       {"--min-sandbox", "strong"},
		"runtime":   {"--size", "big"},
		"status":    {"--nosuchflag"},
		"undo":      {"--last", "--offline=maybe"},
		"uninstall": {"--purge=maybe"},
		"unpair":    {"--nosuchflag"},
		"version":   {"--nosuchflag"},
		"whoami":    {"--nosuchflag"},
	}
	// Arguments one too many for each command (exec takes any).
	stray := map[string][]string{
		"fetch": {"http://127.0.0.1:1/f", "extra", "--sha256", strings.Repeat("0", 64), "-o", "f"},
		"help":  {"run", "extra"},
		"undo":  {"inv-1", "extra"},
	}
	for name, cmd := range commands {
		bad, ok := badFlag[name]
		if !ok {
			bad = []string{"--nosuchflag"} // a command added since: an unknown flag at least
		}
		cases := map[string][]string{"bad flag": append(subcommand(name), bad...)}
		if cmd.maxArgs >= 0 {
			s, ok := stray[name]
			if !ok {
				s = []string{"extra"}
			}
			cases["stray argument"] = append(subcommand(name), s...)
		}
		for what, args := range cases {
			code, out, errs := runCLI(t, args...)
			if code != exitUsage || out != "" || strings.Count(errs, "\n") != 1 ||
				!strings.HasPrefix(errs, "metnos-agent: ") || !strings.Contains(errs, `see "metnos-agent help `+name+`"`) {
				t.Errorf("%s %q: exit %d, stdout %q, stderr:\n%s\nwant exit 2, one line on stderr naming \"metnos-agent help %s\"", what, args, code, out, errs, name)
			}
			// The user typed --flag: the message says --flag, in words.
			for _, raw := range []string{" -nosuchflag", "provided but not defined", "parse error", " -json", " -keep", " -memory"} {
				if strings.Contains(errs, raw) {
					t.Errorf("%s %q: %q says %q", what, args, errs, raw)
				}
			}
		}
	}
}

// TestUnknownCommandIsOneLine: a mistyped command gets one line that
// says where the list is, not the list.
func TestUnknownCommandIsOneLine(t *testing.T) {
	code, out, errs := runCLI(t, "regster\x1b[2J")
	if code != exitUsage || out != "" || strings.Count(errs, "\n") != 1 || strings.Contains(errs, "\x1b") ||
		!strings.Contains(errs, `unknown command "regster\x1b[2J"`) {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestFlagsAnywhere: flags after positional arguments are parsed as
// users type them, "--" ends the flags, and exec keeps everything after
// its COMMAND for the command.
func TestFlagsAnywhere(t *testing.T) {
	for _, tt := range []struct {
		args         []string
		interspersed bool
		pos          string
		x            bool
		o            string
	}{
		{[]string{"ID", "--x"}, true, "ID", true, ""},
		{[]string{"--x", "ID"}, true, "ID", true, ""},
		{[]string{"URL", "-o", "f", "more"}, true, "URL more", false, "f"},
		{[]string{"a", "--", "--x", "-o"}, true, "a --x -o", false, ""},
		{[]string{"-o", "f", "-", "--x"}, true, "-", true, "f"},
		{[]string{"ls", "--x", "-o", "f"}, false, "ls --x -o f", false, ""},
		{[]string{"--x", "--", "ls", "-o"}, false, "ls -o", true, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		x := fs.Bool("x", false, "")
		o := fs.String("o", "", "")
		if err := parseInterspersed(fs, tt.args, tt.interspersed); err != nil {
			t.Errorf("%q: %v", tt.args, err)
			continue
		}
		if got := strings.Join(fs.Args(), " "); got != tt.pos || *x != tt.x || *o != tt.o {
			t.Errorf("%q (interspersed %v): args %q, -x %v, -o %q; want %q, %v, %q", tt.args, tt.interspersed, got, *x, *o, tt.pos, tt.x, tt.o)
		}
	}
	// Each command that takes an argument takes its flags after it.
	for _, args := range [][]string{
		{"undo", "inv-none", "--offline", "--dry-run"},
		{"help", "undo", "--help"},
		{"fetch", "http://127.0.0.1:1/f", "--help"},
		{"audit", "verify", "--json"},
		{"history", "-n", "3", "--json"},
	} {
		code, _, errs := runCLI(t, args...)
		if code == exitUsage || strings.Contains(errs, "see \"metnos-agent help") {
			t.Errorf("%q: exit %d, a usage error: %s", args, code, errs)
		}
	}
}

// TestHelpGolden: the command list and the help of fetch, runtime and pair,
// as a user reads them.
func TestHelpGolden(t *testing.T) {
	for name, args := range map[string][]string{
		"commands": {"help"},
		"fetch":    {"help", "fetch"},
		"runtime":  {"help", "runtime"},
		"pair":     {"help", "pair"},
	} {
		code, out, errs := runCLI(t, args...)
		if code != 0 || errs != "" {
			t.Errorf("%q: exit %d, stderr %q", args, code, errs)
		}
		golden.Compare(t, filepath.Join("testdata", "help", name+".golden"), []byte(out))
	}
}

// TestWrap: a line that fits is left as it is (its spacing too); a
// longer one breaks at spaces, the rest under indent; a word wider than
// the line stays whole.
func TestWrap(t *testing.T) {
	long := strings.Repeat("word ", 30)
	for _, tt := range []struct{ in, indent, want string }{
		{"    run        serve", "  ", "    run        serve"},
		{strings.Repeat("x", 100), "  ", strings.Repeat("x", 100)},
		{"  " + strings.Repeat("é", 78) + " next", "    ", "  " + strings.Repeat("é", 78) + "\n    next"},
	} {
		if got := wrap(tt.in, tt.indent); got != tt.want {
			t.Errorf("wrap(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	got := wrap(long, "  ")
	for _, l := range strings.Split(got, "\n") {
		if n := utf8.RuneCountInString(l); n > helpWidth || n < helpWidth-6 && !strings.HasSuffix(got, l) {
			t.Errorf("line of %d columns: %q", n, l)
		}
	}
	if strings.Join(strings.Fields(got), " ") != strings.TrimSpace(long) {
		t.Errorf("words lost: %q", got)
	}
}

// TestValuesOutOfRange: values a flag's type accepts but the command
// cannot use are usage errors, said in one line.
func TestValuesOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"history", "-n", "-1"}, "-n -1: give how many entries to show, or 0 for all"},
		{[]string{"register", "--server", "http://127.0.0.1:1", "--token", "DEV.x.y", "--name", strings.Repeat("a", 65)}, "--name is 65 characters long: a device name has at most 64"},
	} {
		code, out, errs := runCLI(t, tc.args...)
		if code != exitUsage || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errs, tc.want)
		}
	}
}
