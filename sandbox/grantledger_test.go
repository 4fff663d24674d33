package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeACL is a stand-in for the access lists of a machine's paths: for
// each path, its explicit entries as "sid|rights|inherit". A path in
// gone has been removed.
type fakeACL struct {
	lists map[string][]string
	gone  map[string]bool
	// crashAt, when positive, makes the crashAt-th call (counting every
	// has, add and remove) panic with errCrash before it acts: a kill
	// of the agent at that point.
	crashAt, calls int
	// failAdd makes add fail on that path.
	failAdd string
}

var errCrash = errors.New("killed")

func newFakeACL() *fakeACL { return &fakeACL{lists: map[string][]string{}, gone: map[string]bool{}} }

func entryText(sid string, e ace) string {
	return fmt.Sprintf("%s|%s|%v", sid, e.Rights, e.Inherit)
}

func (f *fakeACL) step() {
	f.calls++
	if f.crashAt > 0 && f.calls == f.crashAt {
		panic(errCrash)
	}
}

func (f *fakeACL) has(path, sid string, e ace) (bool, error) {
	f.step()
	return slices.Contains(f.lists[winKey(path)], entryText(sid, e)), nil
}

func (f *fakeACL) add(path, sid string, e ace) error {
	f.step()
	if f.failAdd != "" && winKey(path) == winKey(f.failAdd) {
		return errors.New("access denied")
	}
	k := winKey(path)
	if !slices.Contains(f.lists[k], entryText(sid, e)) {
		f.lists[k] = append(f.lists[k], entryText(sid, e))
	}
	return nil
}

func (f *fakeACL) remove(path, sid string, e ace) error {
	f.step()
	k := winKey(path)
	if f.gone[k] {
		return nil
	}
	f.lists[k] = slices.DeleteFunc(f.lists[k], func(s string) bool { return s == entryText(sid, e) })
	return nil
}

// state is the fake's lists as one comparable string.
func (f *fakeACL) state() string {
	var out []string
	for p, l := range f.lists {
		for _, e := range l {
			out = append(out, p+"="+e)
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

const testSID = "S-1-15-2-1-2-3-4-5-6-7"

// newLedger is a ledger over f in a folder of the test's, for the
// process self, where alive says which processes still run.
func newLedger(t *testing.T, dir string, f aclOps, self int, alive ...int) *grantLedger {
	return &grantLedger{dir: dir, sid: testSID, ops: f, self: procID{PID: self, Created: int64(self) * 10},
		alive: func(p procID) bool { return slices.Contains(alive, p.PID) && p.Created == int64(p.PID)*10 }}
}

var ledgerACEs = []ace{
	{Path: `C:\Users\u`, Rights: aceRead, Inherit: true},
	{Path: `C:\Users\u\.ssh`, Rights: aceDeny, Inherit: true},
	{Path: `C:\Users\u\Documents`, Rights: aceModify, Inherit: true},
	{Path: `C:\Users\u\notes.txt`, Rights: aceModify},
}

// TestLedgerApplyRelease: the entries are on the paths during the run
// and gone after it; the record is written before the first entry and
// removed after the last; an entry that was there before the run (the
// owner's) stays.
func TestLedgerApplyRelease(t *testing.T) {
	f := newFakeACL()
	f.lists[winKey(`C:\Users\u\Documents`)] = []string{entryText(testSID, ledgerACEs[2]), "S-1-5-21-owner|modify|true"}
	before := f.state()
	dir := t.TempDir()
	l := newLedger(t, dir, f, 100, 100)
	g, err := l.apply("run-1", ledgerACEs)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ledgerACEs {
		if on, _ := f.has(e.Path, testSID, e); !on {
			t.Errorf("%s: no %s entry during the run", e.Path, e.Rights)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "run-1.json")); err != nil {
		t.Errorf("no record during the run: %v", err)
	}
	if err := g.release(); err != nil {
		t.Fatal(err)
	}
	if got := f.state(); got != before {
		t.Errorf("after the run:\n%s\nwant:\n%s", got, before)
	}
	if _, err := os.Stat(filepath.Join(dir, "run-1.json")); !os.IsNotExist(err) {
		t.Errorf("the record stayed: %v", err)
	}
}

// TestLedgerSharedEntries: two runs that grant the same folder share the
// entry: the first to end leaves it to the second, the second removes
// it.
func TestLedgerSharedEntries(t *testing.T) {
	f := newFakeACL()
	dir := t.TempDir()
	l := newLedger(t, dir, f, 100, 100)
	a, err := l.apply("run-a", ledgerACEs[:2])
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.apply("run-b", ledgerACEs[:1])
	if err != nil {
		t.Fatal(err)
	}
	if err := a.release(); err != nil {
		t.Fatal(err)
	}
	if on, _ := f.has(ledgerACEs[0].Path, testSID, ledgerACEs[0]); !on {
		t.Fatal("the first run to end removed the entry the second still needs")
	}
	if on, _ := f.has(ledgerACEs[1].Path, testSID, ledgerACEs[1]); on {
		t.Error("the first run's own entry stayed")
	}
	if err := b.release(); err != nil {
		t.Fatal(err)
	}
	if s := f.state(); s != "" {
		t.Errorf("after both runs: %s", s)
	}
}

// TestLedgerAddFails: an entry that cannot be added takes back those
// added before it, and leaves no record.
func TestLedgerAddFails(t *testing.T) {
	f := newFakeACL()
	f.failAdd = ledgerACEs[2].Path
	dir := t.TempDir()
	l := newLedger(t, dir, f, 100, 100)
	if _, err := l.apply("run-1", ledgerACEs); err == nil || !strings.Contains(err.Error(), `granting the container modify on C:\Users\u\Documents: access denied`) {
		t.Fatalf("err %v", err)
	}
	if s := f.state(); s != "" {
		t.Errorf("left: %s", s)
	}
	if rs, _ := l.records(); len(rs) != 0 {
		t.Errorf("records left: %+v", rs)
	}
}

// TestLedgerCrashAtEveryStep: an agent killed at any step of a run
// (while granting, during the run, while removing) leaves nothing once
// the next start recovers: the paths' lists are as before, with the
// owner's entry and another live run's kept, and no record is left but
// the live run's. A record of a process still running is not touched.
func TestLedgerCrashAtEveryStep(t *testing.T) {
	steps := 0
	for crash := 1; ; crash++ {
		f := newFakeACL()
		// The owner's own entry for this SID, and another live run's.
		f.lists[winKey(`C:\Users\u\Documents`)] = []string{entryText(testSID, ledgerACEs[2])}
		dir := t.TempDir()
		live := newLedger(t, dir, f, 200, 200)
		other, err := live.apply("run-live", ledgerACEs[:1])
		if err != nil {
			t.Fatal(err)
		}
		before := f.state()
		f.calls, f.crashAt = 0, crash
		killed := func() (died bool) {
			defer func() {
				if r := recover(); r != nil {
					if r != errCrash {
						panic(r)
					}
					died = true
				}
			}()
			l := newLedger(t, dir, f, 100, 100, 200)
			g, err := l.apply("run-1", ledgerACEs)
			if err != nil {
				t.Fatalf("crash at %d: %v", crash, err)
			}
			return g.release() != nil
		}()
		f.crashAt = 0
		if !killed {
			steps = crash - 1
			break
		}
		// The next start: process 100 is gone, 200 still runs.
		n, err := newLedger(t, dir, f, 300, 200, 300).recover()
		if err != nil {
			t.Fatalf("crash at %d: recover: %v", crash, err)
		}
		if got := f.state(); got != before {
			t.Errorf("crash at step %d, after recovery:\n%s\nwant:\n%s", crash, got, before)
		}
		rs, _ := live.records()
		if len(rs) != 1 || rs[0].name != "run-live.json" || n > 1 {
			t.Errorf("crash at step %d: %d undone, records left %+v", crash, n, rs)
		}
		if err := other.release(); err != nil {
			t.Fatal(err)
		}
		if got := f.state(); got != `c:\users\u\documents=`+entryText(testSID, ledgerACEs[2]) {
			t.Errorf("crash at step %d: once the live run ended: %s", crash, got)
		}
	}
	// has ×4, add ×3 (the owner's entry was there before), remove ×2
	// (the live run still needs one): every step.
	if steps != 9 {
		t.Errorf("a whole run took %d steps, want 9", steps)
	}
}

// TestLedgerTornRecord: a record cut short (written by something else
// than the ledger, which writes whole) is an error naming it, never
// skipped.
func TestLedgerTornRecord(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "run-x.json"), []byte(`{"proc":{"pid":1`), 0o600)
	_, err := newLedger(t, dir, newFakeACL(), 300).recover()
	if err == nil || !strings.Contains(err.Error(), "run-x.json is not whole") {
		t.Fatalf("err %v", err)
	}
}
