package chainlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// FuzzVerify reads fuzzed log files and HEAD with [Verify], and checks
// that it never panics and that a log it calls intact is one: its
// complete lines, as [Read] gives them, are numbered 1, 2, … and each
// holds the hash of the line before it; and [Open] and [Log.Append]
// carry on from it, leaving a log that verifies with one more line. The
// fuzzed bytes are cut in two files at split; HEAD is written when
// withHead.
func FuzzVerify(f *testing.F) {
	// Seeds: a log this package wrote, and the same log damaged.
	dir := f.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		f.Fatal(err)
	}
	for i := range 4 {
		if _, err := l.Append("b.jsonl", map[string]any{"i": i, "text": fmt.Sprintf("record %d", i)}); err != nil {
			f.Fatal(err)
		}
	}
	log, err := os.ReadFile(filepath.Join(dir, "b.jsonl"))
	if err != nil {
		f.Fatal(err)
	}
	head, err := os.ReadFile(filepath.Join(dir, headName))
	if err != nil {
		f.Fatal(err)
	}
	second := bytes.IndexByte(log, '\n') + 1
	// Past the line HEAD vouches for, nothing checks a line's bytes but
	// Verify itself: the last line, valid up to its prev, with a stray
	// byte at the end and HEAD one line behind (found by this fuzzer).
	third := second + bytes.IndexByte(log[second:], '\n') + 1
	fourth := third + bytes.IndexByte(log[third:], '\n') + 1
	lagging := fmt.Appendf(nil, `{"seq":3,"hash":%q,"file":"b.jsonl"}`, Hash(log[third:fourth-1]))
	stray := append(bytes.Clone(log[:len(log)-1]), "}\n"...)
	f.Add(log, uint(0), head, true)
	f.Add(log, uint(second), head, true)
	f.Add(log, uint(second), head, false)
	f.Add(log, uint(0), []byte(`{"seq":1,"hash":"x"}`), true)
	f.Add(log[:len(log)-5], uint(0), head, true)                                              // torn tail
	f.Add(log[:len(log)-5], uint(len(log)), head, true)                                       // torn in the middle
	f.Add(bytes.Replace(log, []byte("record 1"), []byte("record X"), 1), uint(0), head, true) // edited
	f.Add(log[second:], uint(0), head, true)                                                  // first line removed
	f.Add([]byte(`{"seq":1,"prev":"`+zero+`"}`+"\n"), uint(0), []byte{}, false)
	f.Add([]byte("\n\n{}\n"), uint(1), []byte("{}"), true)
	f.Add([]byte{}, uint(0), []byte{}, false)
	f.Add(stray, uint(0), lagging, true)

	f.Fuzz(func(t *testing.T, log []byte, split uint, head []byte, withHead bool) {
		dir := t.TempDir()
		cut := min(int(split%uint(len(log)+1)), len(log))
		if err := os.WriteFile(filepath.Join(dir, "a.jsonl"), log[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "b.jsonl"), log[cut:], 0o600); err != nil {
			t.Fatal(err)
		}
		if withHead {
			if err := os.WriteFile(filepath.Join(dir, headName), head, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		rep, err := Verify(dir)
		if err != nil || !rep.OK() {
			// Damaged: reading it and opening it must not panic either.
			Read(dir, func(string, []byte) error { return nil })
			if l, err := Open(dir, Options{}); err == nil {
				l.Close()
			}
			return
		}
		n := checkChain(t, dir)
		if n != rep.Lines {
			t.Fatalf("Verify counted %d lines, Read gave %d chained ones", rep.Lines, n)
		}
		l, err := Open(dir, Options{})
		if err != nil {
			t.Fatalf("Verify found the log intact (%v), but Open fails: %v", rep, err)
		}
		if _, err := l.Append("b.jsonl", map[string]any{"next": true}); err != nil {
			t.Fatalf("Verify found the log intact (%v), but Append fails: %v", rep, err)
		}
		rep2, err := Verify(dir)
		if err != nil || !rep2.OK() || rep2.Lines != rep.Lines+1 {
			t.Fatalf("intact log (%v) after one Append: %v, %v", rep, rep2, err)
		}
		if n := checkChain(t, dir); n != rep2.Lines {
			t.Fatalf("after Append, Verify counted %d lines, Read gave %d chained ones", rep2.Lines, n)
		}
	})
}

// checkChain reads the log in dir with Read and checks its lines are
// numbered from 1 and each holds the hash of the one before; it returns
// how many there are.
func checkChain(t *testing.T, dir string) int64 {
	t.Helper()
	seq, prev := int64(0), zero
	err := Read(dir, func(file string, line []byte) error {
		var v struct {
			Seq  *int64  `json:"seq"`
			Prev *string `json:"prev"`
		}
		if err := json.Unmarshal(line, &v); err != nil || v.Seq == nil || v.Prev == nil {
			return fmt.Errorf("%s: line %q is not a line of a chained log (%v)", file, line, err)
		}
		if *v.Seq != seq+1 || *v.Prev != prev {
			return fmt.Errorf("%s: line %q follows seq %d, hash %s", file, line, seq, prev)
		}
		seq, prev = *v.Seq, Hash(line)
		return nil
	})
	if err != nil {
		t.Fatalf("a log Verify found intact: %v", err)
	}
	return seq
}
