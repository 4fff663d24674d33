package agent

import (
	"context"
	"crypto/ed25519"
	"io/fs"
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
	"github.com/metnos/agent/wire"
)

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

// deviceAgent is an agent under test: a device paired with a reference
// server of its own on loopback, its layout in a temporary folder.
type deviceAgent struct {
	*Agent
	srv  *refserver.Server
	reg  wire.Registration
	lay  layout.Layout
	dir  string      // the device's home
	logs *syncBuffer // the agent's log, text at info unless edit says
	cfg  Config      // what the agent was made with, to make it again
}

// newDeviceAgent pairs a device called name with a reference server
// serving execs and makes its agent as run would on this machine: the
// host's Python, PATH and bubblewrap, the home in dir, a long-poll of
// a second. edit, when not nil, changes the configuration before New
// (d's server, layout, home and logs are already set).
func newDeviceAgent(t *testing.T, execs fs.FS, name string, edit func(d *deviceAgent, c *Config)) *deviceAgent {
	t.Helper()
	srv, url, dir, lay, key, reg := pairedDevice(t, execs, name)
	d := &deviceAgent{srv: srv, reg: reg, lay: lay, dir: dir, logs: &syncBuffer{}}
	cfg := Config{Layout: lay, Client: client.New(url, key, reg.DeviceID, nil),
		Host:   policy.Host{Home: dir, UID: os.Getuid(), AgentDataDirs: lay.AgentDirs()},
		Python: os.Getenv("METNOS_PYTHON"), Path: os.Getenv("PATH"),
		Sandbox: sandbox.Options{SearchPath: os.Getenv("PATH"), Bwrap: os.Getenv("METNOS_BWRAP")},
		Logger:  slog.New(slog.NewTextHandler(d.logs, nil)), Block: time.Second}
	if edit != nil {
		edit(d, &cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	d.Agent, d.cfg = a, cfg
	return d
}

// start runs the agent until ctx ends or stop is called, after
// skipping the test where no Python runs executors; ran gives what Run
// returned, once it has.
func (d *deviceAgent) start(t *testing.T, ctx context.Context) (stop context.CancelFunc, ran <-chan error) {
	t.Helper()
	if _, err := d.Python(); err != nil {
		t.Skipf("no Python for executors: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	return stop, done
}
