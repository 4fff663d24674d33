package agent

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/zeebo/blake3"

	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/undo"
	"github.com/metnos/agent/wire"
)

// checkRecordedAsSent checks that a result over the server's limit was
// sent cut (ok false, error_class result_too_large, no payload, under
// the limit) and that the device recorded it as sent: its audit line
// (ok, error_class, and the size and hash of the very bytes sent), its
// history journal entry (ok, error_class) and its "executed" log line.
// The journal entry must still hold the rows of what the run changed
// on disk (rows of them), read from the payload the server was not
// sent.
func checkRecordedAsSent(t *testing.T, lay layout.Layout, logs, id string, sent []byte, rows int) {
	t.Helper()
	var body struct {
		OK         *bool          `json:"ok"`
		ErrorClass string         `json:"error_class"`
		Payload    map[string]any `json:"payload"`
	}
	if err := json.Unmarshal(sent, &body); err != nil {
		t.Fatalf("the body sent: %v: %.300s", err, sent)
	}
	if body.OK == nil || *body.OK || body.ErrorClass != wire.ClassResultTooLarge || len(body.Payload) != 0 || len(sent) > result.MaxResultBytes {
		t.Fatalf("the body sent (%d bytes): %.300s", len(sent), sent)
	}

	// The audit line.
	type auditLine struct {
		InvocationID string `json:"invocation_id"`
		OK           *bool  `json:"ok"`
		ErrorClass   string `json:"error_class"`
		Output       struct {
			Size   int    `json:"size"`
			BLAKE3 string `json:"blake3"`
		} `json:"output"`
	}
	files, _ := filepath.Glob(filepath.Join(lay.Audit(), "*.jsonl"))
	var line *auditLine
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(string(b), "\n") {
			var al auditLine
			if json.Unmarshal([]byte(l), &al) == nil && al.InvocationID == id {
				if line != nil {
					t.Errorf("two audit lines for %s", id)
				}
				line = &al
			}
		}
	}
	sum := blake3.Sum256(sent)
	switch {
	case line == nil:
		t.Errorf("no audit line for %s in %v", id, files)
	case line.OK == nil || *line.OK || line.ErrorClass != wire.ClassResultTooLarge:
		t.Errorf("the audit line says ok=%v error_class=%q, want what was sent: ok=false error_class=result_too_large", deref(line.OK), line.ErrorClass)
	case line.Output.Size != len(sent) || line.Output.BLAKE3 != "blake3:"+hex.EncodeToString(sum[:]):
		t.Errorf("the audit line's output is %d bytes %s, not the %d bytes sent", line.Output.Size, line.Output.BLAKE3, len(sent))
	}

	// The history journal entry.
	j, err := undo.Load(lay.Journal())
	if err != nil {
		t.Fatal(err)
	}
	e, ok := j.Entry(id)
	switch {
	case !ok || !e.Finished:
		t.Errorf("the journal entry of %s: found %v, %s", id, ok, e.State())
	case e.OK || e.ErrorClass != wire.ClassResultTooLarge:
		t.Errorf("the journal entry says ok=%v error_class=%q, want what was sent: ok=false error_class=result_too_large", e.OK, e.ErrorClass)
	case len(e.Rows) != rows || e.State() != "done":
		// The run did change the disk: the rows are what undoes it.
		t.Errorf("the journal entry has %d rows (%s), want the %d of what the run changed", len(e.Rows), e.State(), rows)
	}

	// The log line.
	var executed string
	for l := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(l, "msg=executed") && strings.Contains(l, "invocation="+id) {
			executed = l
		}
	}
	if !strings.Contains(executed, " ok=false ") || !strings.Contains(executed, " error_class="+wire.ClassResultTooLarge+" ") || !strings.Contains(executed, "over the server's") {
		t.Errorf("the log line says %q, want what was sent: ok=false error_class=result_too_large", executed)
	}
}

func deref(b *bool) any {
	if b == nil {
		return nil
	}
	return *b
}

// TestTooLargeResultRecordedAsSent: a result over the server's 4 MiB
// limit is sent cut, ok false and error_class result_too_large, and
// the device's log line, audit line and history journal entry say the
// same, not the ok true the executor said. The journal still has the
// rows of what the run changed (the payload the server was not sent):
// a local undo puts the change back.
func TestTooLargeResultRecordedAsSent(t *testing.T) {
	var mu sync.Mutex
	var got [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, b)
		mu.Unlock()
	}))
	defer srv.Close()
	a := testAgent(t, srv.URL)
	var logs syncBuffer
	a.waitSwept() // its sweep logs too
	a.log = slog.New(slog.NewTextHandler(&logs, nil))

	// A run that made a file and says so, with more besides than the
	// server takes.
	out := filepath.Join(a.cfg.Layout.Home, "out")
	made := filepath.Join(out, "made.txt")
	if err := os.MkdirAll(out, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(made, []byte("made\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id := "inv-18ed65bd51bdc701fcd26b80"
	if err := a.journal.Begin(undo.Begin{InvocationID: id, Executor: "write_files", Reverse: []string{"delete_created_paths"}, Roots: []string{out}, History: a.history()}); err != nil {
		t.Fatal(err)
	}
	stdout, _ := json.Marshal(map[string]any{"ok": true, "results": []any{map[string]any{"path": made, "created": true}}, "pad": strings.Repeat("x", result.MaxResultBytes)})
	r := result.FromStdout(stdout)
	r.Sandbox, r.ElapsedMS = "bwrap", 12
	if !r.OK {
		t.Fatal("the executor's result does not say ok")
	}
	inv := &invocation{Invocation: wire.Invocation{ID: id, Executor: "write_files", Args: map[string]any{"path": made}},
		log: a.log.With("invocation", id, "executor", "write_files"), spans: newSpans()}
	inv.strs = []string{made}
	a.finish(inv, r)
	if !a.flush(context.Background()) {
		t.Fatal("the result was not delivered")
	}
	mu.Lock()
	sent := got
	mu.Unlock()
	if len(sent) != 1 {
		t.Fatalf("the server got %d results, want 1", len(sent))
	}
	checkRecordedAsSent(t, a.cfg.Layout, logs.String(), id, sent[0], 1)

	// What the run changed can still be put back from this device.
	rep, err := a.journal.Undo(id, a.history(), false)
	if err != nil || len(rep.Done) != 1 || len(rep.Conflicts) != 0 {
		t.Fatalf("local undo: %+v %v", rep, err)
	}
	if _, err := os.Lstat(made); !os.IsNotExist(err) {
		t.Errorf("the file the run made is still there after the undo: %v", err)
	}
}

// bigWrite is an executor that makes the file its "path" argument
// names, says so in its result row, and pads its output with "pad"
// bytes (over the server's limit).
var bigWrite = fstest.MapFS{
	"big_write/manifest.toml": {Data: []byte(`name = "big_write"
description = "Test executor: makes a file, and answers more than the server takes."
reverse_pattern = ["delete_created_paths"]

[code]
files = ["big_write.py"]
digest = "sha256:0"

[[capabilities]]
name = "fs:write"
hint = []

[placement]
min_sandbox = "job-object"
`)},
	"big_write/big_write.py": {Data: []byte(`import json, sys

args = json.loads(sys.stdin.read() or "{}")
with open(args["path"], "w") as f:
    f.write("made\n")
print(json.dumps({"ok": True, "results": [{"path": args["path"], "created": True}], "pad": "x" * args["pad"]}))
`)},
}

// TestTooLargeResultHandled is TestTooLargeResultRecordedAsSent end to
// end: the agent polls the reference server, runs a real executor in
// the sandbox (the test is skipped where it cannot), and sends its
// result cut; the server's copy, the audit line, the journal entry and
// the log line all say ok=false, result_too_large, and a local undo
// removes the file the run made.
func TestTooLargeResultHandled(t *testing.T) {
	a := newDeviceAgent(t, bigWrite, "too-large", nil)
	srv, reg, dir, lay, logs := a.srv, a.reg, a.dir, a.lay, a.logs
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stop, ran := a.start(t, ctx)

	out := filepath.Join(dir, "out")
	made := filepath.Join(out, "made.txt")
	if err := os.MkdirAll(out, 0o700); err != nil {
		t.Fatal(err)
	}
	id, err := srv.Enqueue(reg.DeviceID, "big_write", map[string]any{"path": made, "pad": 5 << 20}, refserver.EnqueueOptions{Reversibility: "revertible"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := srv.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the agent: %v", err)
	}
	a.Close()
	if _, err := os.Lstat(made); err != nil {
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatalf("big_write did not run on this machine (METNOS_REQUIRE_SANDBOX=1 makes this a failure): %s", info.ResultBody)
		}
		t.Skipf("big_write did not run on this machine: %.500s", info.ResultBody)
	}
	checkRecordedAsSent(t, lay, logs.String(), id, info.ResultBody, 1)

	j, err := undo.Open(lay.Journal())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := j.Undo(id, lay.Blobs(), false)
	if err != nil || len(rep.Done) != 1 || len(rep.Conflicts) != 0 {
		t.Fatalf("local undo: %+v %v", rep, err)
	}
	if _, err := os.Lstat(made); !os.IsNotExist(err) {
		t.Errorf("the file the run made is still there after the undo: %v", err)
	}
}
