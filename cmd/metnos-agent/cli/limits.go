package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"text/tabwriter"

	xterm "golang.org/x/term"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/term"
)

const limitsHelp = `
Limits shows the device owner's limits in force: the limits file
(limits.toml in the agent's configuration folder), whether it is in
force, and each setting with where it came from: the file (and where in
it), an environment variable that overrides it, or the default.

The file says which folders no executor may read or write (never), the
mode (full, supervised, readonly or preview), the network every run may
reach or not ([network]), the executors that may run ([executors]) and
how much of the machine a run may take ([priority]). No invocation can
change it: executors never see its folder. A file another user could
have written (not yours, or writable by the group or others, it or its
folder) is refused, and so is one with an unknown key or a wrong value:
run then refuses to start, and a running agent keeps the limits it had.
A running agent notices a change within a poll and records it in its
audit log (history shows it). See docs/limits.md.

Limits edit opens the file in $VISUAL, else $EDITOR, else the system's
editor (creating it, every setting commented out, when there is none),
and checks it when the editor exits: a file that is refused is said, and
never left so silently.

With --json it prints one object: {"file", "present", "in_force",
"error", "sha256", "settings": [{"key", "value", "source", "var", "at"}]}.
`

// limitsReport is what limits --json prints.
type limitsReport struct {
	File     string           `json:"file"`
	Present  bool             `json:"present"`
	InForce  bool             `json:"in_force"`
	Error    string           `json:"error,omitempty"`
	SHA256   string           `json:"sha256,omitempty"`
	Settings []config.Setting `json:"settings"`
}

func runLimits(std stdio, args []string) int {
	if len(args) > 0 && args[0] == "edit" {
		return runLimitsEdit(std, args[1:])
	}
	fs := newFlagSet("limits", std, limitsHelp)
	asJSON := fs.Bool("json", false, "print JSON")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "limits", "unknown subcommand %s (edit)", quoted(fs.Arg(0)))
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	lim := e.lim
	rep := limitsReport{File: e.lay.Limits(), Present: lim.Present, InForce: e.limErr == nil, SHA256: lim.SHA256}
	if e.limErr != nil {
		rep.Error = e.limErr.Error()
		_, statErr := os.Stat(rep.File)
		rep.Present = statErr == nil
		// What is in force for the commands that run anything: nothing,
		// they refuse to; the defaults are shown for the keys.
		lim = config.Limits{File: rep.File}
	}
	rep.Settings = lim.Settings()
	if *asJSON {
		enc := json.NewEncoder(std.out)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(rep); err != nil {
			return fail(std, err)
		}
		if e.limErr != nil {
			return exitFailure
		}
		return exitOK
	}
	switch {
	case rep.File == "":
		fmt.Fprintln(std.out, "limits file  none: the home folder is not known, so there is no configuration folder (the defaults are in force)")
	case e.limErr != nil:
		fmt.Fprintf(std.out, "limits file  %s: REFUSED, not in force (run refuses to start; a running agent keeps the limits it had)\n", rep.File)
	case lim.Present:
		fmt.Fprintf(std.out, "limits file  %s (in force)\n", rep.File)
	default:
		fmt.Fprintf(std.out, "limits file  %s: none, the defaults are in force (metnos-agent limits edit creates it)\n", rep.File)
	}
	if e.limErr != nil {
		return fail(std, fmt.Errorf("%w; fix it with metnos-agent limits edit", e.limErr))
	}
	fmt.Fprintln(std.out)
	tw := tabwriter.NewWriter(std.out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tVALUE\tFROM")
	for _, s := range rep.Settings {
		from := string(s.Source)
		switch {
		case s.Var != "":
			from += " (" + s.Var + ")"
		case s.At != "":
			from += " (" + filepath.Base(s.At) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Key, term.Sanitize(s.Value), term.Sanitize(from))
	}
	tw.Flush()
	return exitOK
}

func runLimitsEdit(std stdio, args []string) int {
	fs := newFlagSet("limits", std, limitsHelp)
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "limits", "limits edit takes no arguments")
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	path := e.lay.Limits()
	if path == "" {
		return fail(std, errors.New("limits: the home folder is not known, so there is no configuration folder to keep limits.toml in: set $HOME"))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fail(std, fmt.Errorf("limits: making the configuration folder: %w", err))
	}
	before, err := os.ReadFile(path)
	switch {
	case errors.Is(err, iofs.ErrNotExist):
		before = nil
		if err := os.WriteFile(path, []byte(config.LimitsTemplate), 0o600); err != nil {
			return fail(std, fmt.Errorf("limits: creating %s: %w", path, err))
		}
		fmt.Fprintf(std.err, "metnos-agent: created %s, every setting commented out\n", path)
	case err != nil:
		return fail(std, fmt.Errorf("limits: reading %s: %w", path, err))
	}
	argv, err := editor(e.cfg.Editor)
	if err != nil {
		return fail(std, err)
	}
	in := std.in
	if in == nil {
		in = os.Stdin
	}
	for {
		cmd := exec.Command(argv[0], append(argv[1:], path)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = in, std.out, std.err
		if err := cmd.Run(); err != nil {
			return fail(std, fmt.Errorf("limits: the editor %s failed: %w; %s is as it left it (metnos-agent limits checks it)", strings.Join(argv, " "), err, path))
		}
		lim, lerr := config.LoadLimits(path, e.lay.Home, e.cfg)
		if lerr == nil {
			printEdited(std, e, path, before, lim)
			return exitOK
		}
		fmt.Fprintf(std.err, "metnos-agent: %s\n", term.SanitizeLines(lerr.Error()))
		if !xterm.IsTerminal(int(in.Fd())) {
			return fail(std, fmt.Errorf("%s is refused as the editor left it: `metnos-agent run` will not start with it, and a running agent keeps the limits it had; fix it with metnos-agent limits edit", path))
		}
		switch ask(std, in, "Edit it again (e), put back the file as it was before (b), or keep it refused (k)? [e] ") {
		case "b":
			if err := putBack(path, before); err != nil {
				return fail(std, err)
			}
			fmt.Fprintf(std.out, "%s is as it was before.\n", path)
			return exitFailure
		case "k":
			return fail(std, fmt.Errorf("%s is kept refused: `metnos-agent run` will not start with it, and a running agent keeps the limits it had", path))
		}
	}
}

// printEdited says what an edit that the agent accepts changed.
func printEdited(std stdio, e environment, path string, before []byte, lim config.Limits) {
	if bytes.Equal(before, lim.Data) {
		fmt.Fprintf(std.out, "%s is unchanged.\n", path)
		return
	}
	var old config.Limits
	if before != nil {
		old, _ = config.ParseLimits(before, path, e.lay.Home)
	}
	changes := config.DiffLimits(old, lim)
	if len(changes) == 0 {
		fmt.Fprintf(std.out, "%s is accepted; no setting changed.\n", path)
		return
	}
	fmt.Fprintf(std.out, "%s is accepted:\n", path)
	for _, c := range changes {
		fmt.Fprintf(std.out, "  %s: %s → %s\n", c.Key, term.Sanitize(c.Old), term.Sanitize(c.New))
	}
	fmt.Fprintln(std.out, "A running agent puts it in force before its next invocation (within a poll) and records the change in its audit log.")
}

// putBack writes the file at path as it was before an edit (before; nil:
// there was none, and the template is removed).
func putBack(path string, before []byte) error {
	if before == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return fmt.Errorf("limits: removing %s: %w", path, err)
		}
		return nil
	}
	if err := os.WriteFile(path, before, 0o600); err != nil {
		return fmt.Errorf("limits: putting %s back: %w", path, err)
	}
	return nil
}

// ask prints question and reads one answer, lower case and trimmed.
func ask(std stdio, in io.Reader, question string) string {
	fmt.Fprint(std.out, question)
	line, _ := bufio.NewReader(in).ReadString('\n')
	return strings.ToLower(strings.TrimSpace(line))
}

// editor is the editor's command line: given (VISUAL or EDITOR, split
// at spaces), else the system's: notepad on Windows, vi on macOS, and on
// Linux the first of sensible-editor, editor, nano and vi found on PATH.
func editor(given string) ([]string, error) {
	if f := strings.Fields(given); len(f) > 0 {
		return f, nil
	}
	var cands []string
	switch goruntime.GOOS {
	case "windows":
		return []string{"notepad"}, nil
	case "darwin":
		cands = []string{"vi"}
	default:
		cands = []string{"sensible-editor", "editor", "nano", "vi"}
	}
	for _, c := range cands {
		if p, err := exec.LookPath(c); err == nil {
			return []string{p}, nil
		}
	}
	return nil, fmt.Errorf("limits: no editor found (%s): set $VISUAL or $EDITOR", strings.Join(cands, ", "))
}
