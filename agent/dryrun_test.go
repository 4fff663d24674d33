package agent

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/sandbox/changes"
	"github.com/metnos/agent/wire"
)

// TestDryRunAsked: only a top-level "dry_run" that is true asks for a
// dry run.
func TestDryRunAsked(t *testing.T) {
	for _, tc := range []struct {
		args any
		want bool
	}{
		{map[string]any{"dry_run": true}, true},
		{map[string]any{"dry_run": false}, false},
		{map[string]any{"dry_run": "true"}, false},
		{map[string]any{"nested": map[string]any{"dry_run": true}}, false},
		{[]any{map[string]any{"dry_run": true}}, false},
		{nil, false},
	} {
		if got := dryRunAsked(tc.args); got != tc.want {
			t.Errorf("dryRunAsked(%v) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

// TestWithDryRun: a dry run's payload is {"ok": false, "dry_run":
// {...}}: the list, why it ran dry, whether the executor said it
// succeeded, and the executor's whole payload under dry_run.executor;
// nothing of what the executor said is left at the top, where a server
// reads it as a change (the real Metnos server records an undo entry
// for a payload with a true ok, an ok_count or results). The result is
// plain decoded JSON (its keys encode sorted).
func TestWithDryRun(t *testing.T) {
	size := int64(3)
	d := &sandbox.DryRun{Layer: "overlay", Layered: []string{"/w"}, Changes: []changes.Change{
		{Op: changes.Created, Path: "/w/a", Kind: changes.File, After: &changes.State{Size: &size, SHA256: "ab", Mode: "0644"}},
	}}
	list := func(ok bool, executor any) map[string]any {
		m := map[string]any{"layer": "overlay", "applied": false, "layered": []any{"/w"}, "asked_by": "arguments", "ok": ok,
			"changes": []any{map[string]any{"op": "created", "path": "/w/a", "kind": "file",
				"after": map[string]any{"size": json.Number("3"), "sha256": "ab", "mode": "0644"}}}}
		if executor != nil {
			m["executor"] = executor
		}
		return m
	}
	rows := map[string]any{"ok": true, "ok_count": json.Number("1"), "results": []any{map[string]any{"path": "/w/a", "created": true}},
		"_undo": map[string]any{"reverse_pattern": "delete_created_paths", "paths": []any{"/w/a"}}}
	for _, tc := range []struct {
		name    string
		payload any
		ok      bool
		want    any
	}{
		{"a file executor's rows", rows, true, map[string]any{"ok": false, "dry_run": list(true, rows)}},
		{"the executor's own dry_run", map[string]any{"ok": true, "dry_run": true}, true,
			map[string]any{"ok": false, "dry_run": list(true, map[string]any{"ok": true, "dry_run": true})}},
		{"a failure", map[string]any{"ok": false, "error": "no such file"}, false,
			map[string]any{"ok": false, "dry_run": list(false, map[string]any{"ok": false, "error": "no such file"})}},
		{"not an object", []any{"x"}, true, map[string]any{"ok": false, "dry_run": list(true, []any{"x"})}},
		{"no payload", nil, true, map[string]any{"ok": false, "dry_run": list(true, nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := withDryRun(tc.payload, tc.ok, d, dryByArgs)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v\nwant %#v", got, tc.want)
			}
			if _, err := wire.Canonical(got); err != nil {
				t.Errorf("not plain JSON: %v", err)
			}
			m := got.(map[string]any)
			if m["ok"] != false || m["ok_count"] != nil || m["results"] != nil {
				t.Errorf("the top of the payload claims a change: %v", m)
			}
		})
	}
}
