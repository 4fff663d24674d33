//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// ownerLimits is the owner's limits file of w's device (its folder made
// private, as `limits edit` makes it).
func (w *world) ownerLimits() string {
	w.t.Helper()
	dir := filepath.Join(w.home, ".config", "metnos")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		w.t.Fatal(err)
	}
	return filepath.Join(dir, "limits.toml")
}

// ownerEvents runs `history --json` and returns its owner_events.
func (w *world) ownerEvents() []map[string]any {
	w.t.Helper()
	code, out := w.cli("history", "--json", "-n", "0")
	if code != 0 {
		w.t.Fatalf("history: exit %d\n%s", code, out)
	}
	var h struct {
		OwnerEvents []map[string]any `json:"owner_events"`
	}
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		w.t.Fatalf("history --json: %v\n%s", err, out)
	}
	return h.OwnerEvents
}

// TestOwnerReadonlyRefusesWriteFiles: with the owner's limits in
// readonly mode, write_files is refused before it runs: the server gets
// ok false, device_error, sandbox none and the rule's words; the file
// is not written; the agent logs the refusal at warn; the audit log
// (which still verifies) and history say who refused it. A reader runs.
func TestOwnerReadonlyRefusesWriteFiles(t *testing.T) {
	w := newWorld(t)
	w.pair()
	limits := w.ownerLimits()
	if err := os.WriteFile(limits, []byte("mode = \"readonly\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := w.start()
	out := filepath.Join(w.work, "made.txt")
	info := w.wait(w.enqueue("write_files", map[string]any{"files": []any{map[string]any{"path": out, "content": "made\n"}}},
		refserver.EnqueueOptions{TurnID: "turn-ro"}))
	r := result(t, info)
	want := "executor write_files: not run on this device: refused by the owner's limits (" + limits + `): mode = "readonly" refuses executors that write`
	if r["ok"] != false || r["error_class"] != "device_error" || r["sandbox"] != "none" || r["error"] != want {
		t.Fatalf("result %s\nwant ok false, device_error, sandbox none, error %q", info.ResultBody, want)
	}
	if _, err := os.Lstat(out); err == nil {
		t.Fatal("write_files ran: its file was written")
	}
	if info := w.wait(w.enqueue("echo_args", map[string]any{"x": 1}, refserver.EnqueueOptions{})); result(t, info)["ok"] != true {
		t.Errorf("a reader under readonly: %s", info.ResultBody)
	}
	p.stop(t)
	if !logHas(p, `"level":"WARN","msg":"refused by the owner's limits; not run"`) && !logHas(p, "refused by the owner's limits; not run") {
		t.Error("the refusal is not in the agent's log")
	}
	ev := w.ownerEvents()
	var refused map[string]any
	for _, e := range ev {
		if e["event"] == "refused" {
			refused = e
		}
	}
	if refused == nil || refused["invocation_id"] != info.ID || !strings.Contains(refused["refused_by"].(string), `mode = "readonly"`) {
		t.Errorf("history's owner events: %v", ev)
	}
	if code, out := w.cli("history"); code != 0 || !strings.Contains(out, "refused by the owner") {
		t.Errorf("history: exit %d\n%s", code, out)
	}
	if code, out := w.cli("audit", "verify"); code != 0 {
		t.Errorf("audit verify: exit %d\n%s", code, out)
	}
}

// TestOwnerLimitsEditRecorded: an edit of the limits file while the
// agent runs is put in force before the next invocation (write_files,
// which ran before it, is refused after it) and recorded in the audit
// log with its old and new values; history shows it; a file that is
// refused (a key it does not know) is recorded, and the limits in force
// stay; the audit log verifies.
func TestOwnerLimitsEditRecorded(t *testing.T) {
	w := newWorld(t)
	w.pair()
	limits := w.ownerLimits()
	if err := os.WriteFile(limits, []byte("mode = \"full\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := w.start()
	write := func(name string) map[string]any {
		t.Helper()
		out := filepath.Join(w.work, name)
		return result(t, w.wait(w.enqueue("write_files", map[string]any{"files": []any{map[string]any{"path": out, "content": "made\n"}}},
			refserver.EnqueueOptions{})))
	}
	if r := write("before.txt"); r["ok"] != true {
		t.Fatalf("write_files in full mode: %v", r)
	}

	// The owner's edit.
	if err := os.WriteFile(limits, []byte("# the owner's\nmode = \"readonly\"\n[executors]\ndeny = [\"delete_files\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := write("after.txt"); r["ok"] != false || !strings.Contains(r["error"].(string), `mode = "readonly" refuses executors that write`) {
		t.Fatalf("write_files after the edit: %v", r)
	}
	// A broken edit: recorded, refused, readonly stays.
	if err := os.WriteFile(limits, []byte("moed = \"full\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	os.Chtimes(limits, later, later)
	if r := write("broken.txt"); r["ok"] != false || !strings.Contains(r["error"].(string), `mode = "readonly"`) {
		t.Fatalf("write_files after a broken edit: %v", r)
	}
	p.stop(t)

	var changes []map[string]any
	for _, e := range w.ownerEvents() {
		if e["event"] == "limits_changed" {
			changes = append(changes, e)
		}
	}
	if len(changes) != 3 {
		t.Fatalf("the limits changes recorded: %v, want 3 (the start, the edit, the broken edit)", changes)
	}
	broken, edit, start := changes[0], changes[1], changes[2]
	if start["seen"] != "start" || start["in_force"] != true {
		t.Errorf("the start: %v", start)
	}
	b, _ := json.Marshal(edit["changes"])
	if edit["seen"] != "run" || edit["in_force"] != true ||
		string(b) != `[{"key":"mode","new":"\"readonly\"","old":"\"full\""},{"key":"executors.deny","new":"[\"delete_files\"]","old":"[]"}]` {
		t.Errorf("the edit: %v (changes %s)", edit, b)
	}
	if broken["in_force"] == true || !strings.Contains(broken["error"].(string), `limits.toml:1:1: unknown key "moed"`) {
		t.Errorf("the broken edit: %v", broken)
	}
	if code, out := w.cli("history"); code != 0 || !strings.Contains(out, `mode: "full" → "readonly"`) {
		t.Errorf("history: exit %d\n%s", code, out)
	}
	if code, out := w.cli("audit", "verify"); code != 0 {
		t.Errorf("audit verify: exit %d\n%s", code, out)
	}
	// The next start refuses the broken file, naming it.
	if code, out := w.cli("run"); code != 1 || !strings.Contains(out, `limits.toml:1:1: unknown key "moed"`) {
		t.Errorf("run with a broken limits file: exit %d\n%s", code, out)
	}
}
