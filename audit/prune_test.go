package audit

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// writeDays writes perDay records on each of days consecutive days
// from first, and returns the open log.
func writeDays(t *testing.T, dir string, first time.Time, days, perDay int) *Log {
	t.Helper()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	for d := range days {
		for i := range perDay {
			at := first.Add(time.Duration(d)*24*time.Hour + time.Duration(i)*time.Minute)
			if err := l.Write(record(d*perDay+i, at)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return l
}

func dayFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := chainlog.Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestPruneKeepsRecentDays: ten days of three lines, a retention of
// five days: the days wholly past it go, the rest stays and verifies,
// and the log says what was pruned.
func TestPruneKeepsRecentDays(t *testing.T) {
	dir := t.TempDir()
	first := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC) // 20 to 29 November
	l := writeDays(t, dir, first, 10, 3)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

	p, err := l.Prune(5*24*time.Hour, now) // cut: 25 November, 12:00
	if err != nil {
		t.Fatal(err)
	}
	want := Pruned{Lines: 15, Files: 5, Before: "2026-11-25", RetentionDays: 5}
	if p != want {
		t.Errorf("Prune = %+v, want %+v", p, want)
	}
	got := dayFiles(t, dir)
	wantFiles := []string{"2026-11-25.jsonl", "2026-11-26.jsonl", "2026-11-27.jsonl", "2026-11-28.jsonl", "2026-11-29.jsonl"}
	if !slices.Equal(got, wantFiles) {
		t.Errorf("files after pruning = %v, want %v", got, wantFiles)
	}
	rep, err := Verify(dir)
	if err != nil || !rep.OK() || rep.Lines != 15 {
		t.Errorf("Verify after pruning = %v, %v; want intact, 15 lines", rep, err)
	}
	pr, ok, err := PrunedFrom(dir)
	if err != nil || !ok || pr != want {
		t.Errorf("PrunedFrom = %+v, %v, %v; want %+v", pr, ok, err, want)
	}
	if s := pr.String(); s != "15 older lines, of the days before 2026-11-25, were pruned (retention 5 days)" {
		t.Errorf("Pruned.String() = %q", s)
	}

	// Nothing more to remove the same day; the next day, one more file,
	// and the account is of everything removed.
	if p, err := l.Prune(5*24*time.Hour, now); err != nil || p != (Pruned{}) {
		t.Errorf("Prune again = %+v, %v; want nothing", p, err)
	}
	p, err = l.Prune(5*24*time.Hour, now.Add(24*time.Hour))
	if err != nil || p != (Pruned{Lines: 3, Files: 1, Before: "2026-11-26", RetentionDays: 5}) {
		t.Errorf("Prune a day later = %+v, %v; want 3 lines, 1 file", p, err)
	}
	if pr, _, _ := PrunedFrom(dir); pr != (Pruned{Lines: 18, Files: 6, Before: "2026-11-26", RetentionDays: 5}) {
		t.Errorf("PrunedFrom after two prunes = %+v, want 18 lines, 6 files", pr)
	}
	// The log goes on: a new line chains onto what is kept.
	if err := l.Write(record(99, now.Add(24*time.Hour))); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 13 {
		t.Errorf("Verify after a new line = %v, %v; want intact, 13 lines", rep, err)
	}
}

// TestPruneNeverTheLastFile: an agent that was off for two years keeps
// the file holding its last line, whatever its age.
func TestPruneNeverTheLastFile(t *testing.T) {
	dir := t.TempDir()
	first := time.Date(2024, 1, 1, 9, 0, 0, 0, time.UTC)
	l := writeDays(t, dir, first, 3, 2)
	p, err := l.Prune(365*24*time.Hour, first.Add(2*365*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if p.Lines != 4 || p.Files != 2 {
		t.Errorf("Prune = %+v, want 4 lines of 2 files", p)
	}
	if got := dayFiles(t, dir); !slices.Equal(got, []string{"2024-01-03.jsonl"}) {
		t.Errorf("files after pruning = %v, want the last one only", got)
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 2 {
		t.Errorf("Verify = %v, %v; want intact, 2 lines", rep, err)
	}
	// A retention of 0 (unset) removes nothing.
	if p, err := l.Prune(0, first.Add(5*365*24*time.Hour)); err != nil || p != (Pruned{}) {
		t.Errorf("Prune(0) = %+v, %v; want nothing", p, err)
	}
}

// TestPruneThenTamper: after pruning, an edit of a kept line, the
// removal of the first kept file, or the removal of its first line, is
// still found.
func TestPruneThenTamper(t *testing.T) {
	for _, tt := range []struct {
		name   string
		tamper func(t *testing.T, dir string)
		file   string
		line   int
	}{
		{"edited first kept line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "2026-11-25.jsonl")
			ls := lines(t, p)
			ls[0] = strings.Replace(ls[0], `"ok":true`, `"ok":false`, 1)
			put(t, p, ls)
		}, "2026-11-25.jsonl", 1},
		{"edited later line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "2026-11-27.jsonl")
			ls := lines(t, p)
			ls[1] = strings.Replace(ls[1], `"duration_ms":18`, `"duration_ms":1`, 1)
			put(t, p, ls)
		}, "2026-11-27.jsonl", 2},
		{"first kept line removed", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "2026-11-25.jsonl")
			put(t, p, lines(t, p)[1:])
		}, "2026-11-25.jsonl", 1},
		{"first kept file removed", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "2026-11-25.jsonl")); err != nil {
				t.Fatal(err)
			}
		}, "2026-11-26.jsonl", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			l := writeDays(t, dir, time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC), 10, 3)
			if _, err := l.Prune(5*24*time.Hour, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)); err != nil {
				t.Fatal(err)
			}
			tt.tamper(t, dir)
			rep, err := Verify(dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() || rep.File != tt.file || rep.Line != tt.line {
				t.Errorf("Verify = %v (file %q line %d); want a problem at %s line %d", rep, rep.File, rep.Line, tt.file, tt.line)
			}
		})
	}
}

// TestPruneAfterACrash: a crash after START was written but before the
// old files were removed leaves them behind; Verify passes over them,
// and the next prune removes them without counting them twice.
func TestPruneAfterACrash(t *testing.T) {
	dir := t.TempDir()
	l := writeDays(t, dir, time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC), 10, 3)
	left, err := os.ReadFile(filepath.Join(dir, "2026-11-21.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if _, err := l.Prune(5*24*time.Hour, now); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "2026-11-21.jsonl"), left, 0o600); err != nil {
		t.Fatal(err)
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 15 {
		t.Fatalf("Verify with a file a crash left = %v, %v; want intact, 15 lines", rep, err)
	}
	p, err := l.Prune(5*24*time.Hour, now.Add(24*time.Hour))
	if err != nil || p != (Pruned{Lines: 3, Files: 1, Before: "2026-11-26", RetentionDays: 5}) {
		t.Errorf("Prune after the crash = %+v, %v; want 3 lines, 1 file", p, err)
	}
	if got := dayFiles(t, dir); got[0] != "2026-11-26.jsonl" {
		t.Errorf("files after pruning = %v: the one a crash left is still there", got)
	}
	if pr, _, _ := PrunedFrom(dir); pr != (Pruned{Lines: 18, Files: 6, Before: "2026-11-26", RetentionDays: 5}) {
		t.Errorf("PrunedFrom = %+v, want 18 lines, 6 files", pr)
	}
}
