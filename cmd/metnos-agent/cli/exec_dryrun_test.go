//go:build linux

package cli

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/sandbox"
)

// TestExecDryRun: exec --dry-run changes nothing, says what the command
// would have changed (on stderr, and in --json's dry_run), and is
// refused, running nothing, where the layer cannot be made; the same
// command without --dry-run makes the change.
func TestExecDryRun(t *testing.T) {
	agent := needExecSandbox(t)
	if c := sandbox.Probe(sandbox.Options{}); !c.BwrapUsable {
		msg := "a dry run needs bubblewrap: " + c.BwrapError
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatal(msg + " (METNOS_REQUIRE_SANDBOX=1 makes this a failure)")
		}
		t.Skip(msg)
	}
	dir, err := os.MkdirTemp("/var/tmp", "metnos-exec-dry-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	w := filepath.Join(dir, "w")
	if err := os.MkdirAll(w, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w, "old.txt"), []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := "rm " + w + "/old.txt && echo new > " + w + "/new.txt && echo dry=$METNOS_DRY_RUN"
	code, stdout, stderr := runAgent(t, agent, "exec", "--dry-run", "--write", w, "--", "/bin/sh", "-c", script)
	want := "metnos-agent: dry run: nothing was changed; the command would have made 2 change(s):\n" +
		"  created  " + w + "/new.txt (4 bytes)\n" +
		"  deleted  " + w + "/old.txt (4 bytes)\n"
	if code != 0 || stdout != "dry=1\n" || withoutDowngrade(stderr) != want {
		t.Errorf("exit %d, stdout %q, stderr\n%s\nwant exit 0, stdout \"dry=1\\n\", stderr\n%s", code, stdout, stderr, want)
	}
	code, stdout, stderr = runAgent(t, agent, "exec", "--json", "--dry-run", "--write", w, "--", "/bin/sh", "-c", script)
	var res struct {
		DryRun *sandbox.DryRun `json:"dry_run"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); code != 0 || err != nil || res.DryRun == nil || res.DryRun.Applied || len(res.DryRun.Changes) != 2 || res.DryRun.Layered[0] != w {
		t.Errorf("--json: exit %d, %v, %s %s", code, err, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(w, "old.txt")); err != nil {
		t.Fatalf("a dry run deleted old.txt: %v", err)
	}
	if _, err := os.Stat(filepath.Join(w, "new.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a dry run made new.txt: %v", err)
	}

	// Refused where the layer cannot be made: nothing runs.
	ran := "echo ran > " + w + "/ran"
	cmd, _, errb := agentCmd(t, agent, "exec", "--dry-run", "--write", w, "--", "/bin/sh", "-c", ran)
	cmd.Env = append(cmd.Env, "METNOS_SANDBOX=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if code := waitFor(cmd, time.Minute); code != exitAgent || !strings.Contains(errb.String(), "a dry run puts every folder the run may write behind a copy-on-write layer") {
		t.Errorf("with the sandbox off: exit %d, %s", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(w, "ran")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused dry run ran its command: %v", err)
	}
	if code, _, stderr := runAgent(t, agent, "exec", "--write", w, "--", "/bin/sh", "-c", ran); code != 0 {
		t.Fatalf("the same command, not dry: exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(w, "ran")); err != nil {
		t.Fatalf("the same command, not dry, made nothing: %v", err)
	}
}
