package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/wire"
)

// TestStopNowAfterTheRunEndedKeepsItsResult: a stop-now (the second
// Ctrl-C) that lands after the executor ended by itself does not throw
// its result away: the result is spooled, for the next start to
// deliver, and the run is not reported as cut short. The window is
// held open by the self-heal: the executor ends missing a shim module,
// and the agent is fetching the shim again (the server stalls it) when
// the stop-now comes.
func TestStopNowAfterTheRunEndedKeepsItsResult(t *testing.T) {
	srv, url, dir, lay, key, reg := pairedDevice(t, examples.Executors, "stopper")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var logs syncBuffer
	halt := make(chan struct{})
	a, err := New(Config{Layout: lay, Client: client.New(url, key, reg.DeviceID, nil),
		Host:   policy.Host{Home: dir, UID: os.Getuid(), AgentDataDirs: lay.AgentDirs()},
		Python: os.Getenv("METNOS_PYTHON"), Path: os.Getenv("PATH"),
		Sandbox: sandbox.Options{SearchPath: os.Getenv("PATH"), Bwrap: os.Getenv("METNOS_BWRAP")},
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)), Block: time.Second, Halt: halt})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if _, err := a.Python(); err != nil {
		t.Skipf("no Python for executors: %v", err)
	}
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()

	// A first run installs the shim.
	first, err := srv.Enqueue(reg.DeviceID, "echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := srv.Wait(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(info.ResultBody), `"ok":true`) {
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatalf("echo_args does not run on this machine (METNOS_REQUIRE_SANDBOX=1 makes this a failure): %s", info.ResultBody)
		}
		t.Skipf("echo_args does not run on this machine: %s", info.ResultBody)
	}

	// The next run misses a shim module, and the fetch that would heal
	// it stalls.
	if err := os.Remove(filepath.Join(lay.Shim(), "executor_helpers.py")); err != nil {
		t.Fatal(err)
	}
	srv.SetShimDelay(time.Hour)
	id, err := srv.Enqueue(reg.DeviceID, "echo_args", map[string]any{"i": 2}, refserver.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(logs.String(), "misses a shim module") {
		select {
		case err := <-ran:
			t.Fatalf("the agent stopped (%v) before the self-heal: %s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(halt) // the executor has ended: stop now
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not stop now")
	}

	if strings.Contains(logs.String(), "the run was cut short") {
		t.Error("the log says a run that ended by itself was cut short")
	}
	pending, err := a.spool.Pending()
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	for _, p := range pending {
		if p.ID == id {
			body = p.Body
		}
	}
	if body == nil {
		t.Fatalf("the finished result was dropped: spool holds %d results, none for %s; log:\n%s", len(pending), id, logs.String())
	}
	var r struct {
		ErrorClass string `json:"error_class"`
		Error      string `json:"error"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	// What the executor itself said: it missed the module.
	if r.ErrorClass != "device_error" || !strings.Contains(r.Error, "No module named 'executor_helpers'") {
		t.Errorf("spooled result: %s", body)
	}
}

// pairedDevice starts a reference server on loopback serving execs (and
// the example shim) and pairs a new device called name with it, its
// layout in a temporary folder dir: the server, its URL, dir, the
// layout, the device key and the registration.
func pairedDevice(t *testing.T, execs fs.FS, name string) (*refserver.Server, string, string, layout.Layout, ed25519.PrivateKey, wire.Registration) {
	t.Helper()
	srv, err := refserver.New(refserver.Config{Executors: execs, Shim: examples.Shim, PollCheck: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	dir := t.TempDir()
	lay := layout.Layout{Data: filepath.Join(dir, "data"), Cache: filepath.Join(dir, "cache"), Home: dir}
	key, err := pairing.LoadOrCreateKey(lay)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := srv.IssueToken(name, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg, err := client.New(url, key, "", nil).Register(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := pairing.SaveState(lay, pairing.State{DeviceID: &reg.DeviceID, ServerURL: &url, ServerPublicKey: reg.ServerPublicKey}); err != nil {
		t.Fatal(err)
	}
	return srv, url, dir, lay, key, reg
}
