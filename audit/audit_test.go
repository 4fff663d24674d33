package audit

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/blake3"

	"github.com/metnos/agent/internal/chainlog"
)

var (
	day1 = time.Date(2026, 12, 1, 8, 14, 33, 881_000_000, time.UTC)
	day2 = day1.Add(24 * time.Hour)
)

const (
	file1 = "2026-12-01.jsonl"
	file2 = "2026-12-02.jsonl"
)

func record(i int, at time.Time) Record {
	return Record{
		Time:           at,
		InvocationID:   fmt.Sprintf("inv-%016x5c6a9839", i),
		TurnID:         "turn-1",
		Executor:       "fs_read",
		ManifestSHA256: strings.Repeat("ab", 32),
		Args:           map[string]any{"path": fmt.Sprintf("/home/u/notes/%d.md", i), "n": json.Number("3")},
		Output:         []byte(fmt.Sprintf(`{"text":"note %d"}`, i)),
		DurationMS:     18,
		OK:             true,
		Sandbox:        "bwrap+landlock+seccomp",
		Policy:         "pol1:0123456789abcdef",
	}
}

// writeLog writes three records on each of two days.
func writeLog(t *testing.T, dir string) {
	t.Helper()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 6 {
		at := day1
		if i >= 3 {
			at = day2
		}
		if err := l.Write(record(i, at.Add(time.Duration(i)*time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ls := strings.SplitAfter(string(b), "\n")
	return ls[:len(ls)-1] // after the last newline: ""
}

func put(t *testing.T, path string, ls []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(ls, "")), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestWriteLine(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := record(0, day1)
	r.OK, r.ErrorClass = false, "timeout"
	r.Args = map[string]any{"path": "/home/u/a.txt", "token": "hunter2"}
	if err := l.Write(r); err != nil {
		t.Fatal(err)
	}
	ls := lines(t, filepath.Join(dir, file1))
	if len(ls) != 1 {
		t.Fatalf("%d lines, want 1", len(ls))
	}
	sum := blake3.Sum256(r.Output)
	prefix := `{"seq":1,"prev":"` + strings.Repeat("0", 64) + `","time":"2026-12-01T08:14:33.881Z","invocation_id":"inv-00000000000000005c6a9839","turn_id":"turn-1",` +
		`"executor":"fs_read","manifest_sha256":"` + strings.Repeat("ab", 32) + `","args":{"path":"/home/u/a.txt","token":"` + want(`"hunter2"`) + `"},` +
		fmt.Sprintf(`"output":{"size":%d,"blake3":"blake3:%s"},`, len(r.Output), hex.EncodeToString(sum[:])) +
		`"duration_ms":18,"ok":false,"error_class":"timeout","sandbox":"bwrap+landlock+seccomp","policy_fingerprint":"pol1:0123456789abcdef"}` + "\n"
	if ls[0] != prefix {
		t.Fatalf("the line is\n%s\nwant\n%s", ls[0], prefix)
	}
	if err := l.Write(Record{Executor: "x"}); err == nil {
		t.Fatal("a record without an invocation id was written")
	}
}

func TestVerifyIntact(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir)
	rep, err := Verify(dir)
	if err != nil || !rep.OK() || rep.Lines != 6 || rep.Files != 2 || rep.Note != "" {
		t.Fatalf("Verify: %v, %v", rep, err)
	}
	// Reopened, the log goes on with the same chain.
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write(record(6, day2.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 7 {
		t.Fatalf("Verify after reopening: %v, %v", rep, err)
	}
	if _, err := Verify(filepath.Join(dir, "nothing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Verify of no log: %v, want ErrNotExist", err)
	}
}

func TestVerifyFindsTampering(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(t *testing.T, dir string)
		file   string
		line   int
		word   string
	}{
		{"edited args", func(t *testing.T, dir string) {
			p := filepath.Join(dir, file1)
			ls := lines(t, p)
			ls[1] = strings.Replace(ls[1], "/home/u/notes/1.md", "/home/u/notes/X.md", 1)
			put(t, p, ls)
		}, file1, 2, "edited"},
		{"edited ok", func(t *testing.T, dir string) {
			p := filepath.Join(dir, file2)
			ls := lines(t, p)
			ls[0] = strings.Replace(ls[0], `"ok":true`, `"ok":false`, 1)
			put(t, p, ls)
		}, file2, 1, "edited"},
		{"deleted line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, file1)
			ls := lines(t, p)
			put(t, p, append(ls[:1:1], ls[2:]...))
		}, file1, 2, "removed"},
		{"swapped lines", func(t *testing.T, dir string) {
			p := filepath.Join(dir, file1)
			ls := lines(t, p)
			ls[1], ls[2] = ls[2], ls[1]
			put(t, p, ls)
		}, file1, 2, "reordered"},
		{"deleted last line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, file2)
			ls := lines(t, p)
			put(t, p, ls[:2])
		}, file2, 2, "removed"},
		{"edited last line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, file2)
			ls := lines(t, p)
			ls[2] = strings.Replace(ls[2], `"duration_ms":18`, `"duration_ms":19`, 1)
			put(t, p, ls)
		}, file2, 3, "edited"},
		{"deleted earlier day", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, file1)); err != nil {
				t.Fatal(err)
			}
		}, file2, 1, "removed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeLog(t, dir)
			tt.tamper(t, dir)
			rep, err := Verify(dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() || rep.File != tt.file || rep.Line != tt.line || !strings.HasPrefix(rep.Problem, tt.word) {
				t.Fatalf("got %q at %s line %d, want %s at %s line %d", rep.Problem, rep.File, rep.Line, tt.word, tt.file, tt.line)
			}
		})
	}
}

func TestNoSecretInTheFiles(t *testing.T) {
	secrets := []string{
		"hunter2-is-my-password",
		"s3cr3t-client-value",
		"abcdef0123456789abcdef",
		"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
		"sk-proj-abc123DEF456ghi789JKL012mno",
		"ghp_1A2b3C4d5E6f7G8h9I0jK1l2M3n4O5p6Q7r8",
		"AKIAIOSFODNN7EXAMPLE",
		"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
		"b3BlbnNzaC1rZXktdjEAAAAA",
		"sessioncookievalue42",
		"flagvalue-0042",
	}
	const path = "/home/u/Photos/IMG_20240101_123456.jpg"
	args := []any{
		map[string]any{"path": path, "password": secrets[0]},
		map[string]any{"config": map[string]any{"client_secret": secrets[1], "retries": json.Number("3")}},
		map[string]any{"headers": map[string]any{"Authorization": "Bearer " + secrets[2]}},
		map[string]any{"items": []any{"ok", secrets[3], map[string]any{"deep": []any{secrets[4]}}}},
		map[string]any{"note": secrets[5], "env": []any{"AWS_ACCESS_KEY_ID=" + secrets[6]}},
		map[string]any{"AWS_SECRET_ACCESS_KEY": secrets[7], "other": secrets[7]},
		map[string]any{"key_file": "-----BEGIN OPENSSH PRIVATE KEY-----\n" + secrets[8] + "\n-----END OPENSSH PRIVATE KEY-----\n"},
		map[string]any{"cmd": "curl -H 'Cookie: session=" + secrets[9] + "' https://example.com"},
		map[string]any{"argv": []any{"tool", "--api-key", secrets[10]}},
	}
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range args {
		r := record(i, day1.Add(time.Duration(i)*time.Hour*5))
		r.Args = a
		if err := l.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	var all strings.Builder
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if !d.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			all.Write(b)
		}
		return nil
	})
	for _, s := range secrets {
		// As written, and as encoding/json would escape it.
		js, _ := json.Marshal(s)
		if strings.Contains(all.String(), s) || strings.Contains(all.String(), strings.Trim(string(js), `"`)) {
			t.Errorf("the secret %q is in the audit log", s)
		}
	}
	if !strings.Contains(all.String(), `"path":"`+path+`"`) {
		t.Errorf("the path %s is not in the audit log", path)
	}
	if n := strings.Count(all.String(), "redacted:blake3:"); n < len(secrets) {
		t.Errorf("%d placeholders, want at least %d", n, len(secrets))
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != int64(len(args)) {
		t.Fatalf("Verify: %v, %v", rep, err)
	}
}

func TestOneFileADay(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	rome := time.FixedZone("CET", 3600)
	times := []time.Time{
		time.Date(2026, 12, 1, 23, 59, 59, 999_000_000, time.UTC),
		time.Date(2026, 12, 2, 0, 30, 0, 0, rome), // 2026-12-01 23:30 UTC
		time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), // late: goes in the newest file
	}
	for i, at := range times {
		if err := l.Write(record(i, at)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	if ls := lines(t, filepath.Join(dir, file1)); len(ls) != 2 || !strings.Contains(ls[1], `"time":"2026-12-01T23:30:00.000Z"`) {
		t.Fatalf("%s: %q", file1, ls)
	}
	ls := lines(t, filepath.Join(dir, file2))
	if len(ls) != 2 || !strings.Contains(ls[1], `"time":"2026-12-01T12:00:00.000Z"`) {
		t.Fatalf("%s: %q", file2, ls)
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 4 || rep.Files != 2 {
		t.Fatalf("Verify: %v, %v", rep, err)
	}

	// A log that already has a newer file, reopened: the late record
	// still follows it.
	l, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write(record(4, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))); err != nil {
		t.Fatal(err)
	}
	// The zero time is now.
	before := time.Now().Truncate(time.Millisecond)
	if err := l.Write(record(5, time.Time{})); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	l.Close()
	var last struct{ Time time.Time }
	chainlog.Read(dir, func(_ string, line []byte) error { return json.Unmarshal(line, &last) })
	if last.Time.Before(before) || last.Time.After(after) || last.Time.Location() != time.UTC {
		t.Fatalf("the zero time was written as %v, not between %v and %v in UTC", last.Time, before, after)
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 6 {
		t.Fatalf("Verify: %v, %v", rep, err)
	}
}

// TestTwoWriters writes from two goroutines through each of two Logs
// open on one directory, as two processes would: every line lands, in
// one chain.
func TestTwoWriters(t *testing.T) {
	dir := t.TempDir()
	var logs [2]*Log
	for i := range logs {
		l, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		logs[i] = l
	}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			var err error
			for i := range 25 {
				if err == nil {
					err = logs[g%2].Write(record(g*100+i, day1.Add(time.Duration(i)*time.Hour)))
				}
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 100 {
		t.Fatalf("Verify: %v, %v", rep, err)
	}
}

// cutNext is the next cut after k in a line of n bytes.
func cutNext(k, n int) int {
	switch {
	case k < 90:
		return k + 1
	case k+11 < n-1:
		return k + 11
	case k < n-1:
		return n - 1
	}
	return n
}

// snapshot reads every file of the log in dir.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		if e.Name() == "LOCK" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// restore writes the files of a snapshot in a new folder.
func restore(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestTornTail: a crash while a line is being written leaves any part
// of it at the end of its day's file, without its newline (and HEAD as
// it was before). Restarted, the agent writes its next line on a line
// of its own: the log verifies, every line parses, and only the line
// never acknowledged is gone. Cut at every byte of the line, in three
// places: the last line of a day whose file is followed, after the
// restart, by the next day's (a crash at 23:59:59, a restart the next
// morning); the first line of a new day's file; and a day file that a
// later, empty file follows (the new day's file created, nothing in
// it yet).
func TestTornTail(t *testing.T) {
	late := time.Date(2026, 12, 1, 23, 59, 59, 500_000_000, time.UTC)
	morning := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		// torn is the time of the line the crash cuts short; empty
		// adds an empty file2 after the crash; next is the time of the
		// line written after the restart.
		torn, next time.Time
		empty      bool
	}{
		{"day file then next day", late, morning, false},
		{"first line of a day", morning, morning.Add(time.Hour), false},
		{"day file before an empty one", late, morning, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			l, err := Open(base)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if err := l.Write(record(i, day1.Add(time.Duration(i)*time.Minute))); err != nil {
					t.Fatal(err)
				}
			}
			before := snapshot(t, base)
			if err := l.Write(record(3, tc.torn)); err != nil {
				t.Fatal(err)
			}
			l.Close()
			file := tc.torn.Format(dayFormat) + chainlog.Ext
			full := snapshot(t, base)[file]
			line := full[len(before[file]):]
			// Every byte through the chain's head ({"seq":4,"prev":"<64
			// hex>"), where what is left is checked byte by byte, then
			// every 11th and the last (all but the newline): each cut
			// costs a write with its fsync.
			for k := 1; k < len(line); k = cutNext(k, len(line)) {
				files := maps.Clone(before)
				files[file] = append(slices.Clone(before[file]), line[:k]...)
				if tc.empty {
					files[file2] = nil
				}
				dir := restore(t, files)
				// Before the restart, verify calls it a crash, not an
				// edit.
				if rep, err := Verify(dir); err != nil || !rep.OK() || !strings.Contains(rep.Note, "cut short by a crash") {
					t.Fatalf("cut after %d of %d bytes, before the restart: Verify: %v, %v", k, len(line), rep, err)
				}
				l, err := Open(dir)
				if err != nil {
					t.Fatalf("cut after %d of %d bytes: Open: %v", k, len(line), err)
				}
				err = l.Write(record(4, tc.next))
				l.Close()
				if err != nil {
					t.Fatalf("cut after %d of %d bytes: Write: %v", k, len(line), err)
				}
				rep, err := Verify(dir)
				if err != nil || !rep.OK() || rep.Lines != 4 || rep.Note != "" {
					t.Fatalf("cut after %d of %d bytes: Verify: %v, %v", k, len(line), rep, err)
				}
				var ids []string
				err = chainlog.Read(dir, func(_ string, b []byte) error {
					var v struct {
						InvocationID string `json:"invocation_id"`
					}
					if err := json.Unmarshal(b, &v); err != nil {
						return fmt.Errorf("a line that does not parse (%v): %q", err, b)
					}
					ids = append(ids, v.InvocationID)
					return nil
				})
				want := []string{record(0, day1).InvocationID, record(1, day1).InvocationID, record(2, day1).InvocationID, record(4, day1).InvocationID}
				if err != nil || !slices.Equal(ids, want) {
					t.Fatalf("cut after %d of %d bytes: lines %v (%v), want %v", k, len(line), ids, err, want)
				}
			}
		})
	}
}
