package agent

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/wire"
)

// TestFindPython: METNOS_PYTHON wins (and must be a file), then the
// provisioned runtime, then the first real interpreter on PATH, skipping
// a version manager's shell shim.
func TestFindPython(t *testing.T) {
	dir := t.TempDir()
	shims, real, cache := filepath.Join(dir, "shims"), filepath.Join(dir, "py", "bin"), filepath.Join(dir, "cache")
	for _, d := range []string{shims, real} {
		os.MkdirAll(d, 0o755)
	}
	os.WriteFile(filepath.Join(shims, "python3"), []byte("#!/bin/sh\nexec pyenv exec python3 \"$@\"\n"), 0o755)
	os.WriteFile(filepath.Join(real, "python3"), []byte("\x7fELF not really"), 0o755)
	// METNOS_PYTHON and PATH, as the command line passes them.
	py, path := "", shims+string(os.PathListSeparator)+real
	lay := layout.Layout{Cache: cache}

	p, err := FindPython(lay, policy.Host{}, py, path)
	if err != nil || p.Path != filepath.Join(real, "python3") || p.Source != "system:python3" || !strings.Contains(p.Note, shims) || p.Prefix != filepath.Join(dir, "py") {
		t.Fatalf("system: %+v %v", p, err)
	}
	rt := lay.Interpreter()
	os.MkdirAll(filepath.Dir(rt), 0o755)
	os.WriteFile(rt, []byte("\x7fELF"), 0o755)
	if p, err := FindPython(lay, policy.Host{}, py, path); err != nil || p.Source != "provisioned" || p.Path != rt {
		t.Fatalf("provisioned: %+v %v", p, err)
	}
	py = filepath.Join(real, "python3")
	if p, err := FindPython(lay, policy.Host{}, py, path); err != nil || p.Source != "env:METNOS_PYTHON" {
		t.Fatalf("env: %+v %v", p, err)
	}
	py = real
	if _, err := FindPython(lay, policy.Host{}, py, path); err == nil || !strings.Contains(err.Error(), "METNOS_PYTHON") {
		t.Fatalf("a directory as METNOS_PYTHON: %v", err)
	}
	py = ""
	os.Remove(rt)
	path = shims
	if _, err := FindPython(lay, policy.Host{}, py, path); err == nil {
		t.Fatal("only a shell shim on PATH was accepted")
	}
}

// An interpreter the sandbox hides is never chosen: with HOME
// elsewhere, a Python first on PATH that lies (its links resolved) in a
// masked folder (here the home's ~/.ssh, as /root is for a pyenv Python
// when HOME is not /root) is skipped, saying why, and the next one that
// the sandbox can show is chosen; with no other, the error says why.
func TestFindPythonSkipsMasked(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	masked := filepath.Join(home, ".ssh", "pyenv", "versions", "3.11.7", "bin")
	links, real := filepath.Join(dir, "links"), filepath.Join(dir, "opt", "py", "bin")
	for _, d := range []string{masked, links, real} {
		os.MkdirAll(d, 0o755)
	}
	os.WriteFile(filepath.Join(masked, "python3.11"), []byte("\x7fELF not really"), 0o755)
	os.WriteFile(filepath.Join(real, "python3"), []byte("\x7fELF not really"), 0o755)
	// A link on PATH into the masked folder: its target is what counts.
	os.Symlink(filepath.Join(masked, "python3.11"), filepath.Join(links, "python3"))
	lay := layout.Layout{Data: filepath.Join(home, ".local", "share", "metnos"), Cache: filepath.Join(home, ".cache", "metnos"), Home: home}
	host := policy.Host{Home: home, AgentDataDirs: lay.AgentDirs()}
	path := links + string(os.PathListSeparator) + real

	p, err := FindPython(lay, host, "", path)
	if err != nil || p.Path != filepath.Join(real, "python3") {
		t.Fatalf("got %+v %v, want %s", p, err, filepath.Join(real, "python3"))
	}
	want := filepath.Join(masked, "python3.11") + ": under " + filepath.Join(home, ".ssh") + ", which the sandbox hides"
	if len(p.Skipped) != 1 || p.Skipped[0] != want {
		t.Errorf("Skipped %q, want [%q]", p.Skipped, want)
	}
	// Only the masked one: an error that says why it was skipped.
	p, err = FindPython(lay, host, "", links)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("only a masked Python: %+v %v", p, err)
	}
	// METNOS_PYTHON naming it is an error, not a silent failure later.
	if _, err := FindPython(lay, host, filepath.Join(links, "python3"), path); err == nil || !strings.Contains(err.Error(), "cannot run in the sandbox") {
		t.Errorf("METNOS_PYTHON in a masked folder: %v", err)
	}
	// A Python in the agent's own data folder is masked too.
	agentPy := filepath.Join(lay.Data, "py", "bin")
	os.MkdirAll(agentPy, 0o755)
	os.WriteFile(filepath.Join(agentPy, "python3"), []byte("\x7fELF"), 0o755)
	if p, err := FindPython(lay, host, "", agentPy+string(os.PathListSeparator)+real); err != nil || p.Path != filepath.Join(real, "python3") || len(p.Skipped) != 1 {
		t.Errorf("a Python in the agent's data folder: %+v %v", p, err)
	}
	// Without the sandbox (the zero Host) nothing is skipped.
	if p, err := FindPython(lay, policy.Host{}, "", path); err != nil || p.Path != filepath.Join(masked, "python3.11") {
		t.Errorf("sandbox off: %+v %v", p, err)
	}
}

func TestRefusedEnv(t *testing.T) {
	for k, refused := range map[string]bool{
		"METNOS_TURN_ID": false, "METNOS_LANG": false, "METNOS_EXECUTOR_ASSIGNED_X": false, "lower_ok": false,
		"LD_PRELOAD": true, "ld_library_path": true, "PYTHONPATH": true, "PYTHONHOME": true, "PATH": true, "HOME": true,
		"GCONV_PATH": true, "A=B": true, "": true, "1X": true, "METNOS_RUNTIME": true,
	} {
		if got := refusedEnv(k) != ""; got != refused {
			t.Errorf("%q: refused %v, want %v", k, got, refused)
		}
	}
}

// The start-up log says which interpreter was skipped and why, and the
// agent runs executors with the next one.
func TestStartupLogSaysPythonSkipped(t *testing.T) {
	dir := t.TempDir()
	lay := layout.Layout{Data: filepath.Join(dir, "data"), Cache: filepath.Join(dir, "cache"), Home: dir}
	masked, real := filepath.Join(dir, ".ssh", "py", "bin"), filepath.Join(dir, "opt", "py", "bin")
	for _, d := range []string{masked, real} {
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "python3"), []byte("\x7fELF"), 0o755)
	}
	key, err := pairing.LoadOrCreateKey(lay)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	id, k, url := "0123456789abcdef0123456789abcdef", wire.PublicKeyWire(pub), "http://127.0.0.1:1"
	if err := pairing.SaveState(lay, pairing.State{DeviceID: &id, ServerURL: &url, ServerPublicKey: &k}); err != nil {
		t.Fatal(err)
	}
	var logb bytes.Buffer
	a, err := New(Config{Layout: lay, Client: client.New(url, key, id, nil),
		Host:   policy.Host{Home: dir, UID: os.Getuid(), AgentDataDirs: lay.AgentDirs()},
		Path:   masked + string(os.PathListSeparator) + real,
		Logger: slog.New(slog.NewTextHandler(&logb, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if py, err := a.Python(); err != nil || py.Path != filepath.Join(real, "python3") {
		t.Errorf("python %+v %v, want %s", py, err, filepath.Join(real, "python3"))
	}
	want := "python skipped: the sandbox could not run it\" skipped=\"" + filepath.Join(masked, "python3") + ": under " + filepath.Join(dir, ".ssh") + ", which the sandbox hides\""
	if !strings.Contains(logb.String(), want) {
		t.Errorf("the start-up log lacks %s:\n%s", want, logb.String())
	}
}
