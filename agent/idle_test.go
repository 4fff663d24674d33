package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox"
)

// TestOnIdle: the run loop calls Config.OnIdle once before its first
// poll, not again while it only waits, and once more when it is waiting
// again after running an invocation.
func TestOnIdle(t *testing.T) {
	srv, err := refserver.New(refserver.Config{Executors: examples.Executors, Shim: examples.Shim, PollCheck: 20 * time.Millisecond})
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
	tok, err := srv.IssueToken("idler", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg, err := client.New(url, key, "", nil).Register(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := pairing.SaveState(lay, pairing.State{DeviceID: &reg.DeviceID, ServerURL: &url, ServerPublicKey: reg.ServerPublicKey}); err != nil {
		t.Fatal(err)
	}
	// Each call says whether the server had seen a poll by then.
	idle := make(chan bool, 10)
	var logs syncBuffer
	a, err := New(Config{Layout: lay, Client: client.New(url, key, reg.DeviceID, nil),
		Host:   policy.Host{Home: dir, UID: os.Getuid(), AgentDataDirs: lay.AgentDirs()},
		Python: os.Getenv("METNOS_PYTHON"), Path: os.Getenv("PATH"),
		Sandbox: sandbox.Options{SearchPath: os.Getenv("PATH"), Bwrap: os.Getenv("METNOS_BWRAP")},
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)), Block: 200 * time.Millisecond,
		OnIdle: func() {
			info, _ := srv.Device(reg.DeviceID)
			idle <- !info.LastPoll.IsZero()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()

	select {
	case polled := <-idle:
		if polled {
			t.Error("OnIdle was first called after a poll, want before the first")
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("OnIdle was not called at start-up\n%s", logs.String())
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case <-idle:
			t.Errorf("OnIdle was called again %s", what)
		case <-time.After(time.Second): // about five empty long-polls
		}
	}
	quiet("while the agent only waited")

	id, err := srv.Enqueue(reg.DeviceID, "echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Wait(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-idle:
	case <-time.After(30 * time.Second):
		t.Fatalf("OnIdle was not called when the agent waited again after a run\n%s", logs.String())
	}
	quiet("while the agent only waited after the run")
	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
}
