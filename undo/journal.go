package undo

import (
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

// journalFile is the one file of the journal's chained log.
const journalFile = "journal" + chainlog.Ext

// Journal is the device's history of changes, open for appending.
type Journal struct {
	dir string
	log *chainlog.Log

	mu      sync.Mutex
	seq     int64             // the last line folded in
	line    int               // how many lines of the journal file were read or written
	entries []*Entry          // in the order they began
	byID    map[string]*Entry // by invocation id
	broken  error             // a record that could not be read
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

	// lines are the line numbers, in the journal file, of the records
	// about the entry (to refuse it when the chain fails at one).
	lines []int
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

// Open opens (creating) the journal in dir, <data_dir>/history, and
// reads it whole.
func Open(dir string) (*Journal, error) {
	j := &Journal{dir: dir, byID: map[string]*Entry{}}
	log, err := chainlog.Open(dir, chainlog.Options{Foreign: func(_ string, line []byte) {
		j.apply(line) // called with j.mu held, from append
	}})
	if err != nil {
		return nil, fmt.Errorf("history journal: %w", err)
	}
	j.log = log
	return j, j.read()
}

// Load reads the journal in dir without opening it for appending (for
// history listings); a journal that does not exist is empty. A journal
// whose file was removed while its HEAD says records were written is
// an error, not an empty history.
func Load(dir string) (*Journal, error) {
	if err := gone(dir); err != nil {
		return nil, err
	}
	j := &Journal{dir: dir, byID: map[string]*Entry{}}
	return j, j.read()
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

// read folds in every line of the journal.
func (j *Journal) read() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	err := chainlog.Read(j.dir, func(_ string, line []byte) error {
		j.apply(line)
		return nil
	})
	if err != nil {
		return fmt.Errorf("history journal: %w", err)
	}
	return nil
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

	// begin
	TurnID         string   `json:"turn_id,omitempty"`
	Executor       string   `json:"executor,omitempty"`
	ManifestSHA256 string   `json:"manifest_sha256,omitempty"`
	Reverse        []string `json:"reverse_patterns,omitempty"`

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

// apply folds one line into the entries. j.mu is held (or j is not yet
// shared).
func (j *Journal) apply(line []byte) {
	var r record
	if err := json.Unmarshal(line, &r); err != nil {
		j.line++
		if j.broken == nil {
			j.broken = fmt.Errorf("a record of %s is not readable (%v): edited?", filepath.Join(j.dir, journalFile), err)
		}
		return
	}
	// A line read at Open may be handed over again by the next append's
	// catching up: fold each once.
	if r.Seq != 0 && r.Seq <= j.seq {
		return
	}
	j.seq = r.Seq
	j.line++
	j.fold(r)
}

func (j *Journal) fold(r record) {
	e := j.byID[r.ID]
	defer func() {
		if e := j.byID[r.ID]; e != nil {
			e.lines = append(e.lines, j.line)
		}
		if r.Kind == kindExpired {
			for _, id := range r.IDs {
				if e := j.byID[id]; e != nil {
					e.lines = append(e.lines, j.line)
				}
			}
		}
	}()
	switch r.Kind {
	case kindBegin:
		if e != nil {
			return // begun again after a crash before its marker: keep the first
		}
		e = &Entry{InvocationID: r.ID, TurnID: r.TurnID, Executor: r.Executor, ManifestSHA256: r.ManifestSHA256,
			Reverse: r.Reverse, Roots: r.Roots, Masks: r.Masks, History: r.History, Began: r.Time, Undone: map[int]string{}}
		j.entries = append(j.entries, e)
		j.byID[r.ID] = e
	case kindChange:
		if e == nil {
			return
		}
		e.Finished, e.Interrupted, e.Ended = true, false, r.Time
		e.OK = r.OK != nil && *r.OK
		e.ErrorClass, e.Rows, e.DirsCreated, e.Recovered = r.ErrorClass, r.Rows, r.DirsCreated, r.Recovered
		e.Items = plan(e.Reverse, e.Rows, e.DirsCreated)
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
		} else if by := j.byID[r.By]; by != nil && !slices.Contains(by.Reverses, e.InvocationID) {
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

// write appends r and folds it in. j.mu is held.
func (j *Journal) write(r record) error {
	if j.log == nil {
		return errors.New("history journal: opened read-only")
	}
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	seq, err := j.log.Append(journalFile, r)
	if err != nil {
		return fmt.Errorf("history journal: %w", err)
	}
	j.seq = seq
	j.line++
	j.fold(r)
	return nil
}

// intact checks the journal's chain (chainlog.Verify) and refuses the
// entry when one of its records is at or after the first line that
// fails it, or the chain fails at the end of the file (a tail that is
// not a crash's): those records may be edited, and a local undo acts on
// them only once the journal is trusted again. It says which records,
// and what failed.
func (j *Journal) intact(e *Entry) error {
	rep, err := chainlog.Verify(j.dir)
	if err != nil {
		return fmt.Errorf("checking the chain of the history journal %s: %w", filepath.Join(j.dir, journalFile), err)
	}
	j.mu.Lock()
	bad := j.untrusted(rep, e)
	j.mu.Unlock()
	if len(bad) == 0 {
		return nil // its records all come before the damage, and are chained
	}
	return fmt.Errorf("%s (%s): refused: the history journal %s fails its chain (%s), and the records of this change (%s) are at or after that place, so they may have been edited; nothing was changed. Run `metnos-agent history` to see the damage; a change recorded before it can still be undone",
		e.InvocationID, e.Executor, filepath.Join(j.dir, journalFile), rep, lineList(bad))
}

// untrusted lists the lines of e's records that rep's damage puts in
// doubt. j.mu is held.
func (j *Journal) untrusted(rep chainlog.Report, e *Entry) []int {
	if rep.OK() {
		return nil
	}
	var bad []int
	for _, n := range e.lines {
		if rep.File != journalFile || n >= rep.Line || rep.Line > j.line {
			bad = append(bad, n)
		}
	}
	return bad
}

func lineList(lines []int) string {
	s := make([]string, len(lines))
	for i, n := range lines {
		s[i] = strconv.Itoa(n)
	}
	if len(lines) == 1 {
		return "line " + s[0]
	}
	return "lines " + strings.Join(s, ", ")
}

// Untrusted verifies the journal's chain and lists the entries a local
// undo refuses because of what it found (see [Journal.Undo]), newest
// first, with the report.
func (j *Journal) Untrusted() (chainlog.Report, []string, error) {
	rep, err := chainlog.Verify(j.dir)
	if err != nil {
		return rep, nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	var ids []string
	for i := len(j.entries) - 1; i >= 0; i-- {
		if len(j.untrusted(rep, j.entries[i])) > 0 {
			ids = append(ids, j.entries[i].InvocationID)
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
	return j.write(record{Kind: kindBegin, ID: b.InvocationID, TurnID: b.TurnID, Executor: b.Executor,
		ManifestSHA256: b.ManifestSHA256, Reverse: b.Reverse, Roots: b.Roots, Masks: b.Masks, History: b.History})
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
	var err error
	f.Undid, err = j.recognise(e, o.Args, h)
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

// Entries returns copies of the entries, newest first.
func (j *Journal) Entries() []Entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]Entry, 0, len(j.entries))
	for i := len(j.entries) - 1; i >= 0; i-- {
		out = append(out, j.entries[i].copy())
	}
	return out
}

// Entry returns a copy of the entry of an invocation.
func (j *Journal) Entry(id string) (Entry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e := j.byID[id]
	if e == nil {
		return Entry{}, false
	}
	return e.copy(), true
}

// Last returns the newest finished entry that has something left to
// undo here, did not itself put back another entry's changes, and was
// not left in conflict by a local undo (those are undone by their id,
// once the conflict is settled, so that older entries stay reachable).
// skipped lists the newer entries passed over for their conflicts.
func (j *Journal) Last() (e Entry, skipped []string, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
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
	return Entry{}, skipped, false
}

func (e *Entry) copy() Entry {
	c := *e
	c.Undone = make(map[int]string, len(e.Undone))
	for k, v := range e.Undone {
		c.Undone[k] = v
	}
	c.Conflicts = slices.Clone(e.Conflicts)
	c.Reverses = slices.Clone(e.Reverses)
	c.lines = slices.Clone(e.lines)
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
	if m := blobName.FindStringSubmatch(filepath.Base(path)); sum == "" && m != nil {
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
var blobName = regexp.MustCompile(`^([0-9a-f]{64})\.bin$`)

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
