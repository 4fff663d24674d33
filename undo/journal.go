package undo

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// journalFile is the first file (segment) of the journal's chained log;
// the next ones are journal_000002.jsonl, journal_000003.jsonl... (named
// to sort after it), the chain running across them.
const journalFile = "journal" + chainlog.Ext

// segmentBytes is the size past which the journal starts its next
// segment: old history is read, and pruned, a whole segment at a time.
var segmentBytes int64 = 64 << 10

// window is how many of the newest entries a journal open for
// appending keeps in memory, besides those still running: the earlier
// changes a run is recognised to put back ([Journal.Finish]) are among
// them. Older entries are read from the disk when asked for.
var window = 256

// segmentName is the name of the segment numbered n (1: journalFile).
func segmentName(n int) string {
	if n <= 1 {
		return journalFile
	}
	return fmt.Sprintf("journal_%06d%s", n, chainlog.Ext)
}

// segmentNumber is the number of the segment named name, 0 when name is
// not one.
func segmentNumber(name string) int {
	if name == journalFile {
		return 1
	}
	s, ok := strings.CutPrefix(strings.TrimSuffix(name, chainlog.Ext), "journal_")
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 2 {
		return 0
	}
	return n
}

// nextFile is the file the next record goes to, given the one holding
// the last record and its size.
func nextFile(last string, size int64) string {
	n := segmentNumber(last)
	switch {
	case last == "":
		return journalFile
	case n > 0 && size >= segmentBytes:
		return segmentName(n + 1)
	}
	return last
}

// Journal is the device's history of changes. Only what undo needs is
// kept in memory: the entries still running and the newest ones
// (window); the others are read from the disk, newest first, when
// asked for, so that neither the memory nor opening it grow with the
// history.
type Journal struct {
	dir string
	log *chainlog.Log // nil: loaded read-only

	mu       sync.Mutex
	seq      int64             // the last line folded in (opened for appending)
	entries  []*Entry          // in memory, in the order they began
	byID     map[string]*Entry // by invocation id
	broken   error             // a record that could not be read
	complete bool              // every entry of the log is in entries
	recent   bool              // the newest window entries were read
	policies map[string]policyRec
	segment  string          // the segment written lately
	written  map[string]bool // the policies written in it
	// turnAge is, for a blob folder whose entries ended after its files
	// were written, when the last one did ([Journal.Expire]).
	turnAge map[string]time.Time
	// linesRead counts the lines read from the disk (what a test of
	// the journal's cost looks at: it must not grow with history).
	linesRead int

	// In a journal read for a scan: outer is the journal the entries
	// read join (its entries are not read again); keep, when set, drops
	// a finished entry it refuses.
	outer *Journal
	keep  func(*Entry) bool
}

// Entry is what the journal knows of one invocation.
type Entry struct {
	InvocationID   string
	TurnID         string
	Executor       string
	ManifestSHA256 string
	// Reverse is the manifest's reverse_pattern list.
	Reverse []string
	// Roots are the folders (and files) the invocation's sandbox could
	// write; a local undo acts only inside them.
	Roots []string
	// Masks are the paths the sandbox hid inside them (the nucleus:
	// ~/.ssh, keyrings, the agent's own data...): never touched.
	Masks []string
	// History is the agent's backup blob folder when the change was made.
	History string
	Began   time.Time

	// Set when the result is known (Finished) or the run was cut short
	// by a crash (Interrupted: what it changed is not known).
	Finished    bool
	Interrupted bool
	Ended       time.Time
	OK          bool
	ErrorClass  string
	Rows        []Row
	DirsCreated []string
	// Items is the undo plan, derived from Reverse, Rows and DirsCreated.
	Items []Item
	// Recovered is set when the outcome was recorded only at a start
	// after a crash: the files the run left were looked at then, and a
	// user's edit in between would pass for the executor's. A local
	// undo keeps both: the version from before the run goes beside an
	// overwritten file, and a created file is kept.
	Recovered bool

	// Undone maps the index of each item put back to what put it back:
	// an invocation id (the server's reverse invocation) or "local".
	Undone map[int]string
	// Conflicts are what the last local undo left as it was, and why.
	Conflicts []Conflict
	// UndoStarted is set while a local undo has begun and not ended
	// (after a crash, until it is run again).
	UndoStarted bool
	// BlobsExpired says, for each time its blobs were removed, why.
	BlobsExpired []string
	// Reverses lists the entries this invocation put changes of back.
	Reverses []string

	// recs are where the records about the entry are (to refuse it when
	// the chain fails at one).
	recs []recRef
	// policy, when not "", is the hash of the policy record naming the
	// entry's masks and history folder, not read yet: it is in the
	// segment seg ([Journal.resolve]).
	policy, seg string
}

// recRef is where a record is: its file and its number in the chain.
type recRef struct {
	file string
	seq  int64
}

// State is one word for an entry: running, interrupted, failed,
// done (nothing undone), partly-undone, undone. An entry is undone
// only when every step of its undo is, including those no local undo
// can do.
func (e *Entry) State() string {
	switch {
	case e.Interrupted:
		return "interrupted"
	case !e.Finished:
		return "running"
	case len(e.Undone) > 0 && len(e.Undone) >= len(e.Items):
		return "undone"
	case len(e.Undone) > 0:
		return "partly-undone"
	case len(e.Rows) == 0 && len(e.DirsCreated) == 0 && !e.OK:
		return "failed"
	}
	return "done"
}

// left counts the steps a local undo can do that are not done yet.
func (e *Entry) left() int {
	n := 0
	for i, it := range e.Items {
		if _, done := e.Undone[i]; !done && it.Kind != Unsupported {
			n++
		}
	}
	return n
}

// policyRec is what is the same for the runs of one sandbox policy:
// the paths it masks and the backup blob folder. A begin record names
// it by its hash ([policyRec.hash]); it is written whole in the first
// begin record of each segment that uses it, and read from there.
type policyRec struct {
	Masks   []string `json:"masks"`
	History string   `json:"history_dir,omitempty"`
}

// maxPolicies bounds the policies kept in memory (one a sandbox
// profile in practice).
const maxPolicies = 64

func (p policyRec) hash() string {
	b, _ := json.Marshal(p)
	return chainlog.Hash(b)[:32]
}

func newJournal(dir string) *Journal {
	return &Journal{dir: dir, byID: map[string]*Entry{}, policies: map[string]policyRec{}}
}

// Open opens (creating) the journal in dir, <data_dir>/history, for
// appending. It reads, from the end, only the records since the last
// moment no invocation was running: the entries a crash may have left
// open ([Journal.Unfinished]).
func Open(dir string) (*Journal, error) {
	j := newJournal(dir)
	log, err := chainlog.Open(dir, chainlog.Options{Foreign: func(file string, line []byte) {
		j.apply(file, line) // called with j.mu held, from append
	}})
	if err != nil {
		return nil, fmt.Errorf("history journal: %w", err)
	}
	j.log = log
	j.seq = log.Seq()
	j.mu.Lock()
	defer j.mu.Unlock()
	// A begin, change or interrupted record says how many entries were
	// still open after it (the agent's own count): reading back to one
	// saying none is enough.
	_, err = j.older(func(_ int, r *record) bool { return r.Open != nil && *r.Open == 0 })
	j.trim() // a journal written before the count was kept is read whole, once
	return j, err
}

// Load opens the journal in dir read-only (for history listings and a
// dry run), reading nothing yet: entries are read from the disk as they
// are asked for. A journal that does not exist is empty. A journal
// whose files were removed while its HEAD says records were written is
// an error, not an empty history.
func Load(dir string) (*Journal, error) {
	if err := gone(dir); err != nil {
		return nil, err
	}
	return newJournal(dir), nil
}

// Check refuses, reading only, a journal that [Open] would refuse (a
// journal file that is a folder, or whose end is not a record), and a
// journal whose file is gone while its HEAD says records were written:
// a dry run of a local undo says what the real one would.
func Check(dir string) error {
	if err := gone(dir); err != nil {
		return err
	}
	if err := chainlog.Check(dir); err != nil {
		return fmt.Errorf("history journal: %w", err)
	}
	return nil
}

// gone refuses a journal whose file was deleted or moved away while
// its HEAD says records were written.
func gone(dir string) error {
	seq, _, err := chainlog.Gone(dir)
	if err != nil {
		return fmt.Errorf("history journal: %w", err)
	}
	if seq == 0 {
		return nil
	}
	path := filepath.Join(dir, journalFile)
	return fmt.Errorf("history journal: %s is missing, but the HEAD file beside it says %d %s were written to it: the history of the changes made on this device was deleted or moved, so they can be neither listed nor undone here. Put the file back from a backup; or, to start a new history, move HEAD away too",
		path, seq, plural(seq, "record"))
}

func plural(n int64, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// Dir is the journal's folder.
func (j *Journal) Dir() string { return j.dir }

// Problem is the first record the journal could not read, if any (the
// entries after it are still used).
func (j *Journal) Problem() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.broken
}

// record is one line of the journal; Kind says which fields are used.
type record struct {
	Seq  int64     `json:"seq,omitempty"` // set by the chain, read back
	Kind string    `json:"kind"`
	Time time.Time `json:"time"`
	ID   string    `json:"invocation_id,omitempty"`
	// Open, in a begin, change or interrupted record, is how many
	// entries were running once it was written.
	Open *int `json:"open,omitempty"`

	// begin
	TurnID         string   `json:"turn_id,omitempty"`
	Executor       string   `json:"executor,omitempty"`
	ManifestSHA256 string   `json:"manifest_sha256,omitempty"`
	Reverse        []string `json:"reverse_patterns,omitempty"`
	// Policy is the hash of the masks and history folder (policyRec),
	// written whole (Masks, History) only in the first begin record of
	// a segment that uses it. A record without Policy has them whole.
	Policy string `json:"policy,omitempty"`

	// change
	OK          *bool    `json:"ok,omitempty"`
	ErrorClass  string   `json:"error_class,omitempty"`
	Roots       []string `json:"roots,omitempty"`
	Masks       []string `json:"masks,omitempty"`
	History     string   `json:"history_dir,omitempty"`
	Rows        []Row    `json:"rows,omitempty"`
	DirsCreated []string `json:"dirs_created,omitempty"`
	Recovered   bool     `json:"recovered,omitempty"`

	// undone, undo_started
	Items     []int      `json:"items,omitempty"`
	By        string     `json:"by,omitempty"`
	Conflicts []Conflict `json:"conflicts,omitempty"`

	// blobs_expired
	Dir    string   `json:"dir,omitempty"`
	Reason string   `json:"reason,omitempty"`
	Bytes  int64    `json:"bytes,omitempty"`
	IDs    []string `json:"invocation_ids,omitempty"`
	Lost   []string `json:"undo_lost,omitempty"`
}

// The kinds of record.
const (
	kindBegin       = "begin"
	kindChange      = "change"
	kindInterrupted = "interrupted"
	kindUndoStarted = "undo_started"
	kindUndone      = "undone"
	kindExpired     = "blobs_expired"
)

// apply folds in one line another process appended. j.mu is held.
func (j *Journal) apply(file string, line []byte) {
	var r record
	if err := json.Unmarshal(line, &r); err != nil {
		j.unreadable(file, err)
		return
	}
	// A line read at Open may be handed over again by the next append's
	// catching up: fold each once.
	if r.Seq != 0 && r.Seq <= j.seq {
		return
	}
	j.seq = r.Seq
	j.fold(file, r)
}

func (j *Journal) unreadable(file string, err error) {
	if j.broken == nil {
		j.broken = fmt.Errorf("a record of %s is not readable (%v): edited?", filepath.Join(j.dir, file), err)
	}
}

// lookup finds an entry in memory (in a scan, in the journal it joins
// too).
func (j *Journal) lookup(id string) *Entry {
	if e := j.byID[id]; e != nil {
		return e
	}
	if j.outer != nil {
		return j.outer.byID[id]
	}
	return nil
}

func (j *Journal) fold(file string, r record) {
	e := j.byID[r.ID]
	defer func() {
		at := recRef{file, r.Seq}
		if e := j.byID[r.ID]; e != nil {
			e.recs = append(e.recs, at)
		}
		if r.Kind == kindExpired {
			for _, id := range r.IDs {
				if e := j.byID[id]; e != nil {
					e.recs = append(e.recs, at)
				}
			}
		}
	}()
	switch r.Kind {
	case kindBegin:
		if e != nil || (j.outer != nil && j.outer.byID[r.ID] != nil) {
			return // begun again after a crash before its marker: keep the first
		}
		e = &Entry{InvocationID: r.ID, TurnID: r.TurnID, Executor: r.Executor, ManifestSHA256: r.ManifestSHA256,
			Reverse: r.Reverse, Roots: r.Roots, Masks: r.Masks, History: r.History, Began: r.Time, Undone: map[int]string{}}
		if r.Policy != "" {
			if r.Masks != nil || r.History != "" {
				if len(j.policies) >= maxPolicies {
					clear(j.policies) // read again from their segments when needed
				}
				j.policies[r.Policy] = policyRec{Masks: r.Masks, History: r.History}
			} else if p, ok := j.policies[r.Policy]; ok {
				e.Masks, e.History = p.Masks, p.History
			} else {
				e.policy, e.seg = r.Policy, file
			}
		}
		if j.keep == nil {
			j.entries = append(j.entries, e)
		}
		j.byID[r.ID] = e
	case kindChange:
		if e == nil {
			return
		}
		e.Finished, e.Interrupted, e.Ended = true, false, r.Time
		e.OK = r.OK != nil && *r.OK
		e.ErrorClass, e.Rows, e.DirsCreated, e.Recovered = r.ErrorClass, r.Rows, r.DirsCreated, r.Recovered
		e.Items = plan(e.Reverse, e.Rows, e.DirsCreated)
		if j.keep != nil && !j.keep(e) {
			delete(j.byID, r.ID)
			e = nil
		}
	case kindInterrupted:
		if e != nil && !e.Finished {
			e.Interrupted, e.Ended = true, r.Time
		}
	case kindUndoStarted:
		if e != nil {
			e.UndoStarted = true
		}
	case kindUndone:
		if e == nil {
			return
		}
		for _, i := range r.Items {
			if _, done := e.Undone[i]; !done && i >= 0 && i < len(e.Items) {
				e.Undone[i] = r.By
			}
		}
		if r.By == ByLocal {
			e.UndoStarted, e.Conflicts = false, r.Conflicts
		} else if by := j.lookup(r.By); by != nil && !slices.Contains(by.Reverses, e.InvocationID) {
			by.Reverses = append(by.Reverses, e.InvocationID)
		}
	case kindExpired:
		for _, id := range r.IDs {
			if e := j.byID[id]; e != nil {
				e.BlobsExpired = append(e.BlobsExpired, fmt.Sprintf("%s: blobs in %s removed (%s)", r.Time.Format(time.DateOnly), r.Dir, r.Reason))
			}
		}
	}
}

// running counts the entries begun and neither finished nor
// interrupted. j.mu is held.
func (j *Journal) running() int {
	n := 0
	for _, e := range j.entries {
		if !e.Finished && !e.Interrupted {
			n++
		}
	}
	return n
}

// write appends r and folds it in. j.mu is held.
func (j *Journal) write(r record) error {
	if j.log == nil {
		return errors.New("history journal: opened read-only")
	}
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	// The agent alone begins, finishes and interrupts entries: its
	// count of those running after this record lets Open stop reading
	// back at the last record saying none was.
	switch e := j.byID[r.ID]; r.Kind {
	case kindBegin:
		n := j.running()
		if e == nil {
			n++
		}
		r.Open = &n
	case kindChange, kindInterrupted:
		n := j.running()
		if e != nil && !e.Finished && !e.Interrupted {
			n--
		}
		r.Open = &n
	}
	seq, file, err := j.log.AppendFunc(func(last string, size int64) (string, any) {
		file := nextFile(last, size)
		if file != j.segment {
			j.segment, j.written = file, map[string]bool{}
		}
		w := r
		if r.Policy != "" && j.written[r.Policy] {
			w.Masks, w.History = nil, ""
		}
		return file, w
	})
	if err != nil {
		return fmt.Errorf("history journal: %w", err)
	}
	if r.Policy != "" {
		j.written[r.Policy] = true
	}
	r.Seq = seq
	j.seq = seq
	j.fold(file, r)
	return nil
}

// resolve reads the masks and history folder of an entry whose begin
// record names them by their policy's hash only, from the segment that
// holds it. An entry whose policy cannot be found is refused: acting
// without its masks could touch what its sandbox hid. j.mu is held.
func (j *Journal) resolve(e *Entry) error {
	if e.policy == "" {
		return nil
	}
	p, ok := j.policies[e.policy]
	if !ok {
		key := []byte(`"policy":"` + e.policy + `"`)
		stop := errors.New("found")
		err := chainlog.ReadFile(j.dir, e.seg, func(line []byte) error {
			if !bytes.Contains(line, key) {
				return nil
			}
			var r record
			if json.Unmarshal(line, &r) != nil || r.Kind != kindBegin || (r.Masks == nil && r.History == "") {
				return nil
			}
			if (policyRec{Masks: r.Masks, History: r.History}).hash() != e.policy {
				return nil
			}
			if len(j.policies) >= maxPolicies {
				clear(j.policies)
			}
			j.policies[e.policy] = policyRec{Masks: r.Masks, History: r.History}
			return stop
		})
		if err != nil && err != stop {
			return fmt.Errorf("%s (%s): reading its masked paths: %w", e.InvocationID, e.Executor, err)
		}
		if p, ok = j.policies[e.policy]; !ok {
			return fmt.Errorf("%s (%s): %w: the paths its sandbox masked are recorded by the hash %s, and no record of %s has them: that part of the journal was edited or removed, and without them nothing can be undone safely", e.InvocationID, e.Executor, ErrNotUndoable, e.policy, filepath.Join(j.dir, e.seg))
		}
	}
	e.Masks, e.History, e.policy = p.Masks, p.History, ""
	return nil
}

// parsed is a line read back: its file and record.
type parsed struct {
	file string
	r    record
	err  error
}

// older reads the log back from its end (for a journal open for
// appending, from the last line it folded in), and folds in the
// entries that begin among the lines read and are not in memory yet,
// with all their records; it stops once enough says so (n: how many
// begin records were read back, r: the record just read), or at the
// first line. It reports whether it read back to the first line, and
// sets complete then. j.mu is held.
func (j *Journal) older(enough func(n int, r *record) bool) (bool, error) {
	var lines []parsed
	n, all := 0, true
	err := chainlog.ReadBack(j.dir, func(file string, b []byte) (bool, error) {
		j.linesRead++
		var r record
		if err := json.Unmarshal(b, &r); err != nil {
			lines = append(lines, parsed{file: file, err: err})
			return true, nil
		}
		if j.log != nil && r.Seq > j.seq {
			return true, nil // another process's, folded in at the next append
		}
		lines = append(lines, parsed{file: file, r: r})
		if r.Kind == kindBegin {
			n++
		}
		if enough(n, &r) {
			all = false
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return false, fmt.Errorf("history journal: %w", err)
	}
	t := newJournal(j.dir)
	t.policies, t.outer = j.policies, j
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i].err != nil {
			j.unreadable(lines[i].file, lines[i].err)
			continue
		}
		t.fold(lines[i].file, lines[i].r)
	}
	if len(t.entries) > 0 {
		j.entries = append(j.entries, t.entries...)
		for _, e := range t.entries {
			j.byID[e.InvocationID] = e
		}
		slices.SortStableFunc(j.entries, func(a, b *Entry) int { return cmp.Compare(a.began(), b.began()) })
	}
	if all {
		j.complete = true
	}
	return all, nil
}

// began is the number of the entry's begin record.
func (e *Entry) began() int64 {
	if len(e.recs) == 0 {
		return 0
	}
	return e.recs[0].seq
}

// newest makes sure the newest n entries are in memory (0: all of
// them). j.mu is held.
func (j *Journal) newest(n int) error {
	if j.complete {
		return nil
	}
	_, err := j.older(func(k int, _ *record) bool { return n > 0 && k >= n })
	return err
}

// find returns the entry of an invocation, reading it from the disk
// when it is not in memory; nil when the journal has none. j.mu is
// held.
func (j *Journal) find(id string) (*Entry, error) {
	if e := j.byID[id]; e != nil || j.complete {
		return e, nil
	}
	if _, err := j.older(func(_ int, r *record) bool { return r.Kind == kindBegin && r.ID == id }); err != nil {
		return nil, err
	}
	return j.byID[id], nil
}

// trim drops from memory the finished entries older than the newest
// window ones. j.mu is held.
func (j *Journal) trim() {
	cut := len(j.entries) - window
	if cut <= window/4 {
		return // not worth a pass yet
	}
	kept := j.entries[:0]
	for i, e := range j.entries {
		if i >= cut || (!e.Finished && !e.Interrupted) {
			kept = append(kept, e)
			continue
		}
		delete(j.byID, e.InvocationID)
	}
	clear(j.entries[len(kept):])
	j.entries = kept
	j.complete = false
}

// scan reads the whole log, oldest first, and returns the finished
// entries keep accepts (the others are not kept in memory while it
// reads), in the order they began.
func (j *Journal) scan(keep func(*Entry) bool) ([]*Entry, error) {
	t := newJournal(j.dir)
	t.keep = keep
	err := chainlog.Read(j.dir, func(file string, line []byte) error {
		j.linesRead++
		var r record
		if json.Unmarshal(line, &r) == nil {
			t.fold(file, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("history journal: %w", err)
	}
	var out []*Entry
	for _, e := range t.byID {
		if e.Finished {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *Entry) int { return cmp.Compare(a.began(), b.began()) })
	return out, nil
}

// intact checks the journal's chain (chainlog.Verify) and refuses the
// entry when one of its records is after the last line the chain
// vouches for (an edit, a removal, a tail that is not a crash's, at or
// before it): those records may be edited, and a local undo acts on
// them only once the journal is trusted again. It says which records,
// and what failed.
func (j *Journal) intact(e *Entry) error {
	rep, err := chainlog.Verify(j.dir)
	if err != nil {
		return fmt.Errorf("checking the chain of the history journal %s: %w", j.dir, err)
	}
	bad := untrusted(rep, e)
	if len(bad) == 0 {
		return nil // its records all come before the damage, and are chained
	}
	return fmt.Errorf("%s (%s): refused: the history journal %s fails its chain (%s), and the records of this change (%s) are at or after that place, so they may have been edited; nothing was changed. Run `metnos-agent history` to see the damage; a change recorded before it can still be undone",
		e.InvocationID, e.Executor, filepath.Join(j.dir, problemFile(rep)), rep, j.lineList(bad))
}

func problemFile(rep chainlog.Report) string {
	if rep.File != "" {
		return rep.File
	}
	return journalFile
}

// untrusted lists the records of e that rep's damage puts in doubt.
func untrusted(rep chainlog.Report, e *Entry) []recRef {
	if rep.OK() {
		return nil
	}
	var bad []recRef
	for _, at := range e.recs {
		if at.seq > rep.Good {
			bad = append(bad, at)
		}
	}
	return bad
}

// lineList names records by their line in their file: "line 4",
// "lines 1, 2", "journal_000002.jsonl line 3".
func (j *Journal) lineList(recs []recRef) string {
	var parts []string
	first := map[string]int64{} // the number of each file's first line
	for i, at := range recs {
		if _, ok := first[at.file]; !ok {
			first[at.file] = j.firstSeq(at.file)
		}
		s := strconv.FormatInt(at.seq-first[at.file]+1, 10)
		if i == 0 || at.file != recs[i-1].file {
			word := "line "
			if n := countIn(recs, at.file); n > 1 {
				word = "lines "
			}
			if at.file != journalFile {
				word = at.file + " " + word
			}
			s = word + s
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func countIn(recs []recRef, file string) int {
	n := 0
	for _, at := range recs {
		if at.file == file {
			n++
		}
	}
	return n
}

// firstSeq is the number of the first line of a segment (1 when it
// cannot be read).
func (j *Journal) firstSeq(file string) int64 {
	seq := int64(1)
	stop := errors.New("stop")
	chainlog.ReadFile(j.dir, file, func(line []byte) error {
		var r struct{ Seq int64 }
		if json.Unmarshal(line, &r) == nil && r.Seq > 0 {
			seq = r.Seq
		}
		return stop
	})
	return seq
}

// Untrusted verifies the journal's chain and lists the entries a local
// undo refuses because of what it found (see [Journal.Undo]): those with
// a record after the last line the chain vouches for, newest first,
// with the report. A segment verified before and unchanged since is
// not read again (chainlog.VerifyQuick); a local undo checks the
// whole chain.
func (j *Journal) Untrusted() (chainlog.Report, []string, error) {
	rep, err := chainlog.VerifyQuick(j.dir)
	if err != nil || rep.OK() {
		return rep, nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	// Every entry with a record after rep.Good: those begun after it,
	// read in, and those it names later.
	var named []string
	_, err = j.older(func(_ int, r *record) bool {
		if r.Seq > rep.Good {
			named = append(named, r.ID)
			named = append(named, r.IDs...)
		}
		return r.Seq <= rep.Good
	})
	if err != nil {
		return rep, nil, err
	}
	var ids []string
	for i := len(j.entries) - 1; i >= 0; i-- {
		if len(untrusted(rep, j.entries[i])) > 0 {
			ids = append(ids, j.entries[i].InvocationID)
		}
	}
	for _, id := range named {
		if id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return rep, ids, nil
}

// Begin is what [Journal.Begin] records of an invocation about to run.
type Begin struct {
	InvocationID, TurnID, Executor, ManifestSHA256 string
	// Reverse is the manifest's reverse_pattern list.
	Reverse []string
	// Roots are the sandbox's write grants (not the agent's own
	// folders): a local undo acts only inside them.
	Roots []string
	// Masks are the paths the sandbox hid (sandbox.Policy.Masks): a
	// local undo never acts on or under them.
	Masks []string
	// History is the agent's backup blob folder (<user data>/_history).
	History string
}

// Begin records that an invocation whose executor can write is about
// to run. It comes before the run, so that a crash during it leaves a
// trace ([Journal.Interrupt]).
func (j *Journal) Begin(b Begin) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := record{Kind: kindBegin, ID: b.InvocationID, TurnID: b.TurnID, Executor: b.Executor,
		ManifestSHA256: b.ManifestSHA256, Reverse: b.Reverse, Roots: b.Roots, Masks: b.Masks, History: b.History}
	if len(b.Masks) > 0 || b.History != "" {
		// The same for every run under one policy: written whole once
		// per segment.
		r.Masks = slices.Clip(slices.Clone(b.Masks))
		r.Policy = policyRec{Masks: r.Masks, History: b.History}.hash()
	}
	return j.write(r)
}

// Outcome is what [Journal.Finish] records of a run.
type Outcome struct {
	OK         bool
	ErrorClass string
	// Payload is the executor's output (its JSON object): the rows are
	// read from its "results", and its "dirs_created".
	Payload any
	// Args are the invocation's arguments: paths named there also make
	// the journal look at the entries they belong to.
	Args any
	// Recovered marks an outcome recorded only at a start after a crash,
	// from the spooled result: what the run left was looked at late,
	// after a user may have changed it. A local undo then replaces or
	// removes no file by that look (see [Entry.Recovered]).
	Recovered bool
	// Busy are the folders and files other runs still going may write
	// (the agent runs invocations side by side): an earlier change's
	// step whose path lies in one is not looked at, as what is there
	// may be that run's doing, for its own Finish to recognise.
	Busy []string
}

// ErrNotOpen is returned by [Journal.Finish] for an invocation that was
// not begun, or is already finished: not journaled.
var ErrNotOpen = errors.New("history journal: no open entry for this invocation")

// Finished is what [Journal.Finish] recorded.
type Finished struct {
	// Undid lists the earlier entries whose changes this run put back.
	Undid []string
	// KeptBlobs says whether the run kept backup blobs.
	KeptBlobs bool
}

// Finish records the outcome of a begun invocation, with the size and
// modification time of every file where the run left it (inside the
// entry's roots and outside its masks, each path looked at once, at most
// [hashBudget] bytes hashed: an overwritten file beyond is recorded
// without its hash, and a local undo keeps both versions), then looks
// whether the run put back changes of earlier entries (a reverse
// invocation from the server, or the same moves made again by hand)
// and marks those undone. An invocation not begun (not journaled), or
// finished already, gives [ErrNotOpen].
func (j *Journal) Finish(id string, o Outcome) (Finished, error) {
	j.mu.Lock()
	e := j.byID[id]
	open := e != nil && !e.Finished
	var perr error
	if open {
		perr = j.resolve(e)
	}
	j.mu.Unlock()
	if !open {
		return Finished{}, fmt.Errorf("%w: %s", ErrNotOpen, id)
	}
	rows, dirs := rowsOf(o.Payload)
	var f Finished
	// The rows are the executor's word: only paths a local undo could
	// act on are looked at (a row naming a path outside the grants, or
	// a hung network mount, must not hold the agent), each once.
	c := &confinement{roots: e.Roots, masks: e.Masks, resolved: map[string]string{}}
	if perr != nil {
		c.roots = nil // its masks are not known: nothing is looked at
	}
	h := newHasher()
	stats := map[string]*Stat{}
	for i := range rows {
		f.KeptBlobs = f.KeptBlobs || rows[i].hasBlob()
		p := rows[i].now()
		if p == "" {
			continue
		}
		st, seen := stats[p]
		if !seen {
			if _, _, _, err := c.locate(p); err == nil {
				st = statOf(p)
			}
			stats[p] = st
		}
		rows[i].Now = st
		if rows[i].overwrite() && st != nil && st.Kind == "file" {
			rows[i].NowSHA256 = h.sum(p, st.Size)
		}
	}
	ok := o.OK
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.write(record{Kind: kindChange, ID: id, OK: &ok, ErrorClass: o.ErrorClass, Rows: rows, DirsCreated: dirs, Recovered: o.Recovered}); err != nil {
		return f, err
	}
	if !j.recent {
		// The earlier changes a run may put back are among the newest
		// entries: read them once.
		if _, err := j.older(func(k int, _ *record) bool { return k >= window }); err != nil {
			return f, err
		}
		j.recent = true
	}
	var err error
	f.Undid, err = j.recognise(e, o.Args, o.Busy, h)
	j.trim()
	return f, err
}

// hashBudget is the most bytes one [Journal.Finish] hashes, its look
// at earlier entries included: a run's rows may name one huge file many
// times, or many huge files.
var hashBudget int64 = 1 << 30

// hasher hashes files once each, within a budget of bytes.
type hasher struct {
	sums map[string]string
	left int64
}

func newHasher() *hasher { return &hasher{sums: map[string]string{}, left: hashBudget} }

// sum is the hex SHA-256 of the regular file at p, "" when it is not
// one, unreadable, or larger than what is left of the budget (size is
// its size as just seen: a file too large is not opened).
func (h *hasher) sum(p string, size int64) string {
	if h == nil {
		return sha256File(p)
	}
	if s, ok := h.sums[p]; ok {
		return s
	}
	if size > h.left {
		h.sums[p] = ""
		return ""
	}
	s, n := sha256FileMax(p, h.left)
	h.left -= n
	h.sums[p] = s
	return s
}

// Interrupt records that a begun invocation was cut short by a crash:

// Interrupt records that a begun invocation was cut short by a crash:
// what it changed is not known.
func (j *Journal) Interrupt(id string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if e := j.byID[id]; e == nil || e.Finished || e.Interrupted {
		return nil
	}
	return j.write(record{Kind: kindInterrupted, ID: id})
}

// Unfinished lists the invocations begun and neither finished nor
// marked interrupted (after a crash: the agent decides which).
func (j *Journal) Unfinished() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var ids []string
	for _, e := range j.entries {
		if !e.Finished && !e.Interrupted {
			ids = append(ids, e.InvocationID)
		}
	}
	return ids
}

// Entries returns copies of all the entries, newest first, reading the
// whole journal: see [Journal.Newest] for the newest few.
func (j *Journal) Entries() []Entry {
	out, _ := j.Newest(0)
	return out
}

// Newest returns copies of the newest n entries (0: all), newest first,
// reading from the disk only as far back as they go.
func (j *Journal) Newest(n int) ([]Entry, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.newest(n)
	k := len(j.entries)
	if n > 0 {
		k = min(k, n)
	}
	out := make([]Entry, 0, k)
	for i := len(j.entries) - 1; i >= 0 && len(out) < k; i-- {
		out = append(out, j.entries[i].copy())
	}
	return out, err
}

// Entry returns a copy of the entry of an invocation, read from the
// disk when it is not among those in memory.
func (j *Journal) Entry(id string) (Entry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, _ := j.find(id)
	if e == nil {
		return Entry{}, false
	}
	return e.copy(), true
}

// Last returns the newest finished entry that has something left to
// undo here, did not itself put back another entry's changes, and was
// not left in conflict by a local undo (those are undone by their id,
// once the conflict is settled, so that older entries stay reachable).
// skipped lists the newer entries passed over for their conflicts. It
// reads the journal back only as far as it has to.
func (j *Journal) Last() (e Entry, skipped []string, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for n := 64; ; n *= 4 {
		err := j.newest(n)
		skipped = nil
		for i := len(j.entries) - 1; i >= 0; i-- {
			e := j.entries[i]
			if !e.Finished || len(e.Reverses) > 0 || e.left() == 0 {
				continue
			}
			if len(e.Conflicts) > 0 {
				skipped = append(skipped, e.InvocationID)
				continue
			}
			return e.copy(), skipped, true
		}
		if j.complete || err != nil {
			return Entry{}, skipped, false
		}
	}
}

func (e *Entry) copy() Entry {
	c := *e
	c.Undone = make(map[int]string, len(e.Undone))
	for k, v := range e.Undone {
		c.Undone[k] = v
	}
	c.Conflicts = slices.Clone(e.Conflicts)
	c.Reverses = slices.Clone(e.Reverses)
	c.recs = slices.Clone(e.recs)
	c.BlobsExpired = slices.Clone(e.BlobsExpired)
	return c
}

// Row is one result row that describes a change, in any of the shapes
// the upstream file executors write (docs/protocol.md §10.1, and
// metnos-protocol §6.7.1): a move from Src to Dst (with a backup of a
// replaced Dst in PrevBlobPath, or BlobPath, and Path set to Dst); a
// file or folder at Path that the run created (Created), overwrote
// (PrevBlobPath), left as it was (Skipped) or removed (Removed, with a
// backup blob for a file); with the blob's hash and the original
// file's mode and times when the executor gave them.
type Row struct {
	Src            string  `json:"src,omitempty"`
	Dst            string  `json:"dst,omitempty"`
	Path           string  `json:"path,omitempty"`
	Created        bool    `json:"created,omitempty"`
	Skipped        bool    `json:"skipped,omitempty"`
	Removed        bool    `json:"removed,omitempty"`
	BlobPath       string  `json:"blob_path,omitempty"`
	BlobSHA256     string  `json:"blob_sha256,omitempty"`
	PrevBlobPath   string  `json:"prev_blob_path,omitempty"`
	PrevBlobSHA256 string  `json:"prev_blob_sha256,omitempty"`
	RestoreMode    string  `json:"restore_mode,omitempty"`
	Mode           *uint32 `json:"mode,omitempty"`
	MtimeNS        *int64  `json:"mtime_ns,omitempty"`
	AtimeNS        *int64  `json:"atime_ns,omitempty"`
	Size           *int64  `json:"size,omitempty"`
	// Account marks a mail row (an IMAP move): not a file, skipped by
	// swap_src_dst as the server does.
	Account bool `json:"account,omitempty"`
	// Now is what the agent saw, after the run, at the path where the
	// row left a file: Dst for a move, Path for a created or
	// overwritten file (a folder for create_dirs).
	Now *Stat `json:"now,omitempty"`
	// NowSHA256 is the SHA-256 of the file an overwrite left at Path,
	// after the run: a local undo puts the old bytes back only over
	// these.
	NowSHA256 string `json:"now_sha256,omitempty"`
}

// blob is the backup the row names (blob_path, else prev_blob_path)
// and the SHA-256 it must have: blob_sha256, else prev_blob_sha256 (a
// "sha256:" prefix dropped), else the hash a content-addressed blob is
// named by (<sha256>.bin, as the shims name them).
func (r Row) blob() (path, sum string) {
	path = r.BlobPath
	if path == "" {
		path = r.PrevBlobPath
	}
	sum = r.BlobSHA256
	if sum == "" {
		sum = r.PrevBlobSHA256
	}
	sum = strings.ToLower(strings.TrimPrefix(sum, "sha256:"))
	if m := blobName().FindStringSubmatch(filepath.Base(path)); sum == "" && m != nil {
		sum = m[1]
	}
	return path, sum
}

// hasBlob reports whether the row names a backup at all (by path or by
// hash): the rows restore_blob_backup is about. The others (a created
// file, a skipped one) are not its and are skipped.
func (r Row) hasBlob() bool {
	return r.BlobPath != "" || r.PrevBlobPath != "" || r.BlobSHA256 != "" || r.PrevBlobSHA256 != ""
}

// overwrite reports whether the row is a file replaced in place (not a
// move): write_files over an existing file.
func (r Row) overwrite() bool {
	return r.Path != "" && r.Src == "" && r.Dst == "" && !r.Created && !r.Removed && !r.Skipped && r.hasBlob()
}

// blobName is how the shims name a blob: its SHA-256, in hex, .bin.
var blobName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9a-f]{64})\.bin$`) })

// now is the path where the row left a file, if any.
func (r Row) now() string {
	switch {
	case r.Src != "" && r.Dst != "" && r.Src != r.Dst:
		return r.Dst
	case r.Created && r.Path != "", r.overwrite():
		return r.Path
	}
	return ""
}

// Stat is what "unchanged since" compares: the kind, and for a file or
// link its size and modification time.
type Stat struct {
	Kind    string `json:"kind"` // file, dir, link, other
	Size    int64  `json:"size,omitempty"`
	MtimeNS int64  `json:"mtime_ns,omitempty"`
}

func statOf(p string) *Stat {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil
	}
	return stat(fi)
}

func stat(fi os.FileInfo) *Stat {
	s := &Stat{Kind: "other"}
	switch {
	case fi.Mode().IsRegular():
		s.Kind = "file"
	case fi.IsDir():
		return &Stat{Kind: "dir"} // its size and time change with its entries
	case fi.Mode()&os.ModeSymlink != 0:
		s.Kind = "link"
	}
	s.Size, s.MtimeNS = fi.Size(), fi.ModTime().UnixNano()
	return s
}

// rowsOf reads the change rows and created folders from an executor's
// output.
func rowsOf(payload any) ([]Row, []string) {
	m, _ := payload.(map[string]any)
	var rows []Row
	list, _ := m["results"].([]any)
	for _, v := range list {
		o, ok := v.(map[string]any)
		if !ok {
			continue
		}
		r := Row{
			Src: str(o["src"]), Dst: str(o["dst"]), Path: str(o["path"]),
			BlobPath: str(o["blob_path"]), BlobSHA256: str(o["blob_sha256"]),
			PrevBlobPath: str(o["prev_blob_path"]), PrevBlobSHA256: str(o["prev_blob_sha256"]),
			RestoreMode: str(o["restore_mode"]),
			Created:     o["created"] == true, Skipped: o["skipped"] == true, Removed: o["removed"] == true,
			MtimeNS: num(o["mtime_ns"]), AtimeNS: num(o["atime_ns"]), Size: num(o["size"]),
		}
		if _, ok := o["account"]; ok {
			r.Account = true
		}
		if n := num(o["mode"]); n != nil && *n >= 0 && *n <= 0o7777 {
			m := uint32(*n)
			r.Mode = &m
		}
		if r.Src == "" && r.Dst == "" && r.Path == "" {
			continue // nothing on the disk to put back
		}
		if r.Skipped && !r.Created && !r.hasBlob() {
			continue // write_files left an existing file as it was: no change
		}
		rows = append(rows, r)
	}
	var dirs []string
	dl, _ := m["dirs_created"].([]any)
	for _, v := range dl {
		if s := str(v); s != "" && !slices.Contains(dirs, s) {
			dirs = append(dirs, s)
		}
	}
	return rows, dirs
}

func str(v any) string { s, _ := v.(string); return s }

func num(v any) *int64 {
	var n int64
	switch x := v.(type) {
	case json.Number:
		i, err := strconv.ParseInt(string(x), 10, 64)
		if err != nil {
			return nil
		}
		n = i
	case float64:
		n = int64(x)
	case int64:
		n = x
	case int:
		n = int64(x)
	default:
		return nil
	}
	return &n
}
