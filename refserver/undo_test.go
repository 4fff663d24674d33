package refserver

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/metnos/agent/wire"
)

func TestReverseCalls(t *testing.T) {
	blobRows := func(n int, withBlob bool) string {
		var rows []string
		for i := range n {
			if withBlob {
				rows = append(rows, fmt.Sprintf(`{"path":"C:\\D\\f%d.txt","blob_path":"C:\\B\\%d.bin"}`, i, i))
			} else {
				rows = append(rows, fmt.Sprintf(`{"path":"/d/f%d.txt"}`, i))
			}
		}
		return `{"results":[` + strings.Join(rows, ",") + `]}`
	}
	cases := []struct {
		name        string
		patterns    []string
		payload     string
		calls       string // JSON of the calls
		unsupported string
	}{
		{
			name: "move then dirs (Metnos test)", patterns: []string{"swap_src_dst", "delete_created_dirs"},
			payload: `{"results":[{"src":"C:/a/f.txt","dst":"C:/b/f.txt"}],"dirs_created":["C:/b"]}`,
			calls:   `[{"executor":"move_files","args":{"client":"local","dst_template":"C:/a/{name}","entries":[{"src":"C:/b/f.txt"}],"parents":true}},{"executor":"delete_dirs","args":{"paths":["C:/b"]}}]`,
		},
		{
			name: "rename is a literal template", patterns: []string{"swap_src_dst"},
			payload: `{"results":[{"src":"/h/a.txt","dst":"/h/b.txt"}]}`,
			calls:   `[{"executor":"move_files","args":{"client":"local","dst_template":"/h/a.txt","entries":[{"src":"/h/b.txt"}],"parents":true}}]`,
		},
		{
			name: "grouped by source folder, groups before renames", patterns: []string{"swap_src_dst"},
			payload: `{"results":[{"src":"/s/x.txt","dst":"/d/x.txt"},{"src":"/h/a","dst":"/h/b"},{"src":"/t/y","dst":"/d/y"},{"src":"/s/z","dst":"/e/z"},` +
				`{"src":"/same","dst":"/same"},{"account":"me","src":"INBOX","dst":"Old","uid":1},{"src":"","dst":"/x"},{"src":{"account":"a","uid":1},"dst":"/y"},"junk"]}`,
			calls: `[{"executor":"move_files","args":{"client":"local","dst_template":"/s/{name}","entries":[{"src":"/d/x.txt"},{"src":"/e/z"}],"parents":true}},` +
				`{"executor":"move_files","args":{"client":"local","dst_template":"/t/{name}","entries":[{"src":"/d/y"}],"parents":true}},` +
				`{"executor":"move_files","args":{"client":"local","dst_template":"/h/a","entries":[{"src":"/h/b"}],"parents":true}}]`,
		},
		{
			name: "Windows paths keep their separators", patterns: []string{"swap_src_dst"},
			payload: `{"results":[{"src":"C:\\Users\\x\\f.txt","dst":"D:\\y\\f.txt"},{"src":"f.txt","dst":"/d/f.txt"}]}`,
			calls: `[{"executor":"move_files","args":{"client":"local","dst_template":"C:\\Users\\x/{name}","entries":[{"src":"D:\\y\\f.txt"}],"parents":true}},` +
				`{"executor":"move_files","args":{"client":"local","dst_template":"f.txt","entries":[{"src":"/d/f.txt"}],"parents":true}}]`,
		},
		{
			name: "created paths then dirs deepest first", patterns: []string{"delete_created_paths"},
			payload: `{"results":[{"path":"/a/b/c/f.txt","created":true},{"path":"/a/g.txt","created":false},{"path":"/a/h.txt"},{"created":true}],"dirs_created":["/a","/a/b/c","/a/b","/a/b"]}`,
			calls: `[{"executor":"delete_files","args":{"client":"local","paths":["/a/b/c/f.txt"]}},` +
				`{"executor":"delete_dirs","args":{"paths":["/a/b/c","/a/b","/a"]}}]`,
		},
		{
			name: "created dirs only", patterns: []string{"delete_created_dirs"},
			payload: `{"dirs_created":["/x","/x/y"]}`,
			calls:   `[{"executor":"delete_dirs","args":{"paths":["/x/y","/x"]}}]`,
		},
		{
			name: "blob restore in batches of 100 (Metnos test)", patterns: []string{"restore_blob_backup"},
			payload: blobRows(250, true),
			calls:   "", // checked below
		},
		{
			name: "rows without blob are unsupported", patterns: []string{"restore_blob_backup"},
			payload: `{"results":[{"path":"/d/a","blob_path":"/b/1.bin"},{"path":"/d/b"}]}`,
			calls:   `[{"executor":"move_files","args":{"client":"local","copy":true,"dst_template":"{dst}","entries":[{"dst":"/d/a","src":"/b/1.bin"}],"parents":true}}]`, unsupported: "restore_blob_backup:righe-senza-blob",
		},
		{
			name: "only rows without blob", patterns: []string{"restore_blob_backup"},
			payload: blobRows(2, false), calls: `null`, unsupported: "restore_blob_backup:righe-senza-blob",
		},
		{
			name: "unknown patterns", patterns: []string{"restore_trashed_files", "module.reverse", "swap_src_dst"},
			payload: `{}`, calls: `null`, unsupported: "restore_trashed_files,module.reverse",
		},
		{name: "nothing to do", patterns: []string{"swap_src_dst", "delete_created_paths", "delete_created_dirs", "restore_blob_backup"}, payload: `{"results":"x"}`, calls: `null`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			payload, _ := mustDecode(t, c.payload).(map[string]any)
			calls, unsupported := ReverseCalls(c.patterns, payload)
			if u := strings.Join(unsupported, ","); u != c.unsupported {
				t.Errorf("unsupported %q, want %q", u, c.unsupported)
			}
			got, err := json.Marshal(calls)
			if err != nil {
				t.Fatal(err)
			}
			if c.calls == "" {
				if len(calls) != 3 || len(calls[0].Args["entries"].([]any)) != 100 || len(calls[2].Args["entries"].([]any)) != 50 ||
					calls[0].Args["copy"] != true || calls[0].Args["dst_template"] != "{dst}" || calls[2].Executor != "move_files" {
					t.Errorf("batches: %s", got)
				}
				first := calls[0].Args["entries"].([]any)[0].(map[string]any)
				if first["src"] != `C:\B\0.bin` || first["dst"] != `C:\D\f0.txt` {
					t.Errorf("first entry %v", first)
				}
				return
			}
			if string(got) != c.calls {
				t.Errorf("calls\n got %s\nwant %s", got, c.calls)
			}
		})
	}
}

func TestBaseName(t *testing.T) {
	cases := map[string]string{
		"/a/b.txt": "b.txt", "/a/b/": "b", "b": "b", "/": "", "": "", "a/.": "a",
		`C:\x\y.txt`: "y.txt", "C:/x/y": "y", "C:": "", `C:\`: "", `x\y`: "y", "/a/b\\c": "c",
	}
	for in, want := range cases {
		if got := baseName(in); got != want {
			t.Errorf("baseName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestScaledDeadline(t *testing.T) {
	list := func(n int) []any { return make([]any, n) }
	cases := []struct {
		args map[string]any
		want int64
	}{
		{map[string]any{}, 30000},
		{map[string]any{"paths": list(10)}, 30000},
		{map[string]any{"paths": list(11), "x": "y"}, 41000},
		{map[string]any{"a": list(3), "b": list(100)}, 130000},
		{map[string]any{"entries": list(681)}, 600000},
	}
	for _, c := range cases {
		if got := ScaledDeadlineMS(c.args); got != c.want {
			t.Errorf("ScaledDeadlineMS(%d items) = %d, want %d", len(c.args), got, c.want)
		}
	}
}

func TestUndoEnqueuesReverseCalls(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	other := h.pair("other")
	run := func(dev testDevice, executor, turn string, ok bool, payload any) string {
		t.Helper()
		id := h.enqueue(dev, executor, map[string]any{}, EnqueueOptions{TurnID: turn, Reversibility: "revertible"})
		h.pollInvocation(dev, nil)
		if st, _ := h.result(dev, id, ok, payload); st != 200 {
			t.Fatalf("result: %d", st)
		}
		return id
	}
	move := run(d, "move_files", "t1", true, map[string]any{"results": []any{map[string]any{"src": "/a/f.txt", "dst": "/b/f.txt"}}, "dirs_created": []any{"/b"}})
	echo := run(d, "echo_args", "t1", true, map[string]any{"ok": true})
	write := run(d, "write_files", "t1", true, map[string]any{"results": []any{map[string]any{"path": "/n/new.txt", "created": true}, map[string]any{"path": "/n/old.txt"}}})
	run(d, "delete_files", "t1", false, map[string]any{"results": []any{map[string]any{"path": "/x", "blob_path": "/b/x.bin"}}}) // failed: not undone
	run(d, "move_files", "t2", true, map[string]any{"results": []any{map[string]any{"src": "/q/1", "dst": "/r/1"}}})             // other turn
	run(other, "move_files", "t1", true, map[string]any{"results": []any{map[string]any{"src": "/o/1", "dst": "/p/1"}}})         // other device
	dry := run(d, "write_files", "t1", true, map[string]any{"results": []any{map[string]any{"path": "/n/dry.txt", "created": true}},
		"dry_run": map[string]any{"applied": false, "changes": []any{}}}) // a dry run: nothing to undo

	plan, err := h.srv.Undo(d.id, "t1", EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(plan.Undone, ",") != write+","+move || strings.Join(plan.Skipped, ",") != dry+","+echo {
		t.Errorf("undone %v skipped %v", plan.Undone, plan.Skipped)
	}
	got, _ := json.Marshal(plan.Calls)
	want := `[{"executor":"delete_files","args":{"client":"local","paths":["/n/new.txt"]}},` +
		`{"executor":"move_files","args":{"client":"local","dst_template":"/a/{name}","entries":[{"src":"/b/f.txt"}],"parents":true}},` +
		`{"executor":"delete_dirs","args":{"paths":["/b"]}}]`
	if string(got) != want {
		t.Errorf("calls\n got %s\nwant %s", got, want)
	}
	if strings.Join(plan.Unsupported, ",") != "restore_blob_backup:righe-senza-blob" || len(plan.IDs) != 3 {
		t.Errorf("plan %+v", plan)
	}
	// The reverse calls are ordinary signed invocations, delivered in order.
	cursor := any(nil)
	for i, id := range plan.IDs {
		inv := h.pollInvocation(d, cursor)
		cursor = inv.ID
		args, _ := wire.Canonical(inv.Args)
		wantArgs, _ := json.Marshal(plan.Calls[i].Args)
		if inv.ID != id || inv.Executor != plan.Calls[i].Executor || inv.Reversibility != "read_only" || inv.TurnID != "" ||
			len(inv.Env) != 0 || inv.DeadlineMS != 30000 || inv.Scope != "device" || string(args) != string(wantArgs) {
			t.Errorf("reverse invocation %d: %+v", i, inv)
		}
	}
	// Undone once: a second undo does nothing.
	if again, err := h.srv.Undo(d.id, "t1", EnqueueOptions{}); err != nil || len(again.IDs) != 0 || len(again.Undone) != 0 {
		t.Errorf("second undo: %+v %v", again, err)
	}
	// An executor that is no longer loaded is an error naming it.
	run(d, "move_files", "t3", true, map[string]any{})
	h.srv.mu.Lock()
	delete(h.srv.executors, "move_files")
	h.srv.mu.Unlock()
	if _, err := h.srv.Undo(d.id, "t3", EnqueueOptions{}); err == nil || !strings.Contains(err.Error(), "move_files") {
		t.Errorf("undo with a missing executor: %v", err)
	}
	if _, err := h.srv.Undo("nope", "t1", EnqueueOptions{}); err == nil {
		t.Error("undo on an unknown device")
	}
}
