package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox"
)

// TestPreviewRunsWritersDry: in the owner's mode = "preview", an invocation of an
// executor that may write runs dry (its result lists what it would
// have changed, asked_by "preview", and nothing is written), and one
// that may only read runs as usual.
func TestPreviewRunsWritersDry(t *testing.T) {
	opts := sandbox.Options{SearchPath: os.Getenv("PATH"), Bwrap: os.Getenv("METNOS_BWRAP")}
	if c := sandbox.Probe(opts); !c.BwrapUsable || c.LandlockABI == 0 || !c.Seccomp {
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatalf("a dry run needs bwrap, Landlock and seccomp (METNOS_REQUIRE_SANDBOX=1 makes this a failure): %s", c.BwrapError)
		}
		t.Skipf("a dry run needs bwrap, Landlock and seccomp: %s", c.BwrapError)
	}
	a := limitsAgent(t, `mode = "preview"`)
	srv, reg := a.srv, a.reg
	// Outside /tmp, which the sandbox replaces by its own.
	folder, err := os.MkdirTemp("/var/tmp", "metnos-preview-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(folder) })
	if err := os.WriteFile(filepath.Join(folder, "there.txt"), []byte("there\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stop, ran := a.start(t, ctx)
	t.Cleanup(func() { stop(); <-ran })

	run := func(executor string, args map[string]any) map[string]any {
		t.Helper()
		id, err := srv.Enqueue(reg.DeviceID, executor, args, refserver.EnqueueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		info, err := srv.Wait(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var r map[string]any
		if err := json.Unmarshal(info.ResultBody, &r); err != nil || r["ok"] != true {
			t.Fatalf("%s: %v %s", executor, err, info.ResultBody)
		}
		p, _ := r["payload"].(map[string]any)
		return p
	}
	target := filepath.Join(folder, "new.txt")
	p := run("write_files", map[string]any{"files": []any{map[string]any{"path": target, "content": "hello\n"}}})
	dry, _ := p["dry_run"].(map[string]any)
	changes, _ := dry["changes"].([]any)
	if dry["asked_by"] != "preview" || dry["applied"] != false || dry["ok"] != true || p["ok"] != false || p["results"] != nil || len(changes) != 1 {
		t.Errorf("write_files in preview: payload.dry_run %v", p["dry_run"])
	}
	if _, err := os.Lstat(target); err == nil {
		t.Fatal("write_files in preview wrote its file")
	}
	p = run("list_folder", map[string]any{"path": folder})
	if _, ok := p["dry_run"]; ok {
		t.Errorf("list_folder, which only reads, ran dry: %v", p)
	}
}
