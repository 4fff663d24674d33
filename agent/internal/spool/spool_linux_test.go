package spool

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/metnos/agent/internal/layout"
)

// TestLedgerAppendCutShort: an append to the ledger that the disk cuts
// short (here the file size limit: a short write, as on a disk that
// fills) is cut back, so the next id is not glued onto half of this
// one, and both count after a restart once one is recorded again.
func TestLedgerAppendCutShort(t *testing.T) {
	data := t.TempDir()
	s, err := Open(layout.Layout{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	const a, b = "inv-18ed65bd51bdc701fcd26b5a", "inv-18ed65bd51bdc701fcd26b5b"
	if err := s.Settle(a); err != nil {
		t.Fatal(err)
	}
	ledger := filepath.Join(data, "spool", "executed.log")
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = uint64(len(a)+1) + 10
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skipf("cannot lower the file size limit: %v", err)
	}
	err = s.Settle(b)
	syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old)
	if err == nil {
		t.Fatal("an append past the file size limit succeeded")
	}
	if got, _ := os.ReadFile(ledger); string(got) != a+"\n" {
		t.Fatalf("after the cut-short append the ledger is %q, want it as before", got)
	}
	if err := s.Settle(b); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if got, _ := os.ReadFile(ledger); string(got) != a+"\n"+b+"\n" {
		t.Errorf("ledger %q", got)
	}
	s, err = Open(layout.Layout{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Executed(a) || !s.Executed(b) || strings.Contains(s.Cut(), "inv") {
		t.Errorf("after a restart: %v %v, cut %q", s.Executed(a), s.Executed(b), s.Cut())
	}
}
