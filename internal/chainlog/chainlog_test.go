package chainlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// write appends n records across the files named, in turn.
func write(t *testing.T, dir string, n int, names ...string) {
	t.Helper()
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := names[i*len(names)/n]
		if _, err := l.Append(name, map[string]any{"i": i, "text": fmt.Sprintf("record %d", i)}); err != nil {
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
	return strings.SplitAfter(string(b), "\n")[:bytes.Count(b, []byte("\n"))]
}

func put(t *testing.T, path string, ls []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(ls, "")), 0o600); err != nil {
		t.Fatal(err)
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
		{"intact", func(*testing.T, string) {}, "", 0, ""},
		{"edited middle line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "a.jsonl")
			ls := lines(t, p)
			ls[2] = strings.Replace(ls[2], "record 2", "record X", 1)
			put(t, p, ls)
		}, "a.jsonl", 3, "edited"},
		{"removed middle line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "a.jsonl")
			ls := lines(t, p)
			put(t, p, append(ls[:3:3], ls[4:]...))
		}, "a.jsonl", 4, "removed"},
		{"swapped lines", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "a.jsonl")
			ls := lines(t, p)
			ls[1], ls[2] = ls[2], ls[1]
			put(t, p, ls)
		}, "a.jsonl", 2, "reordered"},
		{"line moved to the next file", func(t *testing.T, dir string) {
			p, q := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
			ls, ms := lines(t, p), lines(t, q)
			put(t, q, append([]string{ls[1]}, ms...))
			put(t, p, append(ls[:1:1], ls[2:]...))
		}, "a.jsonl", 2, "reordered"},
		{"removed last line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "b.jsonl")
			ls := lines(t, p)
			put(t, p, ls[:len(ls)-1])
		}, "b.jsonl", 4, "removed"},
		{"edited last line", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "b.jsonl")
			ls := lines(t, p)
			ls[len(ls)-1] = strings.Replace(ls[len(ls)-1], "record 9", "record 0", 1)
			put(t, p, ls)
		}, "b.jsonl", 5, "edited"},
		{"whole first file removed", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "a.jsonl"))
		}, "b.jsonl", 1, "removed"},
		{"last line and HEAD removed", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "b.jsonl")
			ls := lines(t, p)
			put(t, p, ls[:len(ls)-1])
			os.Remove(filepath.Join(dir, "HEAD"))
		}, "b.jsonl", 4, "the HEAD file is missing"},
		{"not JSON", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "a.jsonl")
			ls := lines(t, p)
			ls[0] = "garbage\n"
			put(t, p, ls)
		}, "a.jsonl", 1, "edited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, 10, "a.jsonl", "b.jsonl")
			tt.tamper(t, dir)
			rep, err := Verify(dir)
			if err != nil {
				t.Fatal(err)
			}
			if tt.word == "" {
				if !rep.OK() || rep.Lines != 10 || rep.Files != 2 {
					t.Fatalf("an intact log: %v", rep)
				}
				return
			}
			if rep.OK() || rep.File != tt.file || rep.Line != tt.line || !strings.HasPrefix(rep.Problem, tt.word) {
				t.Fatalf("got %q (%s line %d), want %s at %s line %d", rep.Problem, rep.File, rep.Line, tt.word, tt.file, tt.line)
			}
		})
	}
}

func TestTornTailIsDroppedAndTheChainGoesOn(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, 3, "j.jsonl")
	p := filepath.Join(dir, "j.jsonl")
	lines, _ := os.ReadFile(p)
	last := lines[bytes.LastIndexByte(lines[:len(lines)-1], '\n')+1:]
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":4,"prev":"` + Hash(last)[:10]) // a crash mid-append
	f.Close()
	if rep, _ := Verify(dir); !rep.OK() || rep.Note == "" {
		t.Fatalf("a torn tail is a crash, not tampering, and is said: %v", rep)
	}
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if seq, err := l.Append("j.jsonl", map[string]any{"after": "crash"}); err != nil || seq != 4 {
		t.Fatalf("append after the crash: seq %d, %v", seq, err)
	}
	if rep, _ := Verify(dir); !rep.OK() || rep.Lines != 4 || rep.Note != "" {
		t.Fatalf("after reopening: %v", rep)
	}
}

// TestOnlyATornLineIsCutOff: the end of a log without its newline is
// dropped only when it is the beginning of the line that would come
// next (what a crash while appending leaves); binary garbage, or a
// line that is not the next one, is tampering: Verify says so, Open
// and a process appending refuse, and the file is left as it was.
func TestOnlyATornLineIsCutOff(t *testing.T) {
	full := func(t *testing.T, dir string) []byte {
		// The line a fourth Append would write, whole.
		t.Helper()
		tmp := t.TempDir()
		b, _ := os.ReadFile(filepath.Join(dir, "j.jsonl"))
		os.WriteFile(filepath.Join(tmp, "j.jsonl"), b, 0o600)
		l, err := Open(tmp, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append("j.jsonl", map[string]any{"i": 3, "text": "record \u00e9 3"}); err != nil {
			t.Fatal(err)
		}
		all, _ := os.ReadFile(filepath.Join(tmp, "j.jsonl"))
		return all[len(b) : len(all)-1]
	}
	for _, tt := range []struct {
		name string
		tail func(next []byte) []byte
		torn bool
	}{
		{"cut in the chain fields", func(next []byte) []byte { return next[:30] }, true},
		{"cut in the record", func(next []byte) []byte { return next[:len(next)-4] }, true},
		{"cut in a character", func(next []byte) []byte { return next[:bytes.Index(next, []byte("\xc3"))+1] }, true},
		{"whole but its newline", func(next []byte) []byte { return next }, true},
		{"binary garbage", func([]byte) []byte { return []byte("\x00\x01\xfe\xffPK\x03\x04garbage") }, false},
		{"another line's start", func(next []byte) []byte { return bytes.Replace(next[:40], []byte(`"seq":4`), []byte(`"seq":9`), 1) }, false},
		{"a line then garbage", func(next []byte) []byte { return append(slices.Clone(next), "xx"...) }, false},
		{"JSON that is not a prefix", func(next []byte) []byte { return append(slices.Clone(next[:len(next)-1]), "]]"...) }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, 3, "j.jsonl")
			p := filepath.Join(dir, "j.jsonl")
			tail := tt.tail(full(t, dir))
			// Another process has the log open, and appends after the tail.
			other, err := Open(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			f.Write(tail)
			f.Close()
			before, _ := os.ReadFile(p)
			rep, err := Verify(dir)
			if err != nil || rep.OK() != tt.torn {
				t.Fatalf("Verify: %v, %v", rep, err)
			}
			// Check, which only reads, refuses what Open refuses, with
			// the same words, and changes nothing.
			chk := Check(dir)
			if after, _ := os.ReadFile(p); !bytes.Equal(after, before) {
				t.Fatal("Check changed the file")
			}
			if (chk == nil) != tt.torn {
				t.Fatalf("Check: %v", chk)
			}
			_, cerr := other.Append("j.jsonl", map[string]any{"by": "other"})
			if tt.torn {
				if cerr != nil {
					t.Fatalf("append after a torn line: %v", cerr)
				}
				if _, err := Open(dir, Options{}); err != nil {
					t.Fatal(err)
				}
				if rep, _ := Verify(dir); !rep.OK() || rep.Lines != 4 {
					t.Fatalf("after the torn line was cut: %v", rep)
				}
				return
			}
			if cerr == nil || !strings.Contains(cerr.Error(), "j.jsonl") {
				t.Fatalf("append after a tampered tail: %v", cerr)
			}
			_, err = Open(dir, Options{})
			if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "not a crash") {
				t.Fatalf("Open of a tampered tail: %v", err)
			}
			if chk.Error() != err.Error() {
				t.Errorf("Check says %q, Open %q", chk, err)
			}
			if len(err.Error()) > 400 || strings.ContainsAny(err.Error(), "\x00\x01\xfe\xff") || !strings.Contains(err.Error(), "cut j.jsonl after its last good line") {
				t.Errorf("Open: %q: want a short escaped excerpt and what to do", err)
			}
			if after, _ := os.ReadFile(p); !bytes.Equal(after, before) {
				t.Fatal("the tampered file was changed")
			}
		})
	}
}

func TestRecordsCannotForgeTheChain(t *testing.T) {
	l, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []any{map[string]any{"seq": 9}, map[string]any{"prev": "00"}, []int{1}, "x"} {
		if _, err := l.Append("j.jsonl", rec); err == nil {
			t.Errorf("%v was appended", rec)
		}
	}
}

func TestLongLines(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 3<<20)
	for i := range 3 {
		if _, err := l.Append("j.jsonl", map[string]any{"i": i, "big": big}); err != nil {
			t.Fatal(err)
		}
	}
	l2, err := Open(dir, Options{}) // finds the last 3 MiB line backwards
	if err != nil || l2.Seq() != 3 {
		t.Fatalf("reopened: seq %d, %v", l2.Seq(), err)
	}
	if _, err := l2.Append("j.jsonl", map[string]any{"i": 3}); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := Read(dir, func(_ string, line []byte) error { n++; return nil }); err != nil || n != 4 {
		t.Fatalf("Read: %d lines, %v", n, err)
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 4 {
		t.Fatalf("Verify: %v %v", rep, err)
	}
}

// TestSeveralProcesses appends from this process and two others at
// once: every line lands once, numbered without gaps, the chain holds,
// and each process was told of the others' lines.
func TestSeveralProcesses(t *testing.T) {
	if dir := os.Getenv("CHAINLOG_HELPER_DIR"); dir != "" {
		l, err := Open(dir, Options{})
		if err != nil {
			os.Exit(2)
		}
		for i := range 200 {
			if _, err := l.Append("j.jsonl", map[string]any{"pid": os.Getpid(), "i": i}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		os.Exit(0)
	}
	dir := t.TempDir()
	var mu sync.Mutex
	foreign := 0
	l, err := Open(dir, Options{Foreign: func(_ string, line []byte) {
		mu.Lock()
		foreign++
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSeveralProcesses$")
		cmd.Env = append(os.Environ(), "CHAINLOG_HELPER_DIR="+dir)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i := range 200 {
		if _, err := l.Append("j.jsonl", map[string]any{"pid": os.Getpid(), "i": i}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("helper: %v", err)
		}
	}
	// One more append sees whatever the helpers wrote last.
	if _, err := l.Append("j.jsonl", map[string]any{"last": true}); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir)
	if err != nil || !rep.OK() || rep.Lines != 601 {
		t.Fatalf("Verify: %v %v", rep, err)
	}
	if foreign != 400 {
		t.Fatalf("this process was told of %d lines of the others, want 400", foreign)
	}
	seen := map[string]bool{}
	Read(dir, func(_ string, line []byte) error {
		var v struct{ Pid, I *int }
		if json.Unmarshal(line, &v) == nil && v.Pid != nil {
			seen[fmt.Sprint(*v.Pid, *v.I)] = true
		}
		return nil
	})
	if len(seen) != 600 {
		t.Fatalf("%d distinct records, want 600", len(seen))
	}
}

// A complete last line that is not a record is refused by Open and
// Check alike, with a short escaped excerpt and what to do.
func TestALastLineThatIsNotARecord(t *testing.T) {
	for _, junk := range []string{"garbage", `{"v":1,"kind":"garbage"}`, "\x1b]0;pwn\a" + strings.Repeat("\xfe", 300)} {
		dir := t.TempDir()
		write(t, dir, 2, "j.jsonl")
		p := filepath.Join(dir, "j.jsonl")
		f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		f.WriteString(junk + "\n")
		f.Close()
		_, err := Open(dir, Options{})
		chk := Check(dir)
		if err == nil || chk == nil || err.Error() != chk.Error() {
			t.Fatalf("%q: Open %v, Check %v", junk, err, chk)
		}
		msg := err.Error()
		if strings.Count(msg, p) != 1 || !strings.Contains(msg, "not a record of this log") || !strings.Contains(msg, "move it away") ||
			len(msg) > 400 || strings.ContainsAny(msg, "\x1b\a\xfe") {
			t.Errorf("%q: %q", junk, msg)
		}
	}
}

// A log file that is a folder is an error naming it, not an empty log;
// a log folder whose path goes through a file is named once; a log
// whose files are gone while HEAD names lines is Gone.
func TestLogsThatCannotBeRead(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, 2, "j.jsonl")
	if seq, _, err := Gone(dir); seq != 0 || err != nil {
		t.Fatalf("Gone of a whole log: %d %v", seq, err)
	}
	p := filepath.Join(dir, "j.jsonl")
	os.Remove(p)
	if seq, file, err := Gone(dir); seq != 2 || file != "j.jsonl" || err != nil {
		t.Fatalf("Gone of a log without its file: %d %q %v", seq, file, err)
	}
	if rep, err := Verify(dir); err != nil || rep.OK() || rep.String() != "j.jsonl: removed: the file is missing, but HEAD says 2 lines were written to it" {
		t.Errorf("Verify of a log without its file: %q %v", rep, err)
	}
	os.Mkdir(p, 0o700)
	for name, err := range map[string]error{"Read": Read(dir, func(string, []byte) error { return nil }), "Check": Check(dir)} {
		if err == nil || !strings.Contains(err.Error(), p+" is a folder, not a file") {
			t.Errorf("%s of a log whose file is a folder: %v", name, err)
		}
	}
	if _, err := Verify(dir); err == nil {
		t.Error("Verify of a log whose file is a folder: no error")
	}

	file := filepath.Join(t.TempDir(), "data")
	os.WriteFile(file, nil, 0o600)
	in := filepath.Join(file, "history")
	_, verr := Verify(in)
	if verr == nil || strings.Count(verr.Error(), in) != 1 || !strings.Contains(verr.Error(), "not a directory") {
		t.Errorf("Verify of a log under a file: %v", verr)
	}
}
