package audit

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestOwnerEvents: the changes of the owner's limits and the
// invocations they refused are lines of the chain (the log still
// verifies), and OwnerEvents reads them back, newest first, as far
// back as asked, leaving the other invocations out.
func TestOwnerEvents(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	change := LimitsChange{Time: day1.Add(time.Minute), File: "/h/.config/metnos/limits.toml", Seen: "start",
		NewSHA256: strings.Repeat("cd", 32), Changes: []Change{{Key: "mode", Old: `"full"`, New: `"readonly"`}}, InForce: true}
	refused := record(7, day1.Add(2*time.Minute))
	refused.OK, refused.ErrorClass, refused.Sandbox = false, "device_error", "none"
	refused.RefusedBy = `refused by the owner's limits (/h/.config/metnos/limits.toml): mode = "readonly" refuses executors that write`
	refused.OwnerMode = "readonly"
	broken := LimitsChange{Time: day2, File: change.File, Seen: "run", OldSHA256: change.NewSHA256, NewSHA256: strings.Repeat("ef", 32),
		Error: "config: limits.toml:2:1: unknown key \"moed\""}
	for _, w := range []func() error{
		func() error { return l.Write(record(1, day1)) },
		func() error { return l.WriteLimits(change) },
		func() error { return l.Write(refused) },
		func() error { return l.Write(record(2, day1.Add(3*time.Minute))) },
		func() error { return l.WriteLimits(broken) },
		func() error { return l.Write(record(3, day2.Add(time.Minute))) },
	} {
		if err := w(); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	if rep, err := Verify(dir); err != nil || !rep.OK() || rep.Lines != 6 {
		t.Fatalf("Verify = %+v, %v, want 6 intact lines", rep, err)
	}

	all, err := OwnerEvents(dir, time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []OwnerEvent{
		{Time: day2, Event: EventLimitsChanged, File: change.File, Seen: "run", OldSHA256: broken.OldSHA256, NewSHA256: broken.NewSHA256, Changes: []Change{}, Error: broken.Error},
		{Time: refused.Time, Event: EventRefused, InvocationID: refused.InvocationID, TurnID: "turn-1", Executor: "fs_read", RefusedBy: refused.RefusedBy},
		{Time: change.Time, Event: EventLimitsChanged, File: change.File, Seen: "start", NewSHA256: change.NewSHA256, Changes: change.Changes, InForce: true},
	}
	if !reflect.DeepEqual(all, want) {
		t.Errorf("OwnerEvents =\n%+v\nwant\n%+v", all, want)
	}
	if got, _ := OwnerEvents(dir, time.Time{}, 1); len(got) != 1 || got[0].Time != day2 {
		t.Errorf("OwnerEvents(max 1) = %+v", got)
	}
	if got, _ := OwnerEvents(dir, day1.Add(90*time.Second), 0); len(got) != 2 {
		t.Errorf("OwnerEvents(since) = %+v, want the 2 after it", got)
	}
	if got, err := OwnerEvents(filepath.Join(t.TempDir(), "none"), time.Time{}, 0); err != nil || got != nil {
		t.Errorf("no log: %+v, %v", got, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, file1))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"event":"limits_changed","file":"/h/.config/metnos/limits.toml","seen":"start","old_sha256":"","new_sha256":"cdcd`) ||
		!strings.Contains(string(b), `"owner_mode":"readonly"`) {
		t.Errorf("the lines:\n%s", b)
	}
}
