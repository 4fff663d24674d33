package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/internal/chainlog"
)

const auditHelp = `
Audit verify checks the local audit log: one JSON line per invocation,
in a file a day in the audit folder of the data dir, each line holding
the hash of the one before it. It reports the first line that was
edited, removed or moved, and exits 1; an intact log (or none yet)
exits 0.

The chain has no secret key: it shows that the files were changed after
they were written, unless whoever changed them rewrote the whole chain.

The agent removes the day files older than METNOS_AUDIT_RETENTION_DAYS
(365): what is kept still verifies, and a line says how many lines were
pruned, of the days before which one.

With --json it prints one object: {"dir", "ok", "files", "lines",
"problem", "file", "line", "note", "pruned"}; "pruned", when the log was
pruned, is {"lines", "files", "before", "retention_days"}.
`

// auditReport is what audit verify --json prints.
type auditReport struct {
	Dir     string `json:"dir"`
	OK      bool   `json:"ok"`
	Files   int    `json:"files"`
	Lines   int64  `json:"lines"`
	Problem string `json:"problem,omitempty"`
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Note    string `json:"note,omitempty"`
	// Pruned is what the retention removed, when it did.
	Pruned *audit.Pruned `json:"pruned,omitempty"`
}

func runAudit(std stdio, args []string) int {
	if len(args) == 0 {
		return usageError(std.err, "audit", "audit needs a subcommand: verify")
	}
	switch args[0] {
	case "verify":
		return runAuditVerify(std, args[1:])
	case "-h", "-help", "--help":
		return runAuditVerify(std, args[:1])
	}
	return usageError(std.err, "audit", "unknown subcommand %q (verify)", args[0])
}

func runAuditVerify(std stdio, args []string) int {
	fs := newFlagSet("audit", std, auditHelp)
	asJSON := fs.Bool("json", false, "print JSON")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "audit", "audit verify takes no arguments")
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	dir := e.lay.Audit()
	rep, err := audit.Verify(dir)
	none := errors.Is(err, os.ErrNotExist)
	if err != nil && !none {
		return fail(std, err)
	}
	if none {
		rep = chainlog.Report{Note: "no audit log yet"}
	}
	var pruned *audit.Pruned
	if p, ok, err := audit.PrunedFrom(dir); err != nil {
		// Verify reports a START file that is not the log's.
		fmt.Fprintf(std.err, "warning: %v\n", err)
	} else if ok {
		pruned = &p
	}
	if *asJSON {
		b, _ := json.MarshalIndent(auditReport{
			Dir: dir, OK: rep.OK(), Files: rep.Files, Lines: rep.Lines,
			Problem: rep.Problem, File: rep.File, Line: rep.Line, Note: rep.Note,
			Pruned: pruned,
		}, "", "  ")
		fmt.Fprintln(std.out, string(b))
	} else {
		printAuditReport(std, dir, rep, none, pruned)
	}
	if !rep.OK() {
		return exitFailure
	}
	return exitOK
}

func printAuditReport(std stdio, dir string, rep chainlog.Report, none bool, pruned *audit.Pruned) {
	switch {
	case none:
		fmt.Fprintf(std.out, "no audit log yet (%s)\n", dir)
		return
	case !rep.OK():
		fmt.Fprintf(std.out, "audit log NOT intact: %s%s (%s)\n", where(rep), rep.Problem, dir)
	default:
		fmt.Fprintf(std.out, "audit log intact: %d lines in %d files (%s)\n", rep.Lines, rep.Files, dir)
	}
	if pruned != nil {
		fmt.Fprintf(std.out, "pruned: %s; the lines kept follow the last one removed\n", pruned)
	}
	if rep.Note != "" {
		fmt.Fprintf(std.out, "note: %s\n", rep.Note)
	}
}

// where is the place a problem was found, as "FILE line N: ".
func where(rep chainlog.Report) string {
	switch {
	case rep.File == "":
		return ""
	case rep.Line == 0:
		return rep.File + ": "
	}
	return fmt.Sprintf("%s line %d: ", rep.File, rep.Line)
}
