package cli

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// writes records each Write call on its own, so that a test sees what
// each write to the journal's stream was.
type writes struct {
	mu sync.Mutex
	w  []string
}

func (w *writes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.w = append(w.w, string(p))
	return len(p), nil
}

func (w *writes) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.w...)
}

// textLine is the stringer of a value whose text spans lines.
type textLine string

func (t textLine) String() string { return string(t) }

// TestJournalHandler: for the journal each record is one write of one
// line, which begins with the priority prefix of its level and has no
// time; a message, key or value holding a newline, a carriage return or
// a NUL (where journald ends a line too) stays on that line.
func TestJournalHandler(t *testing.T) {
	for _, tt := range []struct {
		name   string
		level  slog.Level
		msg    string
		args   []any
		prefix string
		has    []string
	}{
		{name: "debug", level: slog.LevelDebug, msg: "polled", prefix: "<7>", has: []string{"level=DEBUG msg=polled"}},
		{name: "below debug", level: slog.LevelDebug - 4, msg: "x", prefix: "<7>"},
		{name: "info", level: slog.LevelInfo, msg: "started", args: []any{"version", "1.2.3"}, prefix: "<6>", has: []string{"level=INFO msg=started version=1.2.3\n"}},
		{name: "info+2", level: slog.LevelInfo + 2, msg: "x", prefix: "<6>", has: []string{"level=INFO+2"}},
		{name: "warn", level: slog.LevelWarn, msg: "slow", prefix: "<4>", has: []string{"level=WARN"}},
		{name: "error", level: slog.LevelError, msg: "stopped", prefix: "<3>", has: []string{"level=ERROR"}},
		{name: "error+4", level: slog.LevelError + 4, msg: "x", prefix: "<3>"},
		{name: "newline in the message", level: slog.LevelError, msg: "first\nsecond", prefix: "<3>", has: []string{`msg="first\nsecond"`}},
		{name: "newline in a value", level: slog.LevelInfo, msg: "ran", args: []any{"stderr", "a\nb\r\nc"}, prefix: "<6>", has: []string{`stderr="a\nb\r\nc"`}},
		{name: "NUL in a value", level: slog.LevelInfo, msg: "ran", args: []any{"out", "a\x00b"}, prefix: "<6>", has: []string{`out="a\x00b"`}},
		{name: "newline in a key", level: slog.LevelInfo, msg: "ran", args: []any{"k\ney", 1}, prefix: "<6>", has: []string{`"k\ney"=1`}},
		{name: "newline in an error", level: slog.LevelError, msg: "cannot start", args: []any{"err", errors.New("line one\nline two")}, prefix: "<3>", has: []string{`err="line one\nline two"`}},
		{name: "newline in a stringer", level: slog.LevelWarn, msg: "x", args: []any{"v", textLine("a\nb")}, prefix: "<4>", has: []string{`v="a\nb"`}},
		{name: "newline in bytes", level: slog.LevelWarn, msg: "x", args: []any{"b", []byte("a\nb")}, prefix: "<4>", has: []string{`b="a\nb"`}},
		{name: "newline in a group", level: slog.LevelInfo, msg: "x", args: []any{slog.Group("g\n", "k", "v\n")}, prefix: "<6>", has: []string{`"g\n.k"="v\n"`}},
		{name: "newline in a time value", level: slog.LevelInfo, msg: "x", args: []any{"time", "a\nb"}, prefix: "<6>", has: []string{`time="a\nb"`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var w writes
			log := slog.New(newJournalHandler(&w, slog.LevelDebug-8))
			log.Log(t.Context(), tt.level, tt.msg, tt.args...)
			got := w.all()
			if len(got) != 1 {
				t.Fatalf("%d writes, want 1: %q", len(got), got)
			}
			line := got[0]
			if !strings.HasPrefix(line, tt.prefix+"level=") || !strings.HasSuffix(line, "\n") || strings.Count(line, "\n") != 1 ||
				strings.ContainsAny(line, "\r\x00") {
				t.Errorf("%q: want one line beginning %q", line, tt.prefix+"level=")
			}
			if strings.HasPrefix(strings.TrimPrefix(line, tt.prefix), "time=") || strings.Contains(line, " time=20") {
				t.Errorf("%q: the journal stamps its own time", line)
			}
			for _, h := range tt.has {
				if !strings.Contains(line, h) {
					t.Errorf("%q: want %q in it", line, h)
				}
			}
		})
	}
}

// TestJournalHandlerDerived: the handlers WithAttrs and WithGroup derive
// write the same way, to the same stream, one whole line per record
// even when goroutines log at once; the level set still filters.
func TestJournalHandlerDerived(t *testing.T) {
	var w writes
	log := slog.New(newJournalHandler(&w, slog.LevelInfo))
	sub := log.With("run", "a\nb").WithGroup("g")
	log.Debug("not shown")
	sub.Info("hello", "k", 1)
	if got := w.all(); len(got) != 1 || got[0] != "<6>level=INFO msg=hello run=\"a\\nb\" g.k=1\n" {
		t.Fatalf("writes %q", got)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 100 {
				sub.Warn("busy", "g", g, "i", i, "pad", strings.Repeat("x", i))
			}
		})
	}
	wg.Wait()
	got := w.all()[1:]
	if len(got) != 400 {
		t.Fatalf("%d writes, want 400", len(got))
	}
	for _, l := range got {
		if !strings.HasPrefix(l, "<4>level=WARN msg=busy run=") || strings.Count(l, "\n") != 1 || !strings.HasSuffix(l, "\n") {
			t.Fatalf("write %q: not one whole line", l)
		}
	}
}

// TestJournalHandlerCutsLongLines: a line journald would split into
// several entries is cut, at a character's start, and says so.
func TestJournalHandlerCutsLongLines(t *testing.T) {
	var w writes
	slog.New(newJournalHandler(&w, slog.LevelInfo)).Error("huge", "out", strings.Repeat("é", journalLineMax))
	got := w.all()
	if len(got) != 1 {
		t.Fatalf("%d writes", len(got))
	}
	l := got[0]
	if len(l) > journalLineMax || !strings.HasPrefix(l, "<3>level=ERROR msg=huge") || !strings.HasSuffix(l, cutNote) ||
		strings.Count(l, "\n") != 1 || !utf8.ValidString(l) {
		t.Errorf("a line of %d bytes, beginning %q, ending %q: want at most %d, valid UTF-8, ending with the cut note",
			len(l), l[:min(len(l), 40)], l[max(0, len(l)-60):], journalLineMax)
	}
}

// TestJournalLines: run's sentences begin each line with the error
// prefix, however they are written.
func TestJournalLines(t *testing.T) {
	var b bytes.Buffer
	j := &journalLines{w: &b, prio: journalErr}
	for _, s := range []string{"metnos-agent: one\n", "metnos-agent: two\nthree\n", "four ", "goes on\n", "", "five"} {
		if n, err := j.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	want := "<3>metnos-agent: one\n<3>metnos-agent: two\n<3>three\n<3>four goes on\n<3>five"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

// TestStderrNotAFileIsNotTheJournal: a stderr that is not a file (a
// test's buffer) is never the journal, whatever JOURNAL_STREAM says, and
// keeps slog's text, with its time.
func TestStderrNotAFileIsNotTheJournal(t *testing.T) {
	std, _, _, errb := identityStd(t, false, "JOURNAL_STREAM", "1:2")
	s := stderrOf(std)
	if s.journal {
		t.Fatal("a buffer taken for the journal")
	}
	s.logger(slog.LevelInfo).Info("hello")
	if l := errb.String(); !strings.HasPrefix(l, "time=") || !strings.Contains(l, " level=INFO msg=hello\n") {
		t.Errorf("stderr %q: want slog's text line", l)
	}
}
