//go:build linux

package update

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/metnos/agent/wire"
)

// TestApplyDiskFull: a build that does not fit beside the executable
// fails with the system's reason; the running build is intact and
// runs, and what was downloaded is kept to resume. The disk is a 1 MiB
// tmpfs the test mounts, so root only; the installed build on it is a
// small script (a Go build would not fit), the new one the stand-in
// agent of several MB.
func TestApplyDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting the small tmpfs that plays the full disk needs root")
	}
	a := agents(t)
	disk := t.TempDir()
	if err := syscall.Mount("tmpfs", disk, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(disk, syscall.MNT_DETACH) })
	script := filepath.Join(t.TempDir(), "old")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho metnos-agent 1.0.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := installAt(t, script, filepath.Join(disk, "metnos-agent"), filepath.Join(t.TempDir(), "agent-update.json"))
	s := newServer(t)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.new))
	u := d.updater(t, s, false)
	err := u.Apply(context.Background(), desc)
	if err == nil || errors.Is(err, ErrRestart) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Apply: %v, want the disk's own reason", err)
	}
	if fi, err := os.Stat(d.New + ".part"); err != nil || fi.Size() == 0 {
		t.Fatalf("what was downloaded was not kept to resume: %v", err)
	}
	os.Remove(d.New + ".part") // for assertUntouched's look at the folder
	assertUntouched(t, d, u, read(t, script), "no space left")
}
