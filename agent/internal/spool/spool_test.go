package spool

import (
	"os"
	"path/filepath"
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
		if n := fileName(id); !safeName.MatchString(n) {
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
