package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestOpenLogRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client.log")
	if err := os.WriteFile(path, make([]byte, maxLogBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := openLog(path, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, err := os.Stat(path + ".1"); err != nil || fi.Size() != maxLogBytes+1 {
		t.Fatalf("the big log was not rotated to .1: %v", err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Fatalf("the new log is not empty")
	}
}

// logLines reads the JSON lines of the log file at path, failing on a
// line that does not parse (two lines glued, or one split).
func logLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Errorf("%s does not end with a newline: %q", path, b[max(0, len(b)-40):])
	}
	var out []map[string]any
	for i, ln := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if ln == "" && len(b) == 0 {
			break
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ln), &m); err != nil {
			t.Errorf("%s line %d is not a JSON line (%v): %q", path, i+1, err, ln)
			continue
		}
		out = append(out, m)
	}
	return out
}

// TestLogRotatesWhileRunning: an agent that never restarts keeps its
// log within the limit: client.log is rotated to client.log.1 while
// running, each file stays under the limit, no line is split or glued
// even with several goroutines logging, and the newest lines are all
// there, across the rotation.
func TestLogRotatesWhileRunning(t *testing.T) {
	const limit = 4096
	path := filepath.Join(t.TempDir(), "client.log")
	var warn bytes.Buffer
	f, err := openLogLimit(path, limit, &warn)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log := newLogger(f, stderrLog{w: io.Discard}, slog.LevelInfo)

	// Concurrent logging: lines must stay whole.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				log.Info("invocation done", "g", g, "i", i, "pad", strings.Repeat("x", i%50))
			}
		})
	}
	wg.Wait()
	// Then one writer, numbered, to see that nothing is lost at a
	// rotation.
	const n = 300
	for i := range n {
		log.Info("numbered", "n", i)
	}

	for _, p := range []string{path, path + ".1"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("after %d lines: %v", 800+n, err)
		}
		if fi.Size() > limit {
			t.Errorf("%s is %d bytes, over the limit of %d: not rotated while running", p, fi.Size(), limit)
		}
	}
	old, cur := logLines(t, path+".1"), logLines(t, path)
	var got []int
	for _, m := range append(old, cur...) {
		if v, ok := m["n"].(float64); ok {
			got = append(got, int(v))
		}
	}
	if len(got) == 0 || got[len(got)-1] != n-1 {
		t.Fatalf("the last numbered line is not the newest in the log: %v", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i] != got[i-1]+1 {
			t.Fatalf("numbered lines %d and %d are next to each other in client.log.1 + client.log: lines lost at a rotation", got[i-1], got[i])
		}
	}
	if len(cur) == 0 || len(old) == 0 || len(got) < 2*limit/200 {
		t.Fatalf("the two files hold %d + %d lines (%d numbered): less than two limits' worth", len(old), len(cur), len(got))
	}
	if warn.Len() != 0 {
		t.Errorf("warned: %s", warn.String())
	}
}

// TestLogRotateFails: when client.log cannot be renamed, the log goes
// on in the file it has, every line kept, and says so once on stderr.
func TestLogRotateFails(t *testing.T) {
	const limit = 1024
	dir := t.TempDir()
	path := filepath.Join(dir, "client.log")
	// A folder with something in it where client.log.1 goes: the
	// rename fails.
	if err := os.MkdirAll(filepath.Join(path+".1", "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	var warn bytes.Buffer
	f, err := openLogLimit(path, limit, &warn)
	if err != nil {
		t.Fatal(err)
	}
	log := newLogger(f, stderrLog{w: io.Discard}, slog.LevelInfo)
	const n = 100 // about 10 limits' worth
	for i := range n {
		log.Info("numbered", "n", i)
	}
	f.Close()
	if got := len(logLines(t, path)); got != n {
		t.Errorf("client.log holds %d lines, want all %d", got, n)
	}
	if c := strings.Count(warn.String(), "could not rotate the log"); c != 1 {
		t.Errorf("the failed rotation was said %d times on stderr, want once: %q", c, warn.String())
	}
	if !strings.Contains(warn.String(), path) {
		t.Errorf("the warning does not name the log: %q", warn.String())
	}
}

// TestLogTornTail: a crash in the middle of a line leaves it without
// its newline; the next start must not glue its first line onto it.
func TestLogTornTail(t *testing.T) {
	whole := `{"time":"2026-12-03T10:00:00Z","level":"INFO","msg":"polling"}` + "\n"
	for _, tc := range []struct {
		name, tail string
		want       int // lines after one more is logged
	}{
		{"torn JSON line", `{"time":"2026-12-03T10:00:01Z","level":"INFO","msg":"invocation d`, 2},
		{"torn first line", "", 1},
		{"foreign bytes", `not a line of this log`, -1},
		{"whole", "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "client.log")
			content := whole + tc.tail
			if tc.name == "torn first line" {
				content = whole[:30]
			}
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := openLog(path, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			newLogger(f, stderrLog{w: io.Discard}, slog.LevelInfo).Info("started", "version", "test")
			f.Close()
			b, _ := os.ReadFile(path)
			if tc.want < 0 {
				// Kept as it is, on a line of its own.
				want := whole + tc.tail + "\n"
				if !strings.HasPrefix(string(b), want) || strings.Count(string(b), "\n") != 3 {
					t.Fatalf("foreign tail not kept on its own line:\n%s", b)
				}
				return
			}
			got := logLines(t, path)
			if len(got) != tc.want {
				t.Fatalf("%d lines, want %d:\n%s", len(got), tc.want, b)
			}
			if got[len(got)-1]["msg"] != "started" {
				t.Fatalf("the last line is not the new one:\n%s", b)
			}
		})
	}
}
