//go:build linux

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/testkit/testbin"
	"github.com/metnos/agent/update"
	"github.com/metnos/agent/wire"
)

// updateWorld is a world whose server has a client mirror, and the
// agent installed at a path of its own (bin/metnos-agent, with its
// shim), stamped with version 1.0.0.
type updateWorld struct {
	*world
	mirror string
	exe    string
}

func newUpdateWorld(t *testing.T) *updateWorld {
	t.Helper()
	mirror := t.TempDir()
	w := newWorld(t, func(c *refserver.Config) { c.Mirror = mirror })
	u := &updateWorld{world: w, mirror: mirror, exe: w.build("1.0.0", "bin")}
	w.pair()
	return u
}

// build builds the agent and its shim stamped with version into
// w.dir/dir and returns the agent's path.
func (w *world) build(version, dir string) string {
	w.t.Helper()
	dir = filepath.Join(w.dir, dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	if err := testbin.Build(dir, "-ldflags=-X github.com/metnos/agent/cmd/metnos-agent/cli.Version="+version); err != nil {
		w.t.Fatal(err)
	}
	return filepath.Join(dir, "metnos-agent")
}

// publish publishes the build at exe as mirror version v for this
// machine's target.
func (u *updateWorld) publish(v, exe string) string {
	u.t.Helper()
	f, err := os.Open(exe)
	if err != nil {
		u.t.Fatal(err)
	}
	defer f.Close()
	e, err := refserver.Publish(u.mirror, v, wire.UpdateTarget(runtime.GOOS, runtime.GOARCH), wire.AgentComponent, f)
	if err != nil {
		u.t.Fatal(err)
	}
	return e.SHA256
}

// wake enqueues an echo, without waiting for it: a long-poll that
// would block for 25 s answers at once, and the agent acts on the
// answer's server_client_version, as it would on any poll's.
func (u *updateWorld) wake() {
	u.enqueue("echo_args", map[string]any{"wake": true}, refserver.EnqueueOptions{})
}

func (u *updateWorld) state() update.State {
	u.t.Helper()
	st, err := update.LoadState(filepath.Join(u.dataDir(), "agent-update.json"))
	if err != nil {
		u.t.Fatal(err)
	}
	return st
}

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// waitProfile waits until the device's heartbeat profile satisfies ok.
func (w *world) waitProfile(what string, ok func(map[string]any) bool) map[string]any {
	w.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if d, found := w.srv.Device(w.device); found && d.Profile != nil && ok(d.Profile) {
			return d.Profile
		}
		time.Sleep(50 * time.Millisecond)
	}
	d, _ := w.srv.Device(w.device)
	w.t.Fatalf("the heartbeat never showed %s; last profile: %v", what, d.Profile)
	return nil
}

func profileHas(key, want string) func(map[string]any) bool {
	return func(p map[string]any) bool { s, _ := p[key].(string); return strings.Contains(s, want) }
}

// TestSelfUpdate: the agent sees the server announce a newer version
// while it runs, downloads the build the server signed, swaps it in and
// exits 0; the test, as supervisor, starts it again: the new build
// confirms at its first poll, deletes the old one, and its heartbeat
// shows the new version. What ran before the update is not run again,
// and the new build runs new work.
func TestSelfUpdate(t *testing.T) {
	u := newUpdateWorld(t)
	v1 := fileSHA(t, u.exe)
	v2exe := u.build("2.0.0", "release-2")

	a := u.startExe(u.exe, nil)
	u.waitProfile("version 1.0.0", profileHas("client_version", "1.0.0"))
	before := u.enqueue("echo_args", map[string]any{"x": 1}, refserver.EnqueueOptions{})
	if got := result(t, u.wait(before)); got["ok"] != true {
		t.Fatalf("echo_args before the update: %v", got)
	}

	// Published while the agent runs: the next poll announces it.
	v2 := u.publish("1.1.0", v2exe)
	u.wake()
	if code := a.exitCode(t, 90*time.Second); code != 0 {
		t.Fatalf("the agent exited %d after applying the update, want 0", code)
	}
	if !logHas(a, "the new build is in place") {
		t.Fatal("the agent's log does not say the new build is in place")
	}
	if got := fileSHA(t, u.exe); got != v2 {
		t.Fatalf("after the swap the executable's sha256 is %s, want the published build's %s", got, v2)
	}
	if got := fileSHA(t, update.FilesFor(u.exe).Old); got != v1 {
		t.Fatalf("the previous build kept as .old has sha256 %s, want %s", got, v1)
	}
	if st := u.state(); st.Phase != update.PhaseProbation || st.Version != "1.1.0" {
		t.Fatalf("update record after the swap: %+v, want probation of 1.1.0", st)
	}

	// The supervisor starts the new build.
	b := u.startExe(u.exe, nil)
	u.wake() // its first poll's answer confirms the build
	u.waitProfile("version 2.0.0", profileHas("client_version", "2.0.0"))
	// The confirmation records itself first, then deletes the previous
	// build (a crash between the two leaves a build to delete, never a
	// probation without one to go back to): wait for both.
	oldGone := func() bool { _, err := os.Stat(update.FilesFor(u.exe).Old); return os.IsNotExist(err) }
	deadline := time.Now().Add(30 * time.Second)
	for (u.state().Phase != update.PhaseNone || !oldGone()) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if st := u.state(); st.Phase != update.PhaseNone || st.Applied != "1.1.0" {
		t.Fatalf("update record after the new build's first poll: %+v, want 1.1.0 applied", st)
	}
	if _, err := os.Stat(update.FilesFor(u.exe).Old); !os.IsNotExist(err) {
		t.Fatalf("the previous build is still there after the confirmation (%v)", err)
	}
	if info, _ := u.srv.Invocation(before); info.Deliveries != 1 {
		t.Fatalf("the invocation run before the update was delivered %d times, want 1", info.Deliveries)
	}
	after := u.enqueue("echo_args", map[string]any{"x": 2}, refserver.EnqueueOptions{})
	if got := result(t, u.wait(after)); got["ok"] != true {
		t.Fatalf("echo_args after the update: %v", got)
	}
	// Applied: the same announcement does not update it again.
	b.stop(t)
	if logHas(b, "downloading") {
		t.Fatal("the new build downloaded an update again")
	}
}

// TestSelfUpdateRollback: a new build that fails at start (here on a
// flag it refuses, before anything else) or starts but never reaches a
// successful poll (the server is unreachable to it; it exits 1 when its
// probation time is up) uses up a start each time; after two, the next start puts the
// previous build back and exits 0, and the previous build, started
// again, reports the rollback in its heartbeat and does not apply that
// version again.
func TestSelfUpdateRollback(t *testing.T) {
	u := newUpdateWorld(t)
	v1 := fileSHA(t, u.exe)
	v3 := u.publish("1.1.0", u.build("3.0.0", "release-3"))

	a := u.startExe(u.exe, nil)
	u.wake()
	if code := a.exitCode(t, 90*time.Second); code != 0 {
		t.Fatalf("the agent exited %d after applying the update, want 0", code)
	}
	if got := fileSHA(t, u.exe); got != v3 {
		t.Fatal("the update was not swapped in")
	}
	u.proxy.down()
	short := []string{"METNOS_UPDATE_PROBATION_S=2"}
	// The first start fails before anything else (a flag this build
	// refuses): it counts all the same. The second cannot poll.
	for start, c := range []struct {
		extra []string
		code  int
	}{{[]string{"--no-such-flag"}, 2}, {nil, 1}} {
		p := u.startExe(u.exe, short, c.extra...)
		if code := p.exitCode(t, 60*time.Second); code != c.code {
			t.Fatalf("start %d of the failing build exited %d, want %d", start+1, code, c.code)
		}
		if st := u.state(); st.Phase != update.PhaseProbation || st.Boots != start+1 {
			t.Fatalf("after start %d: %+v", start+1, st)
		}
	}
	p := u.startExe(u.exe, short)
	if code := p.exitCode(t, 60*time.Second); code != 0 {
		t.Fatalf("the third start exited %d, want 0 after the rollback", code)
	}
	if got := fileSHA(t, u.exe); got != v1 {
		t.Fatalf("after the rollback the executable's sha256 is %s, want the previous build's %s", got, v1)
	}
	if got := fileSHA(t, update.FilesFor(u.exe).Failed); got != v3 {
		t.Fatal("the failed build is not kept as .failed")
	}
	st := u.state()
	if st.Failed == nil || !st.Failed.RolledBack || st.Failed.Version != "1.1.0" {
		t.Fatalf("update record after the rollback: %+v", st)
	}

	u.proxy.up()
	q := u.startExe(u.exe, nil)
	prof := u.waitProfile("the rollback", profileHas("update", "rolled back"))
	if v, _ := prof["client_version"].(string); v != "1.0.0" {
		t.Fatalf("client_version after the rollback: %q, want 1.0.0", v)
	}
	// The check follows the first poll's answer, which a long-poll
	// holds up to 25 s unless there is work.
	u.wake()
	deadline := time.Now().Add(60 * time.Second)
	for !logHas(q, "rolled back on this device") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	q.stop(t)
	if !logHas(q, "rolled back on this device") || logHas(q, "downloading") {
		t.Fatal("the previous build did not refuse the version that was rolled back")
	}
}
