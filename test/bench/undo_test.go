package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/undo"
)

// TestUndoRatio: a local undo of METNOS_BENCH_UNDO_N (10,000) moves, the
// way organize_photos leaves them (photos in YYYY/MM folders it
// created), against the same renames done by a plain Go loop of
// os.Rename, in the same run, 3 rounds each (the forward moves are the
// baseline, made again before each undo). It prints the medians, the
// ratio undo / plain loop, and how far the undo is from the design's
// goal of "ten thousand photos in a second". Then the journal's cost per
// invocation in the run loop: the begin and change records (two
// fsynced, chained appends) and the audit line of a one-row change,
// against one fsynced append of a line to a file. Information only.
//
//	go test ./test/bench -run UndoRatio -count=1 -v
func TestUndoRatio(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short")
	}
	n := 10000
	if s := os.Getenv("METNOS_BENCH_UNDO_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	base := t.TempDir()
	folder := filepath.Join(base, "photos")
	history := filepath.Join(base, "shimdata", "_history")
	os.MkdirAll(folder, 0o755)
	os.MkdirAll(history, 0o700)
	src := make([]string, n)
	dst := make([]string, n)
	for i := range n {
		src[i] = filepath.Join(folder, fmt.Sprintf("IMG_%05d.jpg", i))
		dst[i] = filepath.Join(folder, "2024", fmt.Sprintf("%02d", 1+i%12), filepath.Base(src[i]))
		if err := os.WriteFile(src[i], []byte("photo "+strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// forward makes the moves (and the folders), as the executor would,
	// and returns the time of the renames alone: the plain loop.
	forward := func() (time.Duration, []any) {
		var dirs []any
		for m := 1; m <= 12; m++ {
			d := filepath.Join(folder, "2024", fmt.Sprintf("%02d", m))
			os.MkdirAll(d, 0o755)
			dirs = append(dirs, d)
		}
		dirs = append([]any{filepath.Join(folder, "2024")}, dirs...)
		start := time.Now()
		for i := range n {
			if err := os.Rename(src[i], dst[i]); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start), dirs
	}
	var plain, local, record []time.Duration
	for round := range 3 {
		j, err := undo.Open(filepath.Join(base, fmt.Sprintf("history-%d", round)))
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("inv-%d-%06d", time.Now().UnixMilli(), round)
		if err := j.Begin(undo.Begin{InvocationID: id, Executor: "organize_photos",
			Reverse: []string{"swap_src_dst", "restore_blob_backup", "delete_created_dirs"}, Roots: []string{folder}, History: history}); err != nil {
			t.Fatal(err)
		}
		d, dirs := forward()
		plain = append(plain, d)
		rows := make([]any, n)
		for i := range n {
			rows[i] = map[string]any{"src": src[i], "dst": dst[i]}
		}
		start := time.Now()
		if _, err := j.Finish(id, undo.Outcome{OK: true, Payload: map[string]any{"ok": true, "results": rows, "dirs_created": dirs}}); err != nil {
			t.Fatal(err)
		}
		record = append(record, time.Since(start))
		start = time.Now()
		rep, err := j.Undo(id, history, false)
		local = append(local, time.Since(start))
		if err != nil || len(rep.Conflicts) != 0 || len(rep.Done) != n+13 {
			t.Fatalf("undo: %d steps, conflicts %v, %v", len(rep.Done), rep.Conflicts, err)
		}
	}
	for i := range n {
		if _, err := os.Stat(src[i]); err != nil {
			t.Fatalf("after the undo: %v", err)
		}
	}
	pm, lm, rm := median(plain), median(local), median(record)
	t.Logf("%d moves: plain os.Rename loop %v, local undo %v: undo / plain = %.2f×", n, pm.Round(time.Millisecond), lm.Round(time.Millisecond), float64(lm)/float64(pm))
	t.Logf("recording the %d-row change in the journal (lstat of every file, one fsynced line): %v", n, rm.Round(time.Millisecond))
	t.Logf("seeds' goal, %d photos put back in a second: the undo took %.2f s (%.2f× the goal)", n, lm.Seconds()*10000/float64(n), lm.Seconds()*10000/float64(n))

	// The journal's cost per invocation, for a one-row change.
	j, err := undo.Open(filepath.Join(base, "history-small"))
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(base, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	one := filepath.Join(folder, "one.txt")
	os.WriteFile(one, []byte("x"), 0o644)
	plainLog, _ := os.OpenFile(filepath.Join(base, "plain.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	defer plainLog.Close()
	var journal, auditT, fsynced []time.Duration
	for i := range 50 {
		id := fmt.Sprintf("inv-%d-%06d", time.Now().UnixMilli(), 100+i)
		start := time.Now()
		j.Begin(undo.Begin{InvocationID: id, Executor: "move_files", Reverse: []string{"swap_src_dst"}, Roots: []string{folder}, History: history})
		j.Finish(id, undo.Outcome{OK: true, Payload: map[string]any{"results": []any{map[string]any{"src": one + ".old", "dst": one}}}})
		journal = append(journal, time.Since(start))
		start = time.Now()
		al.Write(audit.Record{InvocationID: id, Executor: "move_files", Args: map[string]any{"entries": []any{map[string]any{"src": one}}}, Output: []byte(`{"ok":true}`), OK: true, Sandbox: "bwrap+landlock+seccomp"})
		auditT = append(auditT, time.Since(start))
		start = time.Now()
		plainLog.WriteString(`{"invocation_id":"` + id + `","ok":true}` + "\n")
		plainLog.Sync()
		fsynced = append(fsynced, time.Since(start))
	}
	jm, am, fm := median(journal), median(auditT), median(fsynced)
	t.Logf("per invocation: journal (begin + change) %v, audit line %v; one fsynced append %v: journal / append = %.2f×, audit / append = %.2f×",
		jm.Round(10*time.Microsecond), am.Round(10*time.Microsecond), fm.Round(10*time.Microsecond), float64(jm)/float64(fm), float64(am)/float64(fm))
}
