package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/audit"
)

// TestAuditVerifySaysWhatWasPruned: after the retention removed old
// days, `audit verify` still finds the log intact, counts only what is
// kept, and says what was pruned; --json has it too. (Cut at 8
// November 00:30: the days 1 to 7 November are wholly past it.)
func TestAuditVerifySaysWhatWasPruned(t *testing.T) {
	home := t.TempDir()
	e, err := readEnvironment(func(k string) string { return map[string]string{"HOME": home}[k] })
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(e.lay.Audit())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	first := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	for i := range 20 { // two lines a day, 1 to 10 November
		at := first.Add(time.Duration(i/2)*24*time.Hour + time.Duration(i%2)*time.Hour)
		if err := l.Write(audit.Record{Time: at, InvocationID: fmt.Sprintf("inv-%03d", i), Executor: "echo", OK: true}); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errb := runWith(t, home, "audit", "verify")
	if code != 0 || strings.Contains(out, "pruned") {
		t.Fatalf("audit verify before pruning (%d, %s): %s", code, errb, out)
	}
	if _, err := l.Prune(3*24*time.Hour, time.Date(2026, 11, 11, 0, 30, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}

	code, out, errb = runWith(t, home, "audit", "verify")
	want := "audit log intact: 6 lines in 3 files (" + e.lay.Audit() + ")\n" +
		"pruned: 14 older lines, of the days before 2026-11-08, were pruned (retention 3 days); the lines kept follow the last one removed\n"
	if code != 0 || out != want || errb != "" {
		t.Fatalf("audit verify after pruning (%d, stderr %q):\n%s\nwant:\n%s", code, errb, out, want)
	}

	_, out, _ = runWith(t, home, "audit", "verify", "--json")
	var got auditReport
	if err := json.Unmarshal([]byte(out), &got); err != nil || !got.OK || got.Lines != 6 || got.Pruned == nil ||
		*got.Pruned != (audit.Pruned{Lines: 14, Files: 7, Before: "2026-11-08", RetentionDays: 3}) {
		t.Fatalf("audit verify --json: %s %v", out, err)
	}
}
