package service

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/metnos/agent/testkit/winetest"
)

// TestWindowsRestoreAction runs the task's first action with cmd.exe
// (under Wine in CI): it puts metnos-agent.old.exe back when an update
// was cut short between its two renames, and leaves everything alone
// otherwise.
func TestWindowsRestoreAction(t *testing.T) {
	dir := filepath.Join(winetest.TempDir(t), "Zoë's 100% fun & co")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "metnos-agent.exe")
	old := filepath.Join(dir, "metnos-agent.old.exe")
	run := func() {
		t.Helper()
		cmd := exec.Command(filepath.Join(os.Getenv("SystemRoot"), "System32", "cmd.exe"))
		cmd.SysProcAttr = &syscall.SysProcAttr{CmdLine: "cmd.exe " + restoreArgs(exe)}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the restore action: %v\n%s", err, out)
		}
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}

	// Cut short: only the previous build is there.
	if err := os.WriteFile(old, []byte("previous build"), 0o755); err != nil {
		t.Fatal(err)
	}
	run()
	if got := read(exe); got != "previous build" {
		t.Fatalf("after the restore action the executable holds %q, want the previous build", got)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Fatalf("the previous build is still at %s (%v)", old, err)
	}

	// An update on probation: both are there, and stay as they are.
	if err := os.WriteFile(exe, []byte("new build"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old, []byte("previous build"), 0o755); err != nil {
		t.Fatal(err)
	}
	run()
	if got, gotOld := read(exe), read(old); got != "new build" || gotOld != "previous build" {
		t.Fatalf("with both builds there the action changed them: exe %q, old %q", got, gotOld)
	}
}
