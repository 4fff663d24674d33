// Package audit keeps the device's local audit log: one JSON line per
// invocation the agent ran, in a file a day (YYYY-MM-DD.jsonl, by UTC
// date) in <data dir>/audit, written with [chainlog] so that each line
// holds the hash of the one before it. A line looks like
//
//	{"seq":12,"prev":"<64 hex>","time":"2026-12-02T08:14:33.881Z",
//	 "invocation_id":"inv-18ed65bd51bdc701fcd26b58","turn_id":"turn-1",
//	 "executor":"fs_read","manifest_sha256":"<64 hex>",
//	 "args":{"path":"/home/u/notes.md","token":"redacted:blake3:9f0c…"},
//	 "output":{"size":4231,"blake3":"blake3:<64 hex>"},"duration_ms":18,
//	 "ok":true,"sandbox":"bwrap+landlock+seccomp","policy_fingerprint":"pol1:…"}
//
// (on one line). The invocation and turn ids are the server's, so each
// line can be matched with the server's own record of the invocation.
// An invocation the device owner's limits refused before it ran says so
// ("refused_by"), and one that ran under an owner's mode other than full
// says which ("owner_mode"). The log also holds the changes to the
// owner's limits file, one line each ([Log.WriteLimits]), in the same
// chain; [OwnerEvents] reads those and the refusals back.
//
// What is guaranteed: a line is on disk before [Log.Write] returns; the
// log is only appended to (a line cut short by a crash is dropped);
// [Verify] finds the first line that was edited, removed or moved,
// whole files included, and the last lines too (through the HEAD file
// beside them; a log without HEAD is reported); the arguments are written only through [Redact],
// and the output only as its size and blake3 hash.
//
// What is not: the log is tamper-evident, not tamper-proof. The chain
// has no secret key, so whoever can write the files can rewrite the
// whole chain consistently, or remove the directory; Verify proves
// only that the files are as some writer of the chain left them.
// [Log.Prune] removes whole day files past a retention (the agent's is
// METNOS_AUDIT_RETENTION_DAYS, a year by default): what is kept still
// verifies, and [PrunedFrom] says how many lines were removed, of the
// days before which one. Redaction goes by key name
// and by the shape of values: a secret under an innocent key in an
// innocent shape (a password in a "note" field) is written as it is. A
// placeholder is an unsalted hash, so a guessable secret (a short
// password) can be found from it by trying candidates.
package audit

import (
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"github.com/metnos/agent/internal/chainlog"
)

// Record is one invocation, as [Log.Write] records it.
type Record struct {
	// Time is when the invocation ended; it is written as "time", in
	// RFC 3339 with milliseconds, in UTC. The zero Time means now.
	Time time.Time
	// InvocationID and TurnID are the server's ids of the invocation
	// and of the turn that asked for it ("invocation_id", "turn_id").
	InvocationID string
	TurnID       string
	// Executor is the executor's name and ManifestSHA256 the digest of
	// its signed manifest ("executor", "manifest_sha256").
	Executor       string
	ManifestSHA256 string
	// Args are the invocation's arguments; they are written only as
	// [Redact] returns them ("args").
	Args any
	// Output is what the executor returned. It is not written: only
	// its size and blake3 hash are ("output").
	Output []byte
	// DurationMS is how long the invocation ran ("duration_ms").
	DurationMS int64
	// OK says whether it succeeded ("ok"), and ErrorClass, when it did
	// not, how it failed ("error_class").
	OK         bool
	ErrorClass string
	// Sandbox names the isolation actually applied ("sandbox"), and
	// Policy is the fingerprint of the sandbox Policy
	// ("policy_fingerprint").
	Sandbox string
	Policy  string
	// Network is what the run's egress proxy allowed and refused
	// ("network"), for a run whose network was narrowed to the hosts
	// its manifest names; nil for any other.
	Network *Network
	// RefusedBy says who refused the invocation before it ran, and by
	// which rule, when the device owner's limits did ("refused_by").
	RefusedBy string
	// OwnerMode is the owner's mode the invocation was handled under,
	// when it is not full ("owner_mode").
	OwnerMode string
	// DryRun says the run was a dry run ("dry_run": true): its writes
	// went to a layer that was thrown away, and nothing changed on disk.
	DryRun bool
}

// Network is a run's egress proxy's account, as the audit line holds it.
type Network struct {
	// Proxy is where the command found the proxy.
	Proxy string `json:"proxy"`
	// Enforced is false where the sandbox could not keep the command
	// from going around the proxy (Windows).
	Enforced bool `json:"enforced"`
	// Refused counts the refused connections.
	Refused int `json:"refused"`
	// Conns are the connections, in order: at most [MaxConns], the
	// rest counted in More.
	Conns []Conn `json:"conns"`
	More  int    `json:"more,omitempty"`
}

// MaxConns is how many connections of one run an audit line lists.
const MaxConns = 200

// Conn is one connection through a run's egress proxy.
type Conn struct {
	Proto   string `json:"proto"`
	Host    string `json:"host"`
	Port    uint16 `json:"port"`
	Addr    string `json:"addr,omitempty"`
	Up      int64  `json:"up"`
	Down    int64  `json:"down"`
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
}

// line is a Record as written, in this order, after chainlog's seq and
// prev.
type line struct {
	Time           string   `json:"time"`
	InvocationID   string   `json:"invocation_id"`
	TurnID         string   `json:"turn_id,omitempty"`
	Executor       string   `json:"executor"`
	ManifestSHA256 string   `json:"manifest_sha256"`
	Args           any      `json:"args"`
	Output         output   `json:"output"`
	DurationMS     int64    `json:"duration_ms"`
	OK             bool     `json:"ok"`
	ErrorClass     string   `json:"error_class,omitempty"`
	Sandbox        string   `json:"sandbox"`
	Policy         string   `json:"policy_fingerprint,omitempty"`
	Network        *Network `json:"network,omitempty"`
	RefusedBy      string   `json:"refused_by,omitempty"`
	OwnerMode      string   `json:"owner_mode,omitempty"`
	DryRun         bool     `json:"dry_run,omitempty"`
}

type output struct {
	Size   int    `json:"size"`
	BLAKE3 string `json:"blake3"`
}

// timeFormat is RFC 3339 with milliseconds; in UTC it ends in "Z".
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

// dayFormat names a day's file, before [chainlog.Ext].
const dayFormat = "2006-01-02"

// Log is an open audit log. Its methods may be called from several
// goroutines, and several processes may write one log.
type Log struct {
	dir string
	log *chainlog.Log

	mu sync.Mutex
	// last is the newest file of the log, this process's or another's:
	// the file a line goes in is never older, so the chain stays in
	// the order of the file names.
	last string
}

// Open opens the audit log in dir (<data dir>/audit), creating it when
// needed.
func Open(dir string) (*Log, error) {
	l := &Log{dir: dir}
	cl, err := chainlog.Open(dir, chainlog.Options{
		// Called during Append, which Write calls holding l.mu.
		Foreign: func(file string, _ []byte) { l.last = max(l.last, file) },
	})
	if err != nil {
		return nil, fmt.Errorf("opening the audit log: %w", err)
	}
	l.log = cl
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("opening the audit log %s: %w", dir, err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), chainlog.Ext) {
			l.last = max(l.last, e.Name())
		}
	}
	return l, nil
}

// Write appends r to the log, in the file of r.Time's UTC day, and
// returns once it is on disk. A record whose day comes before the
// newest file's (a clock set back, a late record) goes in the newest
// file, with its own time.
func (l *Log) Write(r Record) error {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	if r.InvocationID == "" {
		return fmt.Errorf("audit log %s: a record without an invocation id", l.dir)
	}
	sum := blake3.Sum256(r.Output)
	ln := line{
		Time:           r.Time.UTC().Format(timeFormat),
		InvocationID:   r.InvocationID,
		TurnID:         r.TurnID,
		Executor:       r.Executor,
		ManifestSHA256: r.ManifestSHA256,
		Args:           Redact(r.Args),
		Output:         output{Size: len(r.Output), BLAKE3: "blake3:" + hex.EncodeToString(sum[:])},
		DurationMS:     r.DurationMS,
		OK:             r.OK,
		ErrorClass:     r.ErrorClass,
		Sandbox:        r.Sandbox,
		Policy:         r.Policy,
		Network:        capConns(r.Network),
		RefusedBy:      r.RefusedBy,
		OwnerMode:      r.OwnerMode,
		DryRun:         r.DryRun,
	}
	if err := l.append(r.Time, ln); err != nil {
		return fmt.Errorf("writing the audit record of %s: %w", r.InvocationID, err)
	}
	return nil
}

// append appends the line ln of a record of time t, in the file of t's
// UTC day, or in the newest file when that is later.
func (l *Log) append(t time.Time, ln any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	day := t.UTC().Format(dayFormat) + chainlog.Ext
	for {
		file := max(day, l.last)
		_, err := l.log.Append(file, ln)
		if err == nil {
			l.last = file
			return nil
		}
		if l.last <= file {
			return err
		}
		// Another process began a newer file since this one last
		// looked (Append saw it and refused to write before it): go
		// in that one.
	}
}

// Close closes the log; Write may not be called after it.
func (l *Log) Close() error {
	if err := l.log.Close(); err != nil {
		return fmt.Errorf("closing the audit log %s: %w", l.dir, err)
	}
	return nil
}

// Verify reads the whole audit log in dir and reports the first line
// that was edited, removed or moved (see [chainlog.Verify]). It does not
// check what the lines say, only that they are the lines written. An
// error, such as a dir that does not exist ([os.ErrNotExist]), means the
// log could not be read.
func Verify(dir string) (chainlog.Report, error) {
	rep, err := chainlog.Verify(dir)
	if err != nil {
		return rep, fmt.Errorf("verifying the audit log: %w", err)
	}
	return rep, nil
}

// capConns is n with at most MaxConns connections listed.
func capConns(n *Network) *Network {
	if n == nil || len(n.Conns) <= MaxConns {
		return n
	}
	c := *n
	c.More += len(c.Conns) - MaxConns
	c.Conns = c.Conns[:MaxConns]
	return &c
}
