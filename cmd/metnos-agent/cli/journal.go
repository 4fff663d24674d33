package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
	"unicode/utf8"
)

// Under a systemd service, `run`'s stderr is a stream to the journal,
// which makes one journal entry of each line, at priority info unless
// the line begins with an sd-daemon priority prefix (sd-daemon(3)), which
// journald (SyslogLevelPrefix=yes, its default) takes as the entry's
// PRIORITY and strips. So there, and only there, each line run writes to
// stderr begins with one, and log lines carry no time (the journal
// stamps its own).

// Priority prefixes of sd-daemon(3), for the journal.
const (
	journalErr   = "<3>"
	journalWarn  = "<4>"
	journalInfo  = "<6>"
	journalDebug = "<7>"
)

// journalLineMax bounds a line written to the journal: journald cuts a
// line longer than its LineMax (48 KiB by default) into several
// entries, the ones after the first at priority info; a longer line is
// cut here instead, and the log file keeps it whole.
const journalLineMax = 32 << 10

// cutNote ends a line cut at journalLineMax.
const cutNote = " …(cut; the log file has the whole line)\n"

// journalPriority is the sd-daemon prefix of level: warn and error
// (and above) keep their priority, info and its offsets below warn are
// info, and what is below info is debug.
func journalPriority(level slog.Level) string {
	switch {
	case level >= slog.LevelError:
		return journalErr
	case level >= slog.LevelWarn:
		return journalWarn
	case level >= slog.LevelInfo:
		return journalInfo
	}
	return journalDebug
}

// stderrLog is where `run` logs on stderr: w, and whether w is the
// journal (see [isJournalStream]).
type stderrLog struct {
	w       io.Writer
	journal bool
}

// stderrOf is std's stderr for the log: the journal when std.err is
// the file descriptor that JOURNAL_STREAM names.
func stderrOf(std stdio) stderrLog {
	f, ok := std.err.(*os.File)
	if !ok {
		return stderrLog{w: std.err}
	}
	e, _ := std.environment() // JOURNAL_STREAM is kept when the environment is refused
	return stderrLog{w: std.err, journal: isJournalStream(f, e.cfg.JournalStream)}
}

// handler is the handler of the stderr log, at level and above: slog's
// text handler, or for the journal a [journalHandler].
func (s stderrLog) handler(level slog.Level) slog.Handler {
	if s.journal {
		return newJournalHandler(s.w, level)
	}
	return slog.NewTextHandler(s.w, &slog.HandlerOptions{Level: level})
}

// logger is a logger on the stderr log alone, at level and above.
func (s stderrLog) logger(level slog.Level) *slog.Logger { return slog.New(s.handler(level)) }

// journalHandler is slog's text handler for a stderr that is the
// journal: each record is written as one line, in one write, that
// begins with the priority prefix of its level ([journalPriority]) and
// has no time=. The text handler quotes a message, key or value that
// holds a newline, a NUL or another control character (journald ends a
// line at a newline and at a NUL), so a record is never two entries; a
// line over journalLineMax is cut.
type journalHandler struct {
	text slog.Handler // writes into out.buf
	out  *journalOut
}

// journalOut is the writer and buffer the handlers derived from one
// journalHandler share.
type journalOut struct {
	mu  sync.Mutex
	w   io.Writer
	buf bytes.Buffer
}

// newJournalHandler returns a journalHandler writing to w at level and
// above.
func newJournalHandler(w io.Writer, level slog.Level) *journalHandler {
	out := &journalOut{w: w}
	return &journalHandler{text: slog.NewTextHandler(&out.buf, &slog.HandlerOptions{Level: level}), out: out}
}

// Enabled reports whether the handler logs records at level.
func (h *journalHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.text.Enabled(ctx, level)
}

// Handle writes r as one line: its priority prefix, then the text
// handler's line without the time.
func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Time = time.Time{} // the text handler leaves a zero time out
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	b := &h.out.buf
	b.Reset()
	b.WriteString(journalPriority(r.Level))
	if err := h.text.Handle(ctx, r); err != nil {
		return err
	}
	line := b.Bytes()
	if len(line) > journalLineMax {
		line = cutLine(line, journalLineMax)
	}
	_, err := h.out.w.Write(line)
	return err
}

// WithAttrs returns a journalHandler whose records have attrs too.
func (h *journalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &journalHandler{text: h.text.WithAttrs(attrs), out: h.out}
}

// WithGroup returns a journalHandler whose attributes go in group name.
func (h *journalHandler) WithGroup(name string) slog.Handler {
	return &journalHandler{text: h.text.WithGroup(name), out: h.out}
}

// cutLine cuts line (ending in a newline) to at most max bytes, at a
// character's start, ending it with cutNote.
func cutLine(line []byte, max int) []byte {
	n := max - len(cutNote)
	for n > 0 && !utf8.RuneStart(line[n]) {
		n--
	}
	return append(line[:n:n], cutNote...)
}

// journalLines is a stderr that is the journal, for the sentences run
// writes on it (its errors, not its log): it begins each line with
// prio. It is safe for concurrent use; each Write is one write to w.
type journalLines struct {
	w    io.Writer
	prio string

	mu      sync.Mutex
	midLine bool // the last Write did not end its line
	buf     []byte
}

// Write writes p to w with prio at the start of each of its lines.
func (j *journalLines) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := j.buf[:0]
	for rest := p; len(rest) > 0; {
		if !j.midLine {
			out = append(out, j.prio...)
		}
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			out = append(out, rest...)
			j.midLine = true
			break
		}
		out = append(out, rest[:i+1]...)
		rest = rest[i+1:]
		j.midLine = false
	}
	j.buf = out[:0]
	if _, err := j.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
