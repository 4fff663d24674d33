package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/client"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/undo"
)

func runHistory(std stdio, args []string) int {
	fs := newFlagSet("history", std, `Show the changes executors made on this device, newest first, and what
undo would do for each. The history journal is chained with blake3: an
edited or removed record is reported.

Among them are the device owner's: each change of the limits file
(limits.toml) the agent saw, with its old and new values, and each
invocation the owner's limits refused before it ran, with the rule (both
read from the audit log; with --json, under "owner_events").`)
	asJSON := fs.Bool("json", false, "print the entries as JSON")
	limit := fs.Int("n", 20, "show at most this many entries (0: all)")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "history", "unexpected argument %q", fs.Arg(0))
	}
	if *limit < 0 {
		return usageError(std.err, "history", "-n %d: give how many entries to show, or 0 for all", *limit)
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	dir := e.lay.Journal()
	j, err := undo.Load(dir)
	if err != nil {
		return fail(std, err)
	}
	// Only as far back as the entries shown: the newest are found
	// without reading the oldest.
	entries, err := j.Newest(*limit)
	if err != nil {
		return fail(std, err)
	}
	var problem string
	if err := undo.Check(dir); err != nil {
		// The chain may still verify up to the damage, but a local
		// undo is refused as a whole: say so, and why.
		problem = fmt.Sprintf("a local undo refuses every change until the journal is mended: %v", err)
	} else if rep, ids, err := j.Untrusted(); err == nil && !rep.OK() {
		problem = fmt.Sprintf("the history journal was tampered with: %s", rep)
		if len(ids) > 0 {
			problem += fmt.Sprintf("; a local undo refuses the changes recorded at or after that place: %s", strings.Join(ids, ", "))
		}
	}
	// What the retention removed, said after the oldest entry left.
	pruned, wasPruned, err := undo.PrunedFrom(dir)
	if err != nil {
		return fail(std, err)
	}
	// The owner's events, as far back as the entries shown go (all of
	// them when the journal has no more).
	var since time.Time
	if *limit > 0 && len(entries) == *limit {
		since = entries[len(entries)-1].Began
	}
	events, err := audit.OwnerEvents(e.lay.Audit(), since, *limit)
	if err != nil {
		fmt.Fprintf(std.err, "metnos-agent: warning: %s\n", term.SanitizeLines(err.Error()))
	}
	if *asJSON {
		out := struct {
			Journal     string             `json:"journal"`
			Problem     string             `json:"problem,omitempty"`
			Pruned      *undo.Pruned       `json:"pruned,omitempty"`
			Entries     []entryJSON        `json:"entries"`
			OwnerEvents []audit.OwnerEvent `json:"owner_events"`
		}{Journal: dir, Problem: problem, Entries: []entryJSON{}, OwnerEvents: events}
		if out.OwnerEvents == nil {
			out.OwnerEvents = []audit.OwnerEvent{}
		}
		if wasPruned {
			out.Pruned = &pruned
		}
		for _, e := range entries {
			out.Entries = append(out.Entries, toJSON(e))
		}
		enc := json.NewEncoder(std.out)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(out); err != nil {
			return fail(std, err)
		}
		return exitOK
	}
	if problem != "" && len(entries) == 0 {
		// Not "no changes yet": the journal says there were some.
		return fail(std, fmt.Errorf("%s; no change recorded in it can be read", problem))
	}
	if problem != "" {
		fmt.Fprintf(std.out, "warning: %s\n\n", term.Sanitize(problem))
	}
	if len(entries) == 0 && len(events) == 0 && !wasPruned {
		fmt.Fprintln(std.out, "No changes recorded on this device yet.")
		return exitOK
	}
	// The journal's entries and the owner's events, newest first.
	ei, oi := 0, 0
	for n := 0; (ei < len(entries) || oi < len(events)) && (*limit == 0 || n < *limit); n++ {
		if oi == len(events) || (ei < len(entries) && !entries[ei].Began.Before(events[oi].Time)) {
			printEntry(std.out, entries[ei])
			ei++
		} else {
			printOwnerEvent(std.out, events[oi])
			oi++
		}
	}
	if wasPruned && (*limit == 0 || len(entries) < *limit) {
		fmt.Fprintf(std.out, "%s.\n", pruned)
	}
	return exitOK
}

// entryJSON is one entry of `history --json`.
type entryJSON struct {
	InvocationID   string           `json:"invocation_id"`
	TurnID         string           `json:"turn_id,omitempty"`
	Executor       string           `json:"executor"`
	ManifestSHA256 string           `json:"manifest_sha256"`
	Began          time.Time        `json:"began"`
	Ended          *time.Time       `json:"ended,omitempty"`
	State          string           `json:"state"`
	OK             bool             `json:"ok"`
	ErrorClass     string           `json:"error_class,omitempty"`
	ReversePattern []string         `json:"reverse_patterns"`
	Undo           string           `json:"undo"`
	Steps          []stepJSON       `json:"steps"`
	Rows           []undo.Row       `json:"rows"`
	DirsCreated    []string         `json:"dirs_created"`
	Conflicts      []undo.Conflict  `json:"conflicts,omitempty"`
	Reverses       []string         `json:"reverses,omitempty"`
	BlobsExpired   []string         `json:"blobs_expired,omitempty"`
	Roots          []string         `json:"roots"`
	UndoStarted    bool             `json:"undo_started,omitempty"`
	UndoneBy       map[string][]int `json:"undone_by,omitempty"`
}

// stepJSON is one undo step of an entry.
type stepJSON struct {
	undo.Item
	Description string `json:"description"`
	UndoneBy    string `json:"undone_by,omitempty"`
}

func toJSON(e undo.Entry) entryJSON {
	out := entryJSON{InvocationID: e.InvocationID, TurnID: e.TurnID, Executor: e.Executor, ManifestSHA256: e.ManifestSHA256,
		Began: e.Began, State: e.State(), OK: e.OK, ErrorClass: e.ErrorClass, ReversePattern: e.Reverse, Undo: e.Summary(),
		Steps: []stepJSON{}, Rows: e.Rows, DirsCreated: e.DirsCreated, Conflicts: e.Conflicts, Reverses: e.Reverses,
		BlobsExpired: e.BlobsExpired, Roots: e.Roots, UndoStarted: e.UndoStarted}
	if out.ReversePattern == nil {
		out.ReversePattern = []string{}
	}
	if out.Rows == nil {
		out.Rows = []undo.Row{}
	}
	if out.DirsCreated == nil {
		out.DirsCreated = []string{}
	}
	if out.Roots == nil {
		out.Roots = []string{}
	}
	if !e.Ended.IsZero() {
		out.Ended = &e.Ended
	}
	for i, it := range e.Items {
		out.Steps = append(out.Steps, stepJSON{Item: it, Description: it.Describe(), UndoneBy: e.Undone[i]})
	}
	if len(e.Undone) > 0 {
		out.UndoneBy = map[string][]int{}
		for i, by := range e.Undone {
			out.UndoneBy[by] = append(out.UndoneBy[by], i)
		}
		for _, l := range out.UndoneBy {
			sort.Ints(l)
		}
	}
	return out
}

// printEntry prints one entry for humans. Every name, id and path in
// it came from the server, an executor or the journal file: each is
// shown sanitised (term.Sanitize), so that none reaches the terminal
// as an escape sequence.
func printEntry(w io.Writer, e undo.Entry) {
	san := term.Sanitize
	fmt.Fprintf(w, "%s  %-16s %s  %s\n", e.Began.Local().Format("2006-01-02 15:04:05"), san(e.Executor), san(e.InvocationID), e.State())
	var facts []string
	if e.TurnID != "" {
		facts = append(facts, "turn "+san(e.TurnID))
	}
	if e.Finished {
		facts = append(facts, san(e.Changes()))
	}
	if e.ErrorClass != "" {
		facts = append(facts, "error "+san(e.ErrorClass))
	}
	if len(facts) > 0 {
		fmt.Fprintf(w, "    %s\n", strings.Join(facts, " · "))
	}
	if len(e.Reverses) > 0 {
		fmt.Fprintf(w, "    put back changes of %s\n", san(strings.Join(e.Reverses, ", ")))
	}
	byWho := map[string]bool{}
	for _, by := range e.Undone {
		byWho[by] = true
	}
	if len(byWho) > 0 {
		var who []string
		for by := range byWho {
			if by == undo.ByLocal {
				by = "a local undo"
			}
			who = append(who, by)
		}
		sort.Strings(who)
		fmt.Fprintf(w, "    undone by %s\n", san(strings.Join(who, ", ")))
	}
	fmt.Fprintf(w, "    undo: %s\n", san(e.Summary()))
	for _, c := range e.Conflicts {
		fmt.Fprintf(w, "    conflict: %s\n", san(c.Why))
	}
	for _, b := range e.BlobsExpired {
		fmt.Fprintf(w, "    %s\n", san(b))
	}
	if e.UndoStarted {
		fmt.Fprintln(w, "    a local undo was started and did not finish: run `metnos-agent undo --offline "+san(e.InvocationID)+"` again")
	}
}

// printOwnerEvent prints one of the owner's events for humans: a
// change of the limits file, or an invocation its limits refused; what
// came from a file or the server is sanitised, as in printEntry.
func printOwnerEvent(w io.Writer, ev audit.OwnerEvent) {
	san := term.Sanitize
	at := ev.Time.Local().Format("2006-01-02 15:04:05")
	if ev.Event == audit.EventRefused {
		fmt.Fprintf(w, "%s  %-16s %s  refused by the owner\n", at, san(ev.Executor), san(ev.InvocationID))
		if ev.TurnID != "" {
			fmt.Fprintf(w, "    turn %s\n", san(ev.TurnID))
		}
		fmt.Fprintf(w, "    %s\n", san(ev.RefusedBy))
		return
	}
	state := "changed, in force"
	if !ev.InForce {
		state = "changed, refused: the limits before stay in force"
	}
	name := filepath.Base(ev.File)
	fmt.Fprintf(w, "%s  %-16s %s\n", at, san(name), state)
	when := "seen while the agent ran"
	if ev.Seen == "start" {
		when = "made while no agent ran, seen at its start"
	}
	fmt.Fprintf(w, "    the owner's limits %s · %s\n", san(ev.File), when)
	for _, c := range ev.Changes {
		fmt.Fprintf(w, "    %s: %s → %s\n", san(c.Key), san(c.Old), san(c.New))
	}
	if ev.InForce && len(ev.Changes) == 0 {
		fmt.Fprintln(w, "    no setting changed")
	}
	if ev.Error != "" {
		fmt.Fprintf(w, "    %s\n", san(ev.Error))
	}
}

func runUndo(std stdio, args []string) int {
	fs := newFlagSet("undo", std, `Put back, on this device, the changes of one invocation: its reverse
patterns applied locally, newest change first. It never replaces a file:
a file that changed since, or a place that is taken, is reported as a
conflict and both are kept. A backup blob is restored only if its
SHA-256 still matches. Killed at any point, run it again: it finishes.

This is the escape hatch for when the Metnos server is gone or the
device was unpaired. While the device is paired and its server answers,
ask Metnos to undo instead (so that the server's undo log stays true),
or add --offline.`)
	last := fs.Bool("last", false, "undo the newest change that still has something to undo (passing over those a local undo left in conflict: undo them by their id)")
	dry := fs.Bool("dry-run", false, "say what would be done, change nothing")
	offline := fs.Bool("offline", false, "undo here even though the paired server answers")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	var id string
	switch {
	case *last && fs.NArg() == 0:
	case !*last && fs.NArg() == 1:
		id = fs.Arg(0)
	default:
		return usageError(std.err, "undo", "name one INVOCATION_ID, or --last")
	}
	env, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	// A dry run says what the real command would do: it asks the
	// server too, and is refused where the real one is.
	if !*offline {
		if url, why := serverAnswers(env, warnLogger(std)); url != "" && why == nil {
			refused := fmt.Errorf("this device is paired with %s and the server answers: ask Metnos to undo, so that its undo log stays true (or run again with --offline to undo here anyway)", url)
			if *dry {
				refused = fmt.Errorf("undo would be refused, nothing was changed (dry run): %w", refused)
			}
			return fail(std, refused)
		} else if url != "" {
			server := url + " "
			if strings.Contains(why.Error(), url) {
				server = "" // the error names it already
			}
			then := "undoing here; Metnos's undo log will not know"
			if *dry {
				then = "undo would undo here, and Metnos's undo log would not know"
			}
			fmt.Fprintf(std.err, "metnos-agent: %s\n", term.SanitizeLines(fmt.Sprintf("the paired server %sdoes not answer (%v): %s", server, why, then)))
		}
	}
	dir := env.lay.Journal()
	// Refused before the lock is taken, by the dry run as by the real
	// one: a journal that cannot be appended to, or whose file is gone.
	if err := undo.Check(dir); err != nil {
		return fail(std, err)
	}
	// A refusal creates nothing: what there is to undo is looked up
	// read-only first, and only a local undo that has something to do
	// takes the lock and opens the journal for appending.
	j, err := undo.Load(dir)
	if err != nil {
		return fail(std, err)
	}
	if !*last {
		if _, ok := j.Entry(id); !ok {
			_, err := j.Undo(id, env.lay.Blobs(), true) // says why: no such change, or pruned
			if err == nil {
				err = fmt.Errorf("%s: no such change in the history journal (see `metnos-agent history`)", id)
			}
			return fail(std, err)
		}
	} else if _, _, ok := j.Last(); !ok {
		return nothingToUndo(std, j)
	}
	if !*dry {
		lk, lerr := lockfile.Lock(filepath.Join(dir, "undo.lock"))
		if lerr != nil {
			if errors.Is(lerr, lockfile.ErrLocked) {
				return fail(std, fmt.Errorf("another local undo is running: %w", lerr))
			}
			return fail(std, lerr)
		}
		defer lk.Release()
		if j, err = undo.Open(dir); err != nil {
			return fail(std, err)
		}
	}
	if *last {
		// Again under the lock: another undo may have run meanwhile.
		e, skipped, ok := j.Last()
		if !ok {
			return nothingToUndo(std, j)
		}
		skippedConflicts(std, skipped)
		id = e.InvocationID
	}
	e, _ := j.Entry(id)
	rep, err := j.Undo(id, env.lay.Blobs(), *dry)
	return undoOutcome(std, e, rep, err)
}

// nothingToUndo says that no change of the journal j has anything left
// to undo here, after the ones passed over for their conflicts: exit 1
// when there were some, else 0.
func nothingToUndo(std stdio, j *undo.Journal) int {
	_, skipped, _ := j.Last()
	skippedConflicts(std, skipped)
	fmt.Fprintln(std.out, "Nothing to undo: no change on this device has anything left to undo here.")
	if len(skipped) > 0 {
		return exitFailure
	}
	return exitOK
}

// skippedConflicts says, for each change --last passed over, that a
// local undo left it in conflict and how to undo it once settled.
func skippedConflicts(std stdio, skipped []string) {
	for _, s := range skipped {
		s = term.Sanitize(s)
		fmt.Fprintf(std.err, "metnos-agent: skipping %s: its last local undo left conflicts (see `metnos-agent history`); once they are settled, undo it by its id: metnos-agent undo --offline %s\n", s, s)
	}
}

// undoOutcome prints what a local undo did, then its error, if any: an
// undo whose steps were done but whose journal record failed still says
// what it changed.
func undoOutcome(std stdio, e undo.Entry, rep undo.Report, err error) int {
	if err != nil && len(rep.Done) == 0 && len(rep.Conflicts) == 0 && rep.Already == 0 && len(rep.Unsupported) == 0 {
		return fail(std, err) // refused before any step
	}
	printReport(std.out, e, rep)
	if err != nil {
		return fail(std, err)
	}
	if len(rep.Conflicts) > 0 || len(rep.Unsupported) > 0 {
		return exitFailure
	}
	return exitOK
}

// serverAnswers says whether the device is paired (the server's URL,
// "" when not) and why its server does not answer within a few seconds
// (nil: it answers). The server is reached as every command reaches it:
// over the OS network, where it has 5 s to answer, or over the embedded
// tailnet when one is configured, where joining may take up to 30 s and
// the server then has 20 s (the node's first request waits for a path
// to the server's node).
func serverAnswers(e environment, log *slog.Logger) (url string, why error) {
	st, err := pairing.LoadState(e.lay)
	if err != nil || !st.Paired() || st.ServerURL == nil {
		return "", nil
	}
	c, node, err := connect(context.Background(), e, connectOptions{wait: 30 * time.Second}, log)
	if err != nil {
		return *st.ServerURL, err
	}
	wait := 5 * time.Second
	if node != nil {
		defer node.Close()
		wait = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = c.Shim(ctx)
	if se := (*client.ServerError)(nil); err == nil || errors.As(err, &se) {
		return c.URL(), nil
	}
	return c.URL(), err
}

// printReport prints what a local undo did, every id, name, path and
// reason sanitised (see printEntry).
func printReport(w io.Writer, e undo.Entry, rep undo.Report) {
	san := term.Sanitize
	verb := "Undone"
	if rep.DryRun {
		verb = "Would undo"
	}
	fmt.Fprintf(w, "%s %s (%s, %s):\n", verb, san(rep.InvocationID), san(e.Executor), e.Began.Local().Format("2006-01-02 15:04"))
	const show = 20
	for i, d := range rep.Done {
		if i == show {
			fmt.Fprintf(w, "  … and %d more\n", len(rep.Done)-show)
			break
		}
		fmt.Fprintf(w, "  ✓ %s\n", san(d))
	}
	switch {
	case rep.Already == 1:
		fmt.Fprintf(w, "  1 step was already done\n")
	case rep.Already > 1:
		fmt.Fprintf(w, "  %d steps were already done\n", rep.Already)
	}
	for _, c := range rep.Conflicts {
		fmt.Fprintf(w, "  ✗ %s\n", san(c.Why))
	}
	for _, u := range rep.Unsupported {
		fmt.Fprintf(w, "  – not undoable here: %s\n", san(u))
	}
	switch left := len(rep.Conflicts) + len(rep.Unsupported); {
	case left > 0 && rep.DryRun:
		fmt.Fprintf(w, "Not everything would be put back: %s. Nothing was changed (dry run).\n", leftOver(rep))
	case left > 0:
		fmt.Fprintf(w, "Not everything was put back: %s (no file changed since the run was replaced). The change stays in the history as not undone.\n", leftOver(rep))
	case rep.DryRun:
		fmt.Fprintln(w, "Nothing was changed (dry run).")
	case len(rep.Done) == 0:
		fmt.Fprintln(w, "Nothing left to undo.")
	default:
		fmt.Fprintln(w, "✓ everything put back.")
	}
}

// leftOver says what a local undo leaves undone: "2 steps left as they
// were, 1 not undoable here".
func leftOver(rep undo.Report) string {
	var parts []string
	if n := len(rep.Conflicts); n == 1 {
		parts = append(parts, "1 step left as it was")
	} else if n > 1 {
		parts = append(parts, fmt.Sprintf("%d steps left as they were", n))
	}
	if n := len(rep.Unsupported); n > 0 {
		parts = append(parts, fmt.Sprintf("%d not undoable here", n))
	}
	return strings.Join(parts, ", ")
}
