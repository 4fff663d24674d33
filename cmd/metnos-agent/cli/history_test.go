package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/undo"
)

// runWith runs a command in-process with HOME at home (and nothing
// else of the environment), returning its exit code, stdout and stderr.
func runWith(t *testing.T, home string, args ...string) (int, string, string) {
	t.Helper()
	env := map[string]string{"HOME": home}
	e, err := readEnvironment(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run(stdio{out: &out, err: &errb, env: &envResult{e, nil}}, args)
	return code, out.String(), errb.String()
}

// files lists every file and folder under dir.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != dir {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestReadOnlyCommandsWriteNothing: on an account that was never
// paired, the commands that only read (`history`, `undo --dry-run`)
// and those that refuse (an undo of a change the device never made)
// create no file: no journal folder, no LOCK, no undo.lock.
func TestReadOnlyCommandsWriteNothing(t *testing.T) {
	home := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"undo", "--last", "--dry-run"}, exitOK, "Nothing to undo"},
		{[]string{"undo", "--dry-run", "inv-1"}, exitFailure, "inv-1: no such change"},
		{[]string{"undo", "--offline", "inv-1"}, exitFailure, "inv-1: no such change"},
		{[]string{"undo", "inv-1"}, exitFailure, "inv-1: no such change"},
		{[]string{"undo", "--offline", "--last"}, exitOK, "Nothing to undo"},
		{[]string{"history"}, exitOK, ""},
		{[]string{"history", "--json"}, exitOK, ""},
	} {
		code, out, errs := runWith(t, home, c.args...)
		if code != c.code || !strings.Contains(out+errs, c.says) {
			t.Errorf("%v: exit %d, %q %q; want exit %d saying %q", c.args, code, out, errs, c.code, c.says)
		}
		if got := files(t, home); len(got) > 0 {
			t.Fatalf("%v wrote %v", c.args, got)
		}
	}
}

// journalOf opens the journal of the agent whose HOME is home.
func journalOf(t *testing.T, home string) (*undo.Journal, string, string) {
	t.Helper()
	e, err := readEnvironment(func(k string) string { return map[string]string{"HOME": home}[k] })
	if err != nil {
		t.Fatal(err)
	}
	j, err := undo.Open(e.lay.Journal())
	if err != nil {
		t.Fatal(err)
	}
	return j, e.lay.Blobs(), e.lay.Journal()
}

// TestALocalUndoThatLeavesSomethingSaysSo: an undo with a step it
// cannot do (a blob that is gone) does not print "everything put
// back", exits 1, and history does not call the change undone; one
// that does everything says so and exits 0.
func TestALocalUndoThatLeavesSomethingSaysSo(t *testing.T) {
	home := t.TempDir()
	folder := filepath.Join(home, "Documents")
	os.MkdirAll(folder, 0o755)
	j, history, _ := journalOf(t, home)
	// write_files as upstream: one file made, one overwritten (its
	// backup then lost), one skipped.
	made, over, kept := filepath.Join(folder, "made.txt"), filepath.Join(folder, "over.txt"), filepath.Join(folder, "kept.txt")
	for p, s := range map[string]string{made: "made", over: "new", kept: "kept"} {
		os.WriteFile(p, []byte(s), 0o644)
	}
	blob := filepath.Join(history, "turn-1", "blob", strings.Repeat("ab", 32)+".bin")
	j.Begin(undo.Begin{InvocationID: "inv-w", Executor: "write_files", Reverse: []string{"restore_blob_backup", "delete_created_paths"},
		Roots: []string{folder}, History: history})
	payload := map[string]any{"ok": true, "results": []any{
		map[string]any{"path": over, "created": false, "prev_blob_path": blob, "mode": "overwrite"},
		map[string]any{"path": made, "created": true},
		map[string]any{"path": kept, "created": false, "skipped": true},
	}}
	if _, err := j.Finish("inv-w", undo.Outcome{OK: true, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	code, out, errb := runWith(t, home, "undo", "--offline", "inv-w")
	if code != exitFailure || strings.Contains(out, "everything put back") || !strings.Contains(out, "Not everything was put back") ||
		!strings.Contains(out, "is gone") || strings.Contains(out, "not undoable here") {
		t.Fatalf("undo: exit %d\n%s%s", code, out, errb)
	}
	if _, err := os.Lstat(made); err == nil {
		t.Error("the created file is still there")
	}
	var h struct {
		Entries []struct {
			State string `json:"state"`
		} `json:"entries"`
	}
	_, out, _ = runWith(t, home, "history", "--json")
	if err := json.Unmarshal([]byte(out), &h); err != nil || len(h.Entries) != 1 || h.Entries[0].State == "undone" {
		t.Fatalf("history after a partial undo: %v\n%s", err, out)
	}
	_, out, _ = runWith(t, home, "history")
	if !strings.Contains(out, "1 file made, 1 file overwritten") || !strings.Contains(out, "conflict:") {
		t.Fatalf("history:\n%s", out)
	}
}

// TestHistorySaysFoldersAreFolders: create_dirs' rows are folders made,
// and undone as folders.
func TestHistorySaysFoldersAreFolders(t *testing.T) {
	home := t.TempDir()
	folder := filepath.Join(home, "Pictures")
	j, history, _ := journalOf(t, home)
	var rows []any
	for _, d := range []string{"2021", "2022", "2023", "2024", "2025"} {
		os.MkdirAll(filepath.Join(folder, d), 0o755)
		rows = append(rows, map[string]any{"path": filepath.Join(folder, d), "created": true, "mode_octal": "0o755"})
	}
	j.Begin(undo.Begin{InvocationID: "inv-d", Executor: "create_dirs", Reverse: []string{"delete_created_paths"}, Roots: []string{folder}, History: history})
	if _, err := j.Finish("inv-d", undo.Outcome{OK: true, Payload: map[string]any{"ok": true, "results": rows}}); err != nil {
		t.Fatal(err)
	}
	_, out, _ := runWith(t, home, "history")
	if !strings.Contains(out, "5 folders made") || !strings.Contains(out, "remove 5 created folders") || strings.Contains(out, "files") {
		t.Fatalf("history:\n%s", out)
	}
	code, out, errb := runWith(t, home, "undo", "--offline", "--last")
	if code != exitOK || !strings.Contains(out, "everything put back") {
		t.Fatalf("undo: exit %d\n%s%s", code, out, errb)
	}
	if ents, _ := os.ReadDir(folder); len(ents) != 0 {
		t.Fatalf("left: %v", ents)
	}
}

// TestUndoAcceptsFlagsAfterTheID: `undo ID --offline`, as the help's
// synopsis shows it.
func TestUndoAcceptsFlagsAfterTheID(t *testing.T) {
	home := t.TempDir()
	folder := filepath.Join(home, "Pictures")
	os.MkdirAll(filepath.Join(folder, "2024"), 0o755)
	j, history, _ := journalOf(t, home)
	j.Begin(undo.Begin{InvocationID: "inv-f", Executor: "create_dirs", Reverse: []string{"delete_created_paths"}, Roots: []string{folder}, History: history})
	j.Finish("inv-f", undo.Outcome{OK: true, Payload: map[string]any{"results": []any{map[string]any{"path": filepath.Join(folder, "2024"), "created": true}}}})
	if code, out, errb := runWith(t, home, "undo", "inv-f", "--dry-run"); code != exitOK || !strings.Contains(out, "Would undo") {
		t.Fatalf("undo ID --dry-run: exit %d\n%s%s", code, out, errb)
	}
	if code, out, errb := runWith(t, home, "undo", "inv-f", "--offline"); code != exitOK || !strings.Contains(out, "everything put back") {
		t.Fatalf("undo ID --offline: exit %d\n%s%s", code, out, errb)
	}
}

// TestUndoLastRefusesAnEditedRecord: after the journal was edited,
// `history` warns and names the change, and `undo --last --offline`
// refuses it, saying which records fail the chain, and changes nothing.
func TestUndoLastRefusesAnEditedRecord(t *testing.T) {
	home := t.TempDir()
	folder := filepath.Join(home, "Pictures")
	made := filepath.Join(folder, "2024")
	os.MkdirAll(made, 0o755)
	j, history, dir := journalOf(t, home)
	j.Begin(undo.Begin{InvocationID: "inv-e", Executor: "create_dirs", Reverse: []string{"delete_created_paths"}, Roots: []string{folder}, History: history})
	j.Finish("inv-e", undo.Outcome{OK: true, Payload: map[string]any{"results": []any{map[string]any{"path": made, "created": true}}}})
	p := filepath.Join(dir, "journal.jsonl")
	raw, _ := os.ReadFile(p)
	os.WriteFile(p, bytes.Replace(raw, []byte(`"executor":"create_dirs"`), []byte(`"executor":"create_dirz"`), 1), 0o600)

	_, out, _ := runWith(t, home, "history")
	if !strings.Contains(out, "tampered") || !strings.Contains(out, "refuses the changes recorded at or after that place: inv-e") {
		t.Fatalf("history:\n%s", out)
	}
	code, out, errb := runWith(t, home, "undo", "--offline", "--last")
	if code != exitFailure || !strings.Contains(errb, "refused") || !strings.Contains(errb, "lines 1, 2") || !strings.Contains(errb, p) {
		t.Fatalf("undo --last --offline: exit %d\n%s%s", code, out, errb)
	}
	if _, err := os.Stat(made); err != nil {
		t.Fatal("the folder of the edited record was removed")
	}
}

// TestAPartialUndoDoesNotSayNothingWasOverwritten: an undo that put a
// file's version from before the run back over what the executor wrote,
// and left another step, does not claim that nothing was overwritten.
func TestAPartialUndoDoesNotSayNothingWasOverwritten(t *testing.T) {
	home := t.TempDir()
	folder := filepath.Join(home, "Documents")
	os.MkdirAll(folder, 0o755)
	j, history, _ := journalOf(t, home)
	a, b := filepath.Join(folder, "a.txt"), filepath.Join(folder, "b.txt")
	sum := sha256.Sum256([]byte("alpha"))
	blob := filepath.Join(history, "turn-1", "blob", hex.EncodeToString(sum[:])+".bin")
	os.MkdirAll(filepath.Dir(blob), 0o700)
	os.WriteFile(blob, []byte("alpha"), 0o600)
	gone := filepath.Join(history, "turn-1", "blob", strings.Repeat("ab", 32)+".bin")
	os.WriteFile(a, []byte("the executor's a"), 0o644)
	os.WriteFile(b, []byte("the executor's b"), 0o644)
	j.Begin(undo.Begin{InvocationID: "inv-o", Executor: "write_files", Reverse: []string{"restore_blob_backup"}, Roots: []string{folder}, History: history})
	payload := map[string]any{"results": []any{
		map[string]any{"path": a, "prev_blob_path": blob},
		map[string]any{"path": b, "prev_blob_path": gone},
	}}
	if _, err := j.Finish("inv-o", undo.Outcome{OK: true, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	code, out, errb := runWith(t, home, "undo", "--offline", "inv-o")
	if got, _ := os.ReadFile(a); code != exitFailure || string(got) != "alpha" {
		t.Fatalf("undo: exit %d, a.txt %q\n%s%s", code, got, out, errb)
	}
	if strings.Contains(out, "nothing was overwritten") || !strings.Contains(out, "no file changed since the run was replaced") {
		t.Fatalf("undo that replaced a.txt:\n%s", out)
	}
}

// TestAnUndoWhoseRecordFailedStillSaysWhatItDid: the steps were done,
// and the journal could not record them: the report comes first, then
// the error, and the exit code says it failed.
func TestAnUndoWhoseRecordFailedStillSaysWhatItDid(t *testing.T) {
	var out, errb bytes.Buffer
	rep := undo.Report{InvocationID: "inv-r", Done: []string{"move /p/2024/x.jpg back to /p/x.jpg"}}
	code := undoOutcome(stdio{out: &out, err: &errb}, undo.Entry{Executor: "organize_photos"}, rep,
		errors.New("inv-r: the steps reported were done, but recording them failed"))
	if code != exitFailure || !strings.Contains(out.String(), "move /p/2024/x.jpg back to /p/x.jpg") || !strings.Contains(errb.String(), "recording them failed") {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	// Refused before any step: the error only.
	out.Reset()
	errb.Reset()
	if code := undoOutcome(stdio{out: &out, err: &errb}, undo.Entry{}, undo.Report{InvocationID: "inv-r"}, errors.New("refused")); code != exitFailure || out.Len() != 0 {
		t.Fatalf("a refusal: exit %d, printed %q", code, out.String())
	}
}

// madeOne records, in the journal of the agent whose HOME is home, a
// write_files run of turn turn that created name in ~/work, and makes
// the file. It returns the file and the journal folder.
func madeOne(t *testing.T, home, turn, name string) (string, string) {
	t.Helper()
	folder := filepath.Join(home, "work")
	os.MkdirAll(folder, 0o755)
	made := filepath.Join(folder, name)
	if err := os.WriteFile(made, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	j, history, dir := journalOf(t, home)
	j.Begin(undo.Begin{InvocationID: "inv-m", TurnID: turn, Executor: "write_files", Reverse: []string{"delete_created_paths"},
		Roots: []string{folder}, History: history})
	if _, err := j.Finish("inv-m", undo.Outcome{OK: true, Payload: map[string]any{"ok": true, "results": []any{
		map[string]any{"path": made, "created": true},
	}}}); err != nil {
		t.Fatal(err)
	}
	return made, dir
}

// A turn id and a path from the server or an executor reach the
// terminal escaped from history and undo, dry run or not (c360, c361,
// c363); history --json keeps them as they are (JSON escapes them).
func TestHistoryAndUndoEscapeWhatTheyPrint(t *testing.T) {
	home := t.TempDir()
	made, _ := madeOne(t, home, "t3\x1b[2J", "\x1b]0;pwn\a\x1b[31mx.txt")
	for _, args := range [][]string{
		{"history", "-n", "1"},
		{"undo", "--last", "--offline", "--dry-run"},
		{"undo", "--last", "--offline"},
	} {
		code, out, errb := runWith(t, home, args...)
		if code != exitOK || strings.ContainsAny(out+errb, "\x1b\a") {
			t.Errorf("%v: exit %d, raw escapes in %q %q", args, code, out, errb)
		}
		want := `\x1b]0;pwn\x07\x1b[31mx.txt`
		if args[0] == "history" {
			want = `turn t3\x1b[2J`
		}
		if !strings.Contains(out, want) {
			t.Errorf("%v: %q, want %q", args, out, want)
		}
	}
	if _, err := os.Lstat(made); err == nil {
		t.Error("the undo did not remove the file")
	}
	_, out, _ := runWith(t, home, "history", "--json")
	var h struct {
		Entries []struct {
			TurnID string `json:"turn_id"`
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &h); err != nil || len(h.Entries) != 1 || h.Entries[0].TurnID != "t3\x1b[2J" {
		t.Errorf("history --json: %v %s", err, out)
	}
}

// A dry run refuses what the real undo refuses, with the same message
// (c172, c174b, c173b): a complete line that is not a record, or a tail
// without a newline, at the end of the journal. The message says what
// is wrong and what to do, shows a short escaped excerpt, and nothing is
// changed or created.
func TestUndoDryRunRefusesAJournalTheRealOneRefuses(t *testing.T) {
	binary := "\x00\x1b[2J" + strings.Repeat("\xfe", 200)
	for name, tail := range map[string]string{
		"garbage line":       "garbage\n",
		"JSON without a seq": `{"v":1,"kind":"garbage"}` + "\n",
		"binary line":        binary + "\n",
		"binary tail":        binary,
		"text tail":          "garbage",
	} {
		t.Run(name, func(t *testing.T) {
			home := t.TempDir()
			made, dir := madeOne(t, home, "t1", "x.txt")
			p := filepath.Join(dir, "journal.jsonl")
			f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString(tail)
			f.Close()
			before := files(t, home)
			dcode, dout, derr := runWith(t, home, "undo", "--last", "--offline", "--dry-run")
			code, out, errb := runWith(t, home, "undo", "--last", "--offline")
			if dcode != exitFailure || code != exitFailure || derr != errb || dout != "" || out != "" {
				t.Fatalf("dry run: exit %d %q %q\nreal: exit %d %q %q", dcode, dout, derr, code, out, errb)
			}
			if strings.Count(errb, p) != 1 || !strings.Contains(errb, "not a record of this log") ||
				!strings.Contains(errb, "cut journal.jsonl after its last good line") || !strings.Contains(errb, "move it away") {
				t.Errorf("stderr %q: want the file once, what is wrong and what to do", errb)
			}
			if len(errb) > 600 || strings.ContainsAny(errb, "\x00\x1b\xfe") {
				t.Errorf("stderr is %d bytes, or raw: %q", len(errb), errb)
			}
			if _, err := os.Lstat(made); err != nil {
				t.Error("the file was removed")
			}
			if after := files(t, home); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Errorf("files changed: %v -> %v", before, after)
			}
		})
	}
}

// On a paired device whose server answers, the dry run of an undo
// without --offline says that the undo would be refused, and why, as
// the real one does (c176, c177).
func TestUndoDryRunSaysTheServerAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	std, e, out, errb := identityStd(t, false)
	writePaired(t, e)
	b, _ := os.ReadFile(e.lay.State())
	os.WriteFile(e.lay.State(), bytes.Replace(b, []byte("http://127.0.0.1:8765"), []byte(srv.URL), 1), 0o600)
	made, _ := madeOne(t, e.lay.Home, "t1", "x.txt")
	if code := run(std, []string{"undo", "--last", "--dry-run"}); code != exitFailure || out.Len() > 0 ||
		!strings.Contains(errb.String(), "undo would be refused") || !strings.Contains(errb.String(), "the server answers: ask Metnos to undo") {
		t.Errorf("dry run: exit %d %q %q", code, out, errb)
	}
	if _, err := os.Lstat(made); err != nil {
		t.Error("the file was removed")
	}
}

// A journal that is a folder, or that was deleted while HEAD says
// records were written, is one clear error from history and undo, not
// "tampered with" then "No changes recorded" (c314, c316).
func TestHistoryOfAJournalThatCannotBeRead(t *testing.T) {
	for name, c := range map[string]struct {
		damage func(p string)
		want   string
	}{
		"a folder": {func(p string) { os.Remove(p); os.Mkdir(p, 0o700) }, "journal.jsonl is a folder, not a file"},
		"deleted":  {func(p string) { os.Remove(p) }, "journal.jsonl is missing, but"},
	} {
		t.Run(name, func(t *testing.T) {
			home := t.TempDir()
			made, dir := madeOne(t, home, "t1", "x.txt")
			c.damage(filepath.Join(dir, "journal.jsonl"))
			for _, args := range [][]string{{"history"}, {"history", "--json"}, {"undo", "--last", "--offline", "--dry-run"}, {"undo", "--last", "--offline"}} {
				code, out, errb := runWith(t, home, args...)
				if code != exitFailure || out != "" || !strings.Contains(errb, c.want) || strings.Count(errb, "metnos-agent:") != 1 ||
					strings.Contains(errb, "tampered") {
					t.Errorf("%v: exit %d %q %q, want one error with %q", args, code, out, errb, c.want)
				}
			}
			if _, err := os.Lstat(made); err != nil {
				t.Error("the file was removed")
			}
		})
	}
}

// A data folder that is a file: history names the journal's folder
// once (c302).
func TestHistoryWhenTheDataFolderIsAFile(t *testing.T) {
	std, e, out, errb := identityStd(t, false)
	os.MkdirAll(filepath.Dir(e.lay.Data), 0o700)
	os.WriteFile(e.lay.Data, []byte("x"), 0o600)
	if code := run(std, []string{"history"}); code != exitFailure || out.Len() > 0 ||
		strings.Count(errb.String(), e.lay.Journal()) != 1 || !strings.Contains(errb.String(), "not a directory") {
		t.Errorf("exit %d %q %q", code, out, errb)
	}
}

// TestHistorySaysWhatWasPruned: once the retention removed old
// changes, `history` says how many, up to when, and by which retention,
// after the oldest change left; --json has it too.
func TestHistorySaysWhatWasPruned(t *testing.T) {
	home := t.TempDir()
	j, _, dir := journalOf(t, home)
	var roots []string
	for i := range 8 {
		roots = append(roots, filepath.Join(home, strings.Repeat("a-rather-long-folder-name-", 4), fmt.Sprint(i)))
	}
	for i := range 90 {
		id := fmt.Sprintf("inv-%03d", i)
		if err := j.Begin(undo.Begin{InvocationID: id, Executor: "write_files", Roots: roots}); err != nil {
			t.Fatal(err)
		}
		if _, err := j.Finish(id, undo.Outcome{OK: true}); err != nil {
			t.Fatal(err)
		}
	}
	day := 24 * time.Hour
	p, err := j.Prune(day, time.Now().Add(2*day))
	if err != nil || p.Entries == 0 || p.Entries == 90 {
		t.Fatalf("pruned %+v, %v", p, err)
	}
	want := fmt.Sprintf("%d older changes before %s were pruned (retention 1 days).", p.Entries, p.Before.Local().Format(time.DateOnly))
	code, out, errb := runWith(t, home, "history", "-n", "0")
	// The chain of what is left still verifies: no warning.
	if code != 0 || !strings.HasSuffix(strings.TrimSpace(out), want) || strings.Contains(out, "inv-000 ") || strings.Contains(out, "warning") {
		t.Fatalf("history (%d, %s): %s", code, errb, out)
	}
	if _, out, _ := runWith(t, home, "history", "-n", "3"); strings.Contains(out, "pruned") {
		t.Fatalf("history -n 3 says what was pruned before the entries it left out: %s", out)
	}
	_, out, _ = runWith(t, home, "history", "--json", "-n", "0")
	var got struct {
		Pruned  *undo.Pruned `json:"pruned"`
		Entries []any        `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Pruned == nil || got.Pruned.Entries != p.Entries || len(got.Entries) != 90-p.Entries {
		t.Fatalf("--json: %s %v", out, err)
	}
	_ = dir
}

// TestHistoryShowsTheOwnersEvents: history shows, among the changes and
// in time order, the changes of the owner's limits file (old and new
// values, in force or refused) and the invocations they refused (the
// rule's words), from the audit log; --json lists them under
// owner_events; -n counts them with the changes.
func TestHistoryShowsTheOwnersEvents(t *testing.T) {
	home := t.TempDir()
	madeOne(t, home, "turn-1", "a.txt")
	e, err := readEnvironment(func(k string) string { return map[string]string{"HOME": home}[k] })
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(e.lay.Audit())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := l.WriteLimits(audit.LimitsChange{Time: now.Add(time.Second), File: e.lay.Limits(), Seen: "run", InForce: true,
		Changes: []audit.Change{{Key: "mode", Old: `"full"`, New: `"readonly"`}}}); err != nil {
		t.Fatal(err)
	}
	rule := `refused by the owner's limits (` + e.lay.Limits() + `): mode = "readonly" refuses executors that write`
	if err := l.Write(audit.Record{Time: now.Add(2 * time.Second), InvocationID: "inv-r", Executor: "write_files", ErrorClass: "device_error",
		Sandbox: "none", RefusedBy: rule, OwnerMode: "readonly"}); err != nil {
		t.Fatal(err)
	}
	if err := l.WriteLimits(audit.LimitsChange{Time: now.Add(3 * time.Second), File: e.lay.Limits(), Seen: "run",
		Error: `config: limits.toml:1:1: unknown key "moed"`}); err != nil {
		t.Fatal(err)
	}
	l.Close()

	code, out, errs := runWith(t, home, "history")
	if code != exitOK || errs != "" {
		t.Fatalf("history: exit %d, %s", code, errs)
	}
	broken := strings.Index(out, "limits.toml      changed, refused: the limits before stay in force")
	refused := strings.Index(out, "write_files      inv-r  refused by the owner\n    "+rule)
	changed := strings.Index(out, "limits.toml      changed, in force\n    the owner's limits "+e.lay.Limits()+" · seen while the agent ran\n    mode: \"full\" → \"readonly\"")
	made := strings.Index(out, "write_files      inv-m")
	if broken < 0 || refused < 0 || changed < 0 || made < 0 || !(broken < refused && refused < changed && changed < made) {
		t.Errorf("history, newest first, want the broken file, the refusal, the change, the write:\n%s", out)
	}
	if !strings.Contains(out, `unknown key "moed"`) {
		t.Errorf("history does not say why the file was refused:\n%s", out)
	}
	if _, out, _ := runWith(t, home, "history", "-n", "2"); strings.Contains(out, "inv-m") || !strings.Contains(out, "inv-r") {
		t.Errorf("history -n 2 shows the two newest:\n%s", out)
	}

	code, out, _ = runWith(t, home, "history", "--json")
	var h struct {
		Entries     []entryJSON        `json:"entries"`
		OwnerEvents []audit.OwnerEvent `json:"owner_events"`
	}
	if err := json.Unmarshal([]byte(out), &h); code != exitOK || err != nil {
		t.Fatalf("history --json: exit %d, %v\n%s", code, err, out)
	}
	if len(h.Entries) != 1 || len(h.OwnerEvents) != 3 || h.OwnerEvents[1].Event != audit.EventRefused || h.OwnerEvents[1].RefusedBy != rule ||
		h.OwnerEvents[2].Changes[0].New != `"readonly"` || h.OwnerEvents[0].InForce {
		t.Errorf("history --json: %+v", h)
	}
}
