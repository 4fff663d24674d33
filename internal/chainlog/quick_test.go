package chainlog

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestVerifyQuickStillFindsAnEdit: VerifyQuick reads a file it verified
// before only when it changed, and an edit of such a file, even one
// that keeps its size and modification time, is found.
func TestVerifyQuickStillFindsAnEdit(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, 30, "a.jsonl", "b.jsonl", "c.jsonl")
	rep, err := VerifyQuick(dir)
	if err != nil || !rep.OK() || rep.Lines != 30 || rep.Files != 3 {
		t.Fatalf("first check: %v %v", rep, err)
	}
	var v verified
	b, err := os.ReadFile(filepath.Join(dir, verifiedName))
	if err != nil || json.Unmarshal(b, &v) != nil || len(v) != 2 || v["a.jsonl"].Lines != 10 {
		t.Fatalf("what it noted: %s %v", b, err)
	}
	// What it noted is used: a count changed there shows.
	a := v["a.jsonl"]
	a.Lines = 1000
	v["a.jsonl"] = a
	b, _ = json.Marshal(v)
	os.WriteFile(filepath.Join(dir, verifiedName), b, 0o600)
	if rep, err := VerifyQuick(dir); err != nil || !rep.OK() || rep.Lines != 1020 {
		t.Fatalf("a file noted as verified was read again: %v %v", rep, err)
	}
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 30 {
		t.Fatalf("Verify does not read VERIFIED: %v %v", rep, err)
	}

	// An edit that keeps the size and the modification time.
	p := filepath.Join(dir, "a.jsonl")
	fi, _ := os.Stat(p)
	raw, _ := os.ReadFile(p)
	edited := bytes.Replace(raw, []byte("record 3"), []byte("record 9"), 1)
	os.WriteFile(p, edited, 0o600)
	os.Chtimes(p, fi.ModTime(), fi.ModTime())
	rep, err = VerifyQuick(dir)
	if err != nil || rep.OK() || rep.File != "a.jsonl" || rep.Line != 4 || rep.Good != 3 {
		t.Fatalf("the edit was not found: %v (good %d) %v", rep, rep.Good, err)
	}
}

// TestReadBackIsReadReversed: the lines ReadBack gives, newest first,
// are exactly those Read gives, whatever their length (a line longer
// than what is read at once) and with a torn tail left out.
func TestReadBackIsReadReversed(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		name := "a.jsonl"
		if i >= 150 {
			name = "b.jsonl"
		}
		text := bytes.Repeat([]byte{'x'}, i*7%300)
		if i == 100 || i == 299 {
			text = bytes.Repeat([]byte{'y'}, 100<<10)
		}
		if _, err := l.Append(name, map[string]any{"i": i, "text": string(text)}); err != nil {
			t.Fatal(err)
		}
	}
	f, _ := os.OpenFile(filepath.Join(dir, "b.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":301,"prev":"ab`)
	f.Close()
	var fwd, back []string
	Read(dir, func(file string, line []byte) error { fwd = append(fwd, file+string(line)); return nil })
	ReadBack(dir, func(file string, line []byte) (bool, error) { back = append(back, file+string(line)); return true, nil })
	if len(fwd) != 300 || len(back) != 300 {
		t.Fatalf("%d lines forward, %d back", len(fwd), len(back))
	}
	for i := range fwd {
		if fwd[i] != back[len(back)-1-i] {
			t.Fatalf("line %d differs", i)
		}
	}
	n := 0
	ReadBack(dir, func(string, []byte) (bool, error) { n++; return n < 5, nil })
	if n != 5 {
		t.Fatalf("ReadBack went on after it was told to stop: %d", n)
	}
}
