//go:build linux

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/refserver"
)

// historyEntry is what these tests read of `history --json`.
type historyEntry struct {
	InvocationID string           `json:"invocation_id"`
	Executor     string           `json:"executor"`
	State        string           `json:"state"`
	Undo         string           `json:"undo"`
	Reverses     []string         `json:"reverses"`
	UndoneBy     map[string][]int `json:"undone_by"`
	Conflicts    []struct {
		Why string `json:"why"`
	} `json:"conflicts"`
}

// pairedAndRunning is a world whose agent is paired and running, with
// TMPDIR in /var/tmp (inside bwrap /tmp is the command's own, so the
// folders the executors work on must not be there).
func pairedAndRunning(t *testing.T) (*world, *agentProc) {
	t.Helper()
	t.Setenv("TMPDIR", "/var/tmp")
	w := newWorld(t)
	w.pair()
	return w, w.start()
}

// history runs `metnos-agent history --json -n 0` and indexes it by id.
func (w *world) history() map[string]historyEntry {
	w.t.Helper()
	code, out := w.cli("history", "--json", "-n", "0")
	if code != 0 {
		w.t.Fatalf("history: exit %d\n%s", code, out)
	}
	var h struct {
		Problem string         `json:"problem"`
		Entries []historyEntry `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		w.t.Fatalf("history --json: %v\n%s", err, out)
	}
	if h.Problem != "" {
		w.t.Fatalf("history: %s", h.Problem)
	}
	m := map[string]historyEntry{}
	for _, e := range h.Entries {
		m[e.InvocationID] = e
	}
	return m
}

// changes sets up the two changes these tests undo: a photo folder
// organised (one photo replacing an older file, whose blob is kept) in
// one turn, and two documents deleted (blobs first) in another. It
// returns the photo folder, the documents, the trees before, and the
// two invocation ids.
func (w *world) changes(t *testing.T) (photos string, docs []string, before map[string]string, organize, del string) {
	t.Helper()
	photos = filepath.Join(w.work, "photos")
	if err := examples.GeneratePhotos(photos, examples.DemoPhotos()); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(photos, "2024", "07", "vacanza_mare.jpg")
	os.MkdirAll(filepath.Dir(old), 0o755)
	os.WriteFile(old, []byte("an older edit\n"), 0o640)
	docsDir := filepath.Join(w.work, "docs")
	os.MkdirAll(docsDir, 0o755)
	for name, body := range map[string]string{"tax-2023.pdf": "%PDF-1.4 tax return", "letter.txt": "Dear Anna,\n"} {
		p := filepath.Join(docsDir, name)
		os.WriteFile(p, []byte(body), 0o600)
		docs = append(docs, p)
	}
	before = map[string]string{"photos": tree(t, photos), "docs": tree(t, docsDir)}

	info := w.wait(w.enqueue("organize_photos", map[string]any{"folder": photos},
		refserver.EnqueueOptions{TurnID: "turn-photos", Reversibility: "revertible", Env: map[string]string{"METNOS_TURN_ID": "turn-photos"}}))
	if info.State != "done" {
		t.Fatalf("organize: %s", info.ResultBody)
	}
	organize = info.ID
	info = w.wait(w.enqueue("delete_files", map[string]any{"paths": docs},
		refserver.EnqueueOptions{TurnID: "turn-docs", Reversibility: "revertible", Env: map[string]string{"METNOS_TURN_ID": "turn-docs"}}))
	if info.State != "done" {
		t.Fatalf("delete: %s", info.ResultBody)
	}
	del = info.ID
	for _, d := range docs {
		if _, err := os.Lstat(d); err == nil {
			t.Fatalf("%s was not deleted", d)
		}
	}
	h := w.history()
	if e := h[organize]; e.State != "done" || e.Undo != "move 8 files back, restore 1 file from its backup, remove 4 created folders" {
		t.Fatalf("history of the organize: %+v", e)
	}
	if e := h[del]; e.State != "done" || e.Undo != "restore 2 files from their backups" {
		t.Fatalf("history of the delete: %+v", e)
	}
	return photos, docs, before, organize, del
}

// TestServerUndoInHistory: the server's undo of a move and of a delete
// (reverse invocations, as Metnos sends them) restores every file byte
// for byte, and the device's history journal shows both changes undone,
// by those invocations.
func TestServerUndoInHistory(t *testing.T) {
	w, _ := pairedAndRunning(t)
	photos, docs, before, organize, del := w.changes(t)
	var reverse []string
	for _, turn := range []string{"turn-photos", "turn-docs"} {
		plan, err := w.srv.Undo(w.device, turn, refserver.EnqueueOptions{})
		if err != nil || len(plan.Unsupported) != 0 {
			t.Fatalf("undo plan of %s: %+v %v", turn, plan, err)
		}
		for _, id := range plan.IDs {
			if info := w.wait(id); info.State != "done" {
				t.Fatalf("undo step %s: %s", info.Executor, info.ResultBody)
			}
		}
		reverse = append(reverse, plan.IDs...)
	}
	if tree(t, photos) != before["photos"] || tree(t, filepath.Dir(docs[0])) != before["docs"] {
		t.Fatal("the server's undo did not restore every file")
	}
	h := w.history()
	for _, id := range []string{organize, del} {
		e := h[id]
		if e.State != "undone" {
			t.Fatalf("%s (%s) after the server's undo: %s (%s)", id, e.Executor, e.State, e.Undo)
		}
		for by := range e.UndoneBy {
			if !strings.Contains(strings.Join(reverse, " "), by) {
				t.Errorf("%s marked undone by %q, not one of the reverse invocations %v", id, by, reverse)
			}
		}
	}
	if e := h[reverse[0]]; len(e.Reverses) != 1 || e.Reverses[0] != organize {
		t.Errorf("the first reverse invocation does not say what it undid: %+v", e)
	}
	if code, out := w.cli("undo", "--last", "--offline", "--dry-run"); code != 0 || !strings.Contains(out, "Nothing to undo") {
		t.Errorf("undo --last after everything was undone: %d %s", code, out)
	}
}

// TestServerRestoreOfCorruptedBlob: a backup blob whose bytes changed is
// not restored by the server's undo either: the agent refuses the
// reverse invocation that names it, before running anything.
func TestServerRestoreOfCorruptedBlob(t *testing.T) {
	w, _ := pairedAndRunning(t)
	_, docs, _, _, _ := w.changes(t)
	blobs, _ := filepath.Glob(filepath.Join(w.dataDir(), "shimdata", "_history", "turn-docs", "blob", "*.bin"))
	if len(blobs) != 2 {
		t.Fatalf("blobs: %v", blobs)
	}
	for _, b := range blobs {
		data, _ := os.ReadFile(b)
		data[0] ^= 1
		os.WriteFile(b, data, 0o600)
	}
	plan, err := w.srv.Undo(w.device, "turn-docs", refserver.EnqueueOptions{})
	if err != nil || len(plan.IDs) != 1 {
		t.Fatalf("undo plan: %+v %v", plan, err)
	}
	info := w.wait(plan.IDs[0])
	r := result(t, info)
	if info.State != "failed" || !strings.Contains(r["error"].(string), "corrupted") {
		t.Fatalf("restore of corrupted blobs: %s", info.ResultBody)
	}
	for _, d := range docs {
		if _, err := os.Lstat(d); err == nil {
			t.Fatalf("%s was restored from a corrupted blob", d)
		}
	}
}

// TestOfflineUndo: with the server answering, a local undo is refused
// unless --offline; with the server gone, `undo --offline` restores
// what it can, reports a moved file edited since and a corrupted blob
// as conflicts, clobbers nothing, and the history says partly undone.
func TestOfflineUndo(t *testing.T) {
	w, p := pairedAndRunning(t)
	photos, docs, before, organize, del := w.changes(t)
	p.stop(t)

	if code, out := w.cli("undo", "--last"); code != 1 || !strings.Contains(out, "ask Metnos to undo") {
		t.Fatalf("undo while the server answers: exit %d\n%s", code, out)
	}
	if code, out := w.cli("undo", "--dry-run", organize); code != 1 || !strings.Contains(out, "undo would be refused") {
		t.Fatalf("dry run while the server answers: exit %d\n%s", code, out)
	}
	if code, out := w.cli("undo", "--offline", "--dry-run", organize); code != 0 || !strings.Contains(out, "Nothing was changed") || strings.Count(out, "✓") != 13 {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	if tree(t, photos) == before["photos"] {
		t.Fatal("the dry run changed the folder")
	}
	w.proxy.down()

	// The delete, with one of its two blobs corrupted.
	blobs, _ := filepath.Glob(filepath.Join(w.dataDir(), "shimdata", "_history", "turn-docs", "blob", "*.bin"))
	data, _ := os.ReadFile(blobs[0])
	data[len(data)-1] ^= 1
	os.WriteFile(blobs[0], data, 0o600)
	code, out := w.cli("undo", "--offline", del)
	if code != 1 || !strings.Contains(out, "corrupted") || strings.Count(out, "✓") != 1 {
		t.Fatalf("undo of the delete with a corrupted blob: exit %d\n%s", code, out)
	}
	restored := 0
	for _, d := range docs {
		if _, err := os.Lstat(d); err == nil {
			restored++
		}
	}
	if restored != 1 {
		t.Fatalf("%d documents restored, want 1 (the other's blob is corrupted)", restored)
	}

	// The organize, with one moved photo edited since.
	edited := filepath.Join(photos, "2024", "07", "vacanza_mare.jpg")
	orig, _ := os.ReadFile(edited)
	fi, _ := os.Stat(edited)
	if err := os.WriteFile(edited, []byte("edited after the organize\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	code, out = w.cli("undo", "--offline", organize)
	if code != 1 || !strings.Contains(out, "changed since it was moved") {
		t.Fatalf("undo of the organize with an edited photo: exit %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(edited); string(b) != "edited after the organize\n" {
		t.Fatalf("the edited photo was touched: %q", b)
	}
	h := w.history()
	if h[organize].State != "partly-undone" || len(h[organize].Conflicts) == 0 || h[del].State != "partly-undone" {
		t.Fatalf("history after the offline undo: %+v\n%+v", h[organize], h[del])
	}
	// Take the edit back (bytes and time): the next undo finishes the job.
	os.WriteFile(edited, orig, 0o640)
	os.Chtimes(edited, fi.ModTime(), fi.ModTime())
	code, out = w.cli("undo", "--offline", organize)
	if code != 0 || !strings.Contains(out, "everything put back") {
		t.Fatalf("undo again after the conflict was cleared: exit %d\n%s", code, out)
	}
	if got := tree(t, photos); got != before["photos"] {
		t.Fatalf("after the second undo:\nbefore %s\nafter  %s", before["photos"], got)
	}
	if h := w.history(); h[organize].State != "undone" {
		t.Fatalf("history after the second undo: %+v", h[organize])
	}
}

// TestAuditLog: every invocation the agent handled has one line in the
// day's audit file, correlated by invocation and turn id, with the
// sandbox word and the Policy fingerprint; secrets in the arguments are
// not in the file; `audit verify` finds an edited line.
func TestAuditLog(t *testing.T) {
	w, _ := pairedAndRunning(t)
	secrets := []string{"hunter2-correct-horse", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLWJ5dGVz", "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"}
	ids := []string{
		w.wait(w.enqueue("echo_args", map[string]any{"password": secrets[0], "header": secrets[1], "note": "see /home/anna/Documents/tax.pdf", "keys": []any{secrets[2]}},
			refserver.EnqueueOptions{TurnID: "turn-audit"})).ID,
		w.wait(w.enqueue("list_folder", map[string]any{"path": w.work}, refserver.EnqueueOptions{TurnID: "turn-audit"})).ID,
	}
	files, _ := filepath.Glob(filepath.Join(w.dataDir(), "audit", "*.jsonl"))
	if len(files) != 1 {
		t.Fatalf("audit files: %v", files)
	}
	raw, _ := os.ReadFile(files[0])
	for _, s := range secrets {
		if strings.Contains(string(raw), s) || strings.Contains(string(raw), s[len(s)/2:]) {
			t.Fatalf("the audit log holds a secret (%s…):\n%s", s[:6], raw)
		}
	}
	if !strings.Contains(string(raw), "/home/anna/Documents/tax.pdf") || !strings.Contains(string(raw), "redacted:blake3:") {
		t.Fatalf("the audit log lost what is not a secret, or did not mark what is:\n%s", raw)
	}
	got := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		got[m["invocation_id"].(string)] = m
	}
	for _, id := range ids {
		m := got[id]
		if fp, _ := m["policy_fingerprint"].(string); m == nil || m["turn_id"] != "turn-audit" || m["sandbox"] != bestSandbox() || m["ok"] != true || fp == "" {
			t.Fatalf("audit line of %s: %v", id, m)
		}
	}
	if code, out := w.cli("audit", "verify"); code != 0 {
		t.Fatalf("audit verify of an intact log: %d %s", code, out)
	}
	os.WriteFile(files[0], []byte(strings.Replace(string(raw), `"ok":true`, `"ok":false`, 1)), 0o600)
	if code, out := w.cli("audit", "verify"); code != 1 || !strings.Contains(out, "line 1") {
		t.Fatalf("audit verify of an edited log: %d %s", code, out)
	}
}

// TestLocalUndoOfALyingResult: an executor's result rows claim a move
// from outside the folder it could write, and a restore from a "blob"
// outside the history folder to a place outside too. The local undo,
// which runs outside the sandbox, touches neither: it acts only inside
// the write grants the agent recorded for that run.
func TestLocalUndoOfALyingResult(t *testing.T) {
	w, p := pairedAndRunning(t)
	folder := filepath.Join(w.work, "granted")
	os.MkdirAll(folder, 0o755)
	os.WriteFile(filepath.Join(folder, "a.txt"), []byte("a"), 0o644)
	secret := filepath.Join(w.home, ".ssh", "id_ed25519")
	os.MkdirAll(filepath.Dir(secret), 0o700)
	fake := filepath.Join(w.work, "fake.bin")
	os.WriteFile(fake, []byte("attacker's key"), 0o644)
	authorized := filepath.Join(w.home, ".ssh", "authorized_keys")
	sum := sha256.Sum256([]byte("attacker's key"))
	info := w.wait(w.enqueue("liar", map[string]any{"folder": folder, "claim": secret, "restore_to": authorized,
		"blob": fake, "blob_sha256": hex.EncodeToString(sum[:])}, refserver.EnqueueOptions{}))
	if info.State != "done" {
		t.Fatalf("liar: %s", info.ResultBody)
	}
	p.stop(t)
	w.proxy.down()
	code, out := w.cli("undo", "--offline", info.ID)
	if code != 1 || strings.Count(out, "✗") != 2 {
		t.Fatalf("undo of a lying result: exit %d\n%s", code, out)
	}
	if _, err := os.Lstat(secret); err == nil {
		t.Fatal("the undo moved a file out of the granted folder to a place it named")
	}
	if _, err := os.Lstat(authorized); err == nil {
		t.Fatal("the undo wrote a file outside the granted folder from a blob outside the history folder")
	}
	if b, err := os.ReadFile(filepath.Join(folder, "b.txt")); err != nil || string(b) != "a" {
		t.Fatalf("the granted folder's file: %q %v", b, err)
	}
}

// TestKilledOfflineUndo: the agent moves 1,000 files (move_files, as the
// server would ask); then `metnos-agent undo --offline` is killed with
// SIGKILL at random moments, several times, and run once more: every
// file is back, byte for byte, none lost, none doubled.
func TestKilledOfflineUndo(t *testing.T) {
	w, p := pairedAndRunning(t)
	folder := filepath.Join(w.work, "inbox")
	os.MkdirAll(folder, 0o755)
	var entries []any
	for i := range 1000 {
		name := fmt.Sprintf("note-%04d.txt", i)
		os.WriteFile(filepath.Join(folder, name), []byte(strings.Repeat(name, i%7+1)), 0o644)
		entries = append(entries, map[string]any{"src": filepath.Join(folder, name), "dst": filepath.Join(folder, "sorted", fmt.Sprint(i%10), name)})
	}
	before := tree(t, folder)
	info := w.wait(w.enqueue("move_files", map[string]any{"entries": entries, "parents": true}, refserver.EnqueueOptions{DeadlineMS: 120000}))
	if info.State != "done" {
		t.Fatalf("move_files: %s", info.ResultBody)
	}
	p.stop(t)
	w.proxy.down()
	killed := 0
	for i := range 5 {
		cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), "undo", "--offline", info.ID)
		cmd.Env = w.env()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(5+rand.IntN(40)+10*i) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		if err := cmd.Wait(); err != nil {
			killed++
		}
	}
	t.Logf("%d of 5 undo runs were killed before they ended", killed)
	if code, out := w.cli("undo", "--offline", info.ID); code != 0 {
		t.Fatalf("the undo after the kills: exit %d\n%s", code, out)
	}
	if got := tree(t, folder); got != before {
		t.Fatalf("after the killed undos:\nbefore %.400s\nafter  %.400s", before, got)
	}
	if e := w.history()[info.ID]; e.State != "undone" {
		t.Fatalf("history: %+v", e)
	}
	if code, out := w.cli("history"); code != 0 || strings.Contains(out, "tampered") {
		t.Fatalf("history after the kills: %d %s", code, out)
	}
}

// TestOfflineUndoOfEveryRowShape: the example executors write the rows
// the upstream Metnos file executors write (a file made, one written
// over, one skipped, folders made, a file moved over another, files
// deleted); with the server gone, `undo --offline` of each, newest
// first, says everything was put back, exits 0, and leaves the folder
// byte for byte as it was; history calls each change undone and says
// what it was.
func TestOfflineUndoOfEveryRowShape(t *testing.T) {
	w, p := pairedAndRunning(t)
	dir := filepath.Join(w.work, "notes")
	os.MkdirAll(filepath.Join(dir, "sorted"), 0o755)
	for name, body := range map[string]string{"todo.txt": "buy milk\n", "same.txt": "kept\n", "b.txt": "b now\n", "sorted/b.txt": "an older b\n", "gone.txt": "to delete\n"} {
		os.WriteFile(filepath.Join(dir, name), []byte(body), 0o640)
	}
	old := time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)
	filepath.WalkDir(dir, func(p string, _ os.DirEntry, _ error) error { return os.Chtimes(p, old, old) })
	before := tree(t, dir)

	var ids []string
	for i, step := range []struct {
		executor string
		args     map[string]any
	}{
		{"write_files", map[string]any{"files": []any{
			map[string]any{"path": filepath.Join(dir, "todo.txt"), "content": "buy oat milk\n"},
			map[string]any{"path": filepath.Join(dir, "new", "deeper", "made.txt"), "content": "made\n"},
			map[string]any{"path": filepath.Join(dir, "same.txt"), "content": "not written", "mode": "skip_if_exists"},
		}}},
		{"create_dirs", map[string]any{"paths": []any{filepath.Join(dir, "2024"), filepath.Join(dir, "2025"), filepath.Join(dir, "2025", "01")}}},
		{"move_files", map[string]any{"entries": []any{map[string]any{"src": filepath.Join(dir, "b.txt")}}, "dst_template": filepath.Join(dir, "sorted") + "/{name}", "overwrite": true}},
		{"delete_files", map[string]any{"paths": []any{filepath.Join(dir, "gone.txt")}}},
	} {
		turn := fmt.Sprintf("turn-shape-%d", i)
		info := w.wait(w.enqueue(step.executor, step.args,
			refserver.EnqueueOptions{TurnID: turn, Reversibility: "revertible", Env: map[string]string{"METNOS_TURN_ID": turn}}))
		if info.State != "done" {
			t.Fatalf("%s: %s", step.executor, info.ResultBody)
		}
		ids = append(ids, info.ID)
	}
	h := w.history()
	for id, want := range map[string]string{
		ids[0]: "restore 1 file from its backup, remove 1 created file, remove 2 created folders",
		ids[1]: "remove 3 created folders",
		ids[2]: "move 1 file back, restore 1 file from its backup",
		ids[3]: "restore 1 file from its backup",
	} {
		if h[id].Undo != want {
			t.Errorf("%s (%s) undo would: %q, want %q", id, h[id].Executor, h[id].Undo, want)
		}
	}
	p.stop(t)
	w.proxy.down()
	for i := len(ids) - 1; i >= 0; i-- {
		code, out := w.cli("undo", "--offline", ids[i])
		if code != 0 || !strings.Contains(out, "everything put back") {
			t.Fatalf("undo --offline of %s: exit %d\n%s", h[ids[i]].Executor, code, out)
		}
	}
	if got := tree(t, dir); got != before {
		t.Fatalf("after the offline undo:\n%s\nbefore:\n%s", got, before)
	}
	for _, name := range []string{"todo.txt", "b.txt", "sorted/b.txt", "gone.txt"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		} else if !fi.ModTime().Equal(old) {
			t.Errorf("%s: modified %v, was %v", name, fi.ModTime(), old)
		}
	}
	h = w.history()
	for _, id := range ids {
		if h[id].State != "undone" {
			t.Errorf("%s (%s): %s", id, h[id].Executor, h[id].State)
		}
	}
	if code, out := w.cli("history"); code != 0 || !strings.Contains(out, "3 folders made") || !strings.Contains(out, "1 file overwritten") {
		t.Errorf("history: %d\n%s", code, out)
	}
}
