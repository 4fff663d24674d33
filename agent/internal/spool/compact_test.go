package spool

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/wire"
)

// timedID is an id the server issued at t.
func timedID(t time.Time, n int) string {
	return fmt.Sprintf("inv-%016x%08x", t.UnixNano(), n)
}

// TestLedgerDoesNotGrowWithHistory: a ledger of a year of invocations
// keeps, on disk and in memory, only the ids the agent could still be
// sent and would not refuse by their age; every id it drops is one
// wire.CheckID refuses, so no invocation can run twice for it. Durable
// ids (no issue time) are all kept.
func TestLedgerDoesNotGrowWithHistory(t *testing.T) {
	lay := layout.Layout{Data: t.TempDir()}
	now := time.Now()
	var lines, old, fresh []string
	// A year, every 3 h, the newest an hour ago; the window is counted
	// from the newest (none is within minutes of its end).
	newest := now.Add(-time.Hour)
	for i := range 3000 {
		at := newest.Add(-time.Duration(2999-i) * 3 * time.Hour)
		id := timedID(at, i)
		lines = append(lines, id)
		if newest.Sub(at) > ledgerWindow {
			old = append(old, id)
		} else {
			fresh = append(fresh, id)
		}
	}
	durable := []string{"job:backup-nightly", "my.durable.id-1"}
	lines = append(lines, durable...)
	os.MkdirAll(lay.SpoolResults(), 0o700)
	if err := os.WriteFile(lay.Ledger(), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(lay)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, id := range append(fresh, durable...) {
		if !s.Executed(id) {
			t.Fatalf("%s: forgotten, but the agent could still be sent it", id)
		}
	}
	for _, id := range old {
		if wire.CheckID(id, now) == nil {
			t.Fatalf("%s was dropped, but the agent would run it", id)
		}
	}
	if len(s.executed) != len(fresh)+len(durable) {
		t.Errorf("%d ids in memory, want %d", len(s.executed), len(fresh)+len(durable))
	}
	b, _ := os.ReadFile(lay.Ledger())
	if n := strings.Count(string(b), "\n"); n != len(fresh)+len(durable) {
		t.Errorf("the ledger keeps %d lines, want %d", n, len(fresh)+len(durable))
	}
	t.Logf("a year of %d invocations: %d ids kept (%d bytes)", len(lines), len(fresh)+len(durable), len(b))

	// A running agent compacts too: its appends go to the new ledger,
	// and a restart reads them back.
	compactEvery = 5
	t.Cleanup(func() { compactEvery = 1000 })
	s.executed[old[0]] = true // as if it had been appended long ago
	var appended []string
	for i := range 12 {
		id := timedID(time.Now(), 9000+i)
		if err := s.record(id); err != nil {
			t.Fatal(err)
		}
		appended = append(appended, id)
	}
	if s.executed[old[0]] {
		t.Error("a running agent kept a stale id in memory")
	}
	s.Close()
	s2, err := Open(lay)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	stillFresh := append(appended, durable...)
	for _, id := range fresh {
		if at, _ := wire.IssuedAt(id); time.Since(at) < ledgerWindow-time.Hour {
			stillFresh = append(stillFresh, id)
		}
	}
	for _, id := range stillFresh {
		if !s2.Executed(id) {
			t.Fatalf("%s: lost by a compaction while running", id)
		}
	}
	if leftovers, _ := os.ReadDir(lay.SpoolResults() + "/.."); len(leftovers) == 0 {
		t.Fatal("no spool folder")
	} else {
		for _, e := range leftovers {
			if strings.HasPrefix(e.Name(), ".ledger-") {
				t.Errorf("a compaction left %s", e.Name())
			}
		}
	}
}

// TestLedgerClockAhead: a device clock set days ahead drops nothing
// newer than the window before the newest id the server issued, so an
// id the agent would run once the clock is right stays known.
func TestLedgerClockAhead(t *testing.T) {
	issued := time.Now()
	ids := []string{timedID(issued.Add(-40*time.Hour), 1), timedID(issued, 2)}
	if got := keep(ids, issued.Add(10*24*time.Hour)); len(got) != 2 {
		t.Errorf("with the clock 10 days ahead, kept %v of %v", got, ids)
	}
	if got := keep(ids, issued); len(got) != 2 {
		t.Errorf("kept %v of %v", got, ids)
	}
	old := timedID(issued.Add(-ledgerWindow-time.Hour), 0)
	if got := keep(append([]string{old}, ids...), issued.Add(10*24*time.Hour)); len(got) != 2 {
		t.Errorf("an id past the window before the newest was kept: %v", got)
	}
}
