package spool

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/layout"
)

func TestSpoolFinishAndDeliver(t *testing.T) {
	data := t.TempDir()
	s, err := Open(layout.Layout{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	id := "inv-18ed65bd51bdc701fcd26b58"
	if err := s.Start(id, "revertible", true); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"invocation_id":"` + id + `","ok":true}`)
	spooled, err := s.Finish(id, body)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	// A restart: the id is executed, the same bytes are pending, and no
	// marker is left.
	s, err = Open(layout.Layout{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Executed(id) {
		t.Error("not executed after a restart")
	}
	p, _ := s.Pending()
	if len(p) != 1 || string(p[0].Body) != string(body) {
		t.Fatalf("pending %+v", p)
	}
	// Finish handed back what Pending lists after a restart.
	if spooled.ID != p[0].ID || string(spooled.Body) != string(p[0].Body) || spooled.path != p[0].path {
		t.Errorf("Finish returned %+v, Pending lists %+v", spooled, p[0])
	}
	if unknown, err := s.Recover("dev"); err != nil || len(unknown) != 0 {
		t.Errorf("recover: %v %v", unknown, err)
	}
	if err := s.Delivered(p[0]); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Pending(); len(p) != 0 {
		t.Error("a delivered result is still pending")
	}
	if !s.Executed(id) {
		t.Error("the ledger forgot a delivered invocation")
	}
}

// A crash between the STARTED marker and the spooled result.
func TestRecoverAfterCrash(t *testing.T) {
	for _, c := range []struct {
		name, rev string
		canWrite  bool
		unknown   bool
	}{
		{"read-only, cannot write: may run again", "read_only", false, false},
		{"labelled read_only but writes: never again", "read_only", true, true},
		{"revertible: never again", "revertible", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := t.TempDir()
			s, _ := Open(layout.Layout{Data: data})
			id := "inv-durable-" + strings.Repeat("ab", 16)
			if err := s.Start(id, c.rev, c.canWrite); err != nil {
				t.Fatal(err)
			}
			s.Close() // kill -9 here

			s, err := Open(layout.Layout{Data: data})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			unknown, err := s.Recover("dev-1")
			if err != nil {
				t.Fatal(err)
			}
			if (len(unknown) == 1) != c.unknown || s.Executed(id) != c.unknown {
				t.Fatalf("unknown=%v executed=%v", unknown, s.Executed(id))
			}
			p, _ := s.Pending()
			if c.unknown && (len(p) != 1 || !strings.Contains(string(p[0].Body), `"error_class":"execution_outcome_unknown"`) || !strings.Contains(string(p[0].Body), `"sandbox":"unknown_after_restart"`)) {
				t.Errorf("pending %+v", p)
			}
			if m, _ := filepath.Glob(filepath.Join(data, "spool", "started", "*")); len(m) != 0 {
				t.Errorf("markers left: %v", m)
			}
		})
	}
}

func TestDamagedLedgerRefusesToStart(t *testing.T) {
	data := t.TempDir()
	os.MkdirAll(filepath.Join(data, "spool"), 0o700)
	os.WriteFile(filepath.Join(data, "spool", "executed.log"), []byte("inv-18ed65bd51bdc701fcd26b58\n../../etc/passwd\n"), 0o600)
	if _, err := Open(layout.Layout{Data: data}); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("got %v", err)
	}
}

func TestUnsafeIDsGetSafeFileNames(t *testing.T) {
	for _, id := range []string{"inv:with:colons", "a.b.c.d.e.f", "inv-ok_name"} {
		if n := fileName(id); !safeName().MatchString(n) {
			t.Errorf("fileName(%q) = %q", id, n)
		}
	}
}

func TestExpire(t *testing.T) {
	s, err := Open(layout.Layout{Data: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const old, recent = "inv-18ed65bd51bdc701fcd26b58", "inv-18ed65bd51bdc701fcd26b59"
	var files []string
	for _, id := range []string{old, recent} {
		r, err := s.Finish(id, []byte(`{"invocation_id":"`+id+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, r.path)
	}
	then := time.Now().Add(-15 * 24 * time.Hour)
	os.Chtimes(files[0], then, then)
	if gone := s.Expire(time.Now().Add(-14 * 24 * time.Hour)); len(gone) != 1 || gone[0] != files[0] {
		t.Errorf("expired %v, want %v", gone, files[:1])
	}
	if p, _ := s.Pending(); len(p) != 1 || p[0].ID != recent {
		t.Errorf("pending %+v, want only %s", p, recent)
	}
	if !s.Executed(old) {
		t.Error("an expired result's invocation is no longer executed")
	}
}

// TestTornLedgerTail: a crash in the middle of appending an id to the
// ledger leaves part of a line without its newline. Cut there at every
// byte, the ledger opens, the invocation being recorded still counts as
// executed (its result or marker decides), and the next id appended is
// a line of its own: after a restart it is executed, so a re-delivery
// of it does not run it again.
func TestTornLedgerTail(t *testing.T) {
	const a, b, c = "inv-18ed65bd51bdc701fcd26b5a", "inv-18ed65bd51bdc701fcd26b5b", "inv-18ed65bd51bdc701fcd26b5c"
	base := t.TempDir()
	s, err := Open(layout.Layout{Data: base})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(a, []byte(`{"invocation_id":"`+a+`"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delivered(Spooled{ID: a, path: filepath.Join(base, "spool", "results", a+".json")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(b, "revertible", true); err != nil {
		t.Fatal(err)
	}
	marker, err := os.ReadFile(filepath.Join(base, "spool", "started", b+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(b, []byte(`{"invocation_id":"`+b+`"}`)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	full, _ := os.ReadFile(filepath.Join(base, "spool", "executed.log"))
	if string(full) != a+"\n"+b+"\n" {
		t.Fatalf("ledger %q", full)
	}
	for cut := len(a) + 1; cut <= len(full); cut++ {
		t.Run(strconv.Itoa(cut), func(t *testing.T) {
			data := t.TempDir()
			if err := os.CopyFS(data, os.DirFS(base)); err != nil {
				t.Fatal(err)
			}
			ledger := filepath.Join(data, "spool", "executed.log")
			if err := os.Truncate(ledger, int64(cut)); err != nil {
				t.Fatal(err)
			}
			// The crash came before b's marker was removed.
			if err := os.WriteFile(filepath.Join(data, "spool", "started", b+".json"), marker, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(layout.Layout{Data: data})
			if err != nil {
				t.Fatalf("the ledger cut at byte %d does not open: %v", cut, err)
			}
			if unknown, err := s.Recover("dev"); err != nil || len(unknown) != 0 {
				t.Fatalf("recover: %v %v (b's result is spooled)", unknown, err)
			}
			if cut > len(a)+1 && cut < len(full) && s.Cut() == "" {
				t.Error("Cut does not say what was cut")
			}
			if err := s.Start(c, "revertible", true); err != nil {
				t.Fatal(err)
			}
			r, err := s.Finish(c, []byte(`{"invocation_id":"`+c+`"}`))
			if err != nil {
				t.Fatal(err)
			}
			// Delivered: only the ledger remembers c now.
			if err := s.Delivered(r); err != nil {
				t.Fatal(err)
			}
			s.Close()

			s, err = Open(layout.Layout{Data: data})
			if err != nil {
				t.Fatalf("after appending to the ledger cut at byte %d, it does not open: %v", cut, err)
			}
			defer s.Close()
			for _, id := range []string{a, b, c} {
				if !s.Executed(id) {
					got, _ := os.ReadFile(ledger)
					t.Errorf("%s is not executed after the restart: a re-delivery would run it again; ledger %q", id, got)
				}
			}
		})
	}
}

// TestDamagedLedgerLineInTheMiddle: a damaged line that is not the
// torn tail is refused by path and line, not repaired.
func TestDamagedLedgerLineInTheMiddle(t *testing.T) {
	data := t.TempDir()
	os.MkdirAll(filepath.Join(data, "spool"), 0o700)
	ledger := filepath.Join(data, "spool", "executed.log")
	os.WriteFile(ledger, []byte("inv-18ed65bd51bdc701fcd26b58\ninv-18\x00\x00\ninv-18ed65bd51bdc701fcd26b59\ninv-18ed"), 0o600)
	_, err := Open(layout.Layout{Data: data})
	if err == nil || !strings.Contains(err.Error(), ledger+" line 2") || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("got %v", err)
	}
	if b, _ := os.ReadFile(ledger); !strings.HasSuffix(string(b), "inv-18ed") {
		t.Errorf("a refused ledger was changed: %q", b)
	}
}

// TestSalvageDamagedResults: a spooled result cut short is moved to
// dead-results, bytes kept, and an "outcome unknown" result for its
// invocation takes its place, when its name or its bytes tell the
// invocation; when neither does, it is only moved aside.
func TestSalvageDamagedResults(t *testing.T) {
	data := t.TempDir()
	s, err := Open(layout.Layout{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	const safe, unsafe, lost = "inv-18ed65bd51bdc701fcd26b58", "inv:durable:0001", "inv:durable:0002"
	damaged := map[string][]byte{}
	// unsafe's file is named by a digest, but what is left names it.
	for id, keep := range map[string]int{safe: 10, unsafe: 56, lost: 10} {
		body := []byte(`{"device_id":"dev","invocation_id":"` + id + `","ok":true,"payload":{"x":1}}`)
		r, err := s.Finish(id, body)
		if err != nil {
			t.Fatal(err)
		}
		damaged[id] = body[:keep]
		if err := os.WriteFile(r.path, body[:keep], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s, err = Open(layout.Layout{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Salvage("dev")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, g := range got {
		ids[g.ID] = g.Dead
	}
	if len(got) != 3 || ids[safe] == "" || ids[unsafe] == "" || ids[""] == "" {
		t.Fatalf("salvaged %+v, want %s and %s by id and one without", got, safe, unsafe)
	}
	for id, dead := range map[string]string{safe: ids[safe], unsafe: ids[unsafe], lost: ids[""]} {
		if b, err := os.ReadFile(dead); err != nil || string(b) != string(damaged[id]) {
			t.Errorf("%s: the damaged bytes are not kept in %s: %q %v", id, dead, b, err)
		}
	}
	pending, err := s.Pending()
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 2 {
		t.Fatalf("pending %d results, want the two outcome-unknown ones", len(pending))
	}
	for _, p := range pending {
		if p.ID != safe && p.ID != unsafe {
			t.Errorf("pending a result for %s", p.ID)
		}
		var r map[string]any
		if err := json.Unmarshal(p.Body, &r); err != nil || r["invocation_id"] != p.ID || r["error_class"] != "execution_outcome_unknown" || r["device_id"] != "dev" {
			t.Errorf("the result in place of the damaged one: %s %v", p.Body, err)
		}
	}
	if again, err := s.Salvage("dev"); err != nil || len(again) != 0 {
		t.Errorf("a second salvage found %+v %v", again, err)
	}
}

// TestFinishOnAFullDisk: when the result cannot be written, Finish
// still hands it back, in memory, the invocation stays executed, and
// Settle, once the result is delivered, records it so that a restart
// neither runs it again nor calls it unknown.
func TestFinishOnAFullDisk(t *testing.T) {
	data := t.TempDir()
	s, err := Open(layout.Layout{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	id := "inv-18ed65bd51bdc701fcd26b58"
	if err := s.Start(id, "revertible", true); err != nil {
		t.Fatal(err)
	}
	// The temporary file cannot be created, as on a full disk.
	block := filepath.Join(data, "spool", "results", id+".json.tmp")
	os.MkdirAll(filepath.Join(block, "x"), 0o700)
	body := []byte(`{"invocation_id":"` + id + `"}`)
	r, err := s.Finish(id, body)
	if err == nil {
		t.Fatal("Finish succeeded")
	}
	if r.OnDisk() || r.ID != id || string(r.Body) != string(body) {
		t.Fatalf("Finish handed back %+v", r)
	}
	if !s.Executed(id) {
		t.Error("not executed")
	}
	if err := s.Settle(id); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(layout.Layout{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if unknown, err := s.Recover("dev"); err != nil || len(unknown) != 0 || !s.Executed(id) {
		t.Errorf("after a restart: unknown %v, err %v, executed %v", unknown, err, s.Executed(id))
	}
}
