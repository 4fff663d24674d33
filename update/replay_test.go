package update

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/metnos/agent/wire"
)

// TestReplayAfterInstall: a device installed with the server's current
// build has applied no update yet, but the run loop's check finds that
// its executable is the build of 2.0.0 the server signed. A transport
// that then replays the server's older descriptor of 1.0.0 must not
// make it go back to 1.0.0.
func TestReplayAfterInstall(t *testing.T) {
	running := []byte("the build of 2.0.0")
	older := []byte("the build of 1.0.0")
	exe := filepath.Join(t.TempDir(), "installed")
	if err := os.WriteFile(exe, running, 0o755); err != nil {
		t.Fatal(err)
	}
	d := installAt(t, exe, filepath.Join(t.TempDir(), "metnos-agent"), filepath.Join(t.TempDir(), "agent-update.json"))
	s := newServer(t)
	u := d.updater(t, s, false)

	s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, running)
	if dec, err := u.Check(context.Background(), false); err != nil || dec.Apply {
		t.Fatalf("the running build's own descriptor: %+v, %v; want it not applied", dec, err)
	}
	s.publish(t, wire.ComponentDescriptor{Version: "1.0.0"}, older)
	dec, err := u.Check(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Apply {
		t.Fatalf("the replayed descriptor of 1.0.0 would be applied over the server's build of 2.0.0 (applied: %q)", d.load(t).Applied)
	}
	t.Logf("refused: %s", dec.Why)
}
