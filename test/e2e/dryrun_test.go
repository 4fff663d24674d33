//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox/changes"
)

// dryStamps is every path beneath root with what a dry run must leave
// as it was: kind, mode, size, SHA-256, link target, inode, and the
// modification, change and access times (the files are the agent's
// user's, which the layer reads without touching their access time).
func dryStamps(t *testing.T, root string) map[string]string {
	t.Helper()
	s, err := changes.Take(root)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for p, e := range s {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(e)
		out[p] = string(b) + " mtime " + stampTime(st.Mtim) + " ctime " + stampTime(st.Ctim) + " atime " + stampTime(st.Atim)
	}
	return out
}

func stampTime(ts unix.Timespec) string { b, _ := json.Marshal(ts); return string(b) }

// auditLine is the audit line of invocation id.
func (w *world) auditLine(t *testing.T, id string) map[string]any {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(w.dataDir(), "audit", "*.jsonl"))
	for _, f := range files {
		for _, l := range lines(t, f) {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["invocation_id"] == id {
				return m
			}
		}
	}
	t.Fatalf("no audit line for %s in %v", id, files)
	return nil
}

// TestDryRunInvocation: an invocation whose arguments carry
// "dry_run": true runs, and its result carries the changes it would
// have made (payload.dry_run, applied false) while the tree it ran on
// is as it was, timestamps included; the history journal has no entry
// for it and its audit line says dry_run. The same invocation without
// dry_run makes those very changes, and is journaled.
func TestDryRunInvocation(t *testing.T) {
	w, _ := pairedAndRunning(t)
	needFull(t, "a dry run needs bubblewrap")
	folder := filepath.Join(w.work, "docs")
	if err := os.MkdirAll(filepath.Join(folder, "old"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"a.txt": "A\n", "b.txt": "B\n", "old/c.txt": "C\n"} {
		if err := os.WriteFile(filepath.Join(folder, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := func(dry bool) map[string]any {
		a := map[string]any{"parents": true, "entries": []any{
			map[string]any{"src": filepath.Join(folder, "a.txt"), "dst": filepath.Join(folder, "moved", "a.txt")},
			map[string]any{"src": filepath.Join(folder, "old", "c.txt"), "dst": filepath.Join(folder, "b.txt")},
		}, "overwrite": true}
		if dry {
			a["dry_run"] = true
		}
		return a
	}
	before := dryStamps(t, folder)
	snap, err := changes.Take(folder)
	if err != nil {
		t.Fatal(err)
	}

	info := w.wait(w.enqueue("move_files", args(true), refserver.EnqueueOptions{TurnID: "turn-dry", Reversibility: "revertible"}))
	res := result(t, info)
	if info.State != "done" || res["ok"] != true || res["sandbox"] != fullSandbox {
		t.Fatalf("the dry run: %s", info.ResultBody)
	}
	if after := dryStamps(t, folder); !reflect.DeepEqual(after, before) {
		t.Fatalf("the dry run changed the tree:\nbefore %v\nafter  %v", before, after)
	}
	payload, _ := res["payload"].(map[string]any)
	dry, _ := payload["dry_run"].(map[string]any)
	if dry == nil || dry["applied"] != false || dry["layer"] != "overlay" || dry["asked_by"] != "arguments" || dry["ok"] != true {
		t.Fatalf("payload.dry_run: %v", payload["dry_run"])
	}
	// What the real Metnos server reads as a change done, and records
	// an undo entry for: a merged payload with a true ok, a non-zero
	// ok_count or any results (agent_runtime's _undo_done). None of it
	// may be there; the executor's rows are under dry_run.executor, and
	// the result's entries are empty.
	if payload["ok"] != false || payload["ok_count"] != nil || payload["results"] != nil {
		t.Errorf("the dry run's payload claims a change: %v", payload)
	}
	if e, _ := res["entries"].([]any); len(e) != 0 || res["n_processed"] != float64(0) {
		t.Errorf("the dry run's entries %v, n_processed %v: want none", res["entries"], res["n_processed"])
	}
	if ex, _ := dry["executor"].(map[string]any); ex == nil || ex["ok"] != true {
		t.Errorf("dry_run.executor: %v, want move_files' own payload", dry["executor"])
	}
	var listed []changes.Change
	b, _ := json.Marshal(dry["changes"])
	if err := json.Unmarshal(b, &listed); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.history()[info.ID]; ok {
		t.Errorf("the history journal has an entry for the dry run")
	}
	if line := w.auditLine(t, info.ID); line["dry_run"] != true {
		t.Errorf("the dry run's audit line does not say so: %v", line)
	}

	// Now for real: the same invocation makes exactly what was listed.
	info = w.wait(w.enqueue("move_files", args(false), refserver.EnqueueOptions{TurnID: "turn-real", Reversibility: "revertible"}))
	res = result(t, info)
	if info.State != "done" || res["ok"] != true {
		t.Fatalf("the real run: %s", info.ResultBody)
	}
	after, err := changes.Take(folder)
	if err != nil {
		t.Fatal(err)
	}
	real := changes.Diff(snap, after)
	if len(real) == 0 || !reflect.DeepEqual(listed, real) {
		g, _ := json.MarshalIndent(listed, "", "  ")
		r, _ := json.MarshalIndent(real, "", "  ")
		t.Errorf("the dry run listed\n%s\nthe real run changed\n%s", g, r)
	}
	if p, _ := res["payload"].(map[string]any); p["dry_run"] != nil {
		t.Errorf("a real run's payload has dry_run: %v", p["dry_run"])
	}
	if e, ok := w.history()[info.ID]; !ok || e.State != "done" {
		t.Errorf("the real run is not in the history journal: %+v", e)
	}
	if line := w.auditLine(t, info.ID); line["dry_run"] != nil {
		t.Errorf("the real run's audit line says dry_run: %v", line)
	}
}

// TestDryRunRefusedByDevice: an agent that cannot make the layer (its
// bubblewrap missing, METNOS_BWRAP pointing nowhere) refuses a dry run
// (error_class invocation_refused, payload.dry_run.refused saying why)
// and runs nothing; the same invocation without dry_run runs there and
// writes.
func TestDryRunRefusedByDevice(t *testing.T) {
	t.Setenv("TMPDIR", "/var/tmp")
	w := newWorld(t)
	w.pair()
	w.startExe(filepath.Join(binDir, "metnos-agent"), []string{"METNOS_BWRAP=/nonexistent/metnos-e2e/bwrap"})
	target := filepath.Join(w.work, "new.txt")
	args := func(dry bool) map[string]any {
		a := map[string]any{"files": []any{map[string]any{"path": target, "content": "hello\n"}}}
		if dry {
			a["dry_run"] = true
		}
		return a
	}
	info := w.wait(w.enqueue("write_files", args(true), refserver.EnqueueOptions{TurnID: "turn-dry"}))
	res := result(t, info)
	payload, _ := res["payload"].(map[string]any)
	dry, _ := payload["dry_run"].(map[string]any)
	refused, _ := dry["refused"].(string)
	if res["ok"] != false || res["error_class"] != "invocation_refused" || dry["applied"] != false || !strings.Contains(refused, "needs bubblewrap's namespaces") {
		t.Fatalf("the dry run without a layer: %s", info.ResultBody)
	}
	if _, err := os.Lstat(target); err == nil {
		t.Fatal("the refused dry run wrote its file")
	}
	if line := w.auditLine(t, info.ID); line["dry_run"] != true || line["error_class"] != "invocation_refused" {
		t.Errorf("the refusal's audit line: %v", line)
	}
	info = w.wait(w.enqueue("write_files", args(false), refserver.EnqueueOptions{TurnID: "turn-real"}))
	if res := result(t, info); res["ok"] != true {
		t.Fatalf("the same invocation, not dry: %s", info.ResultBody)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "hello\n" {
		t.Fatalf("the same invocation, not dry, did not write: %q %v", b, err)
	}
}
