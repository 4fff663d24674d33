package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/layout"
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

	p, err := FindPython(lay, py, path)
	if err != nil || p.Path != filepath.Join(real, "python3") || p.Source != "system:python3" || !strings.Contains(p.Note, shims) || p.Prefix != filepath.Join(dir, "py") {
		t.Fatalf("system: %+v %v", p, err)
	}
	rt := lay.Interpreter()
	os.MkdirAll(filepath.Dir(rt), 0o755)
	os.WriteFile(rt, []byte("\x7fELF"), 0o755)
	if p, err := FindPython(lay, py, path); err != nil || p.Source != "provisioned" || p.Path != rt {
		t.Fatalf("provisioned: %+v %v", p, err)
	}
	py = filepath.Join(real, "python3")
	if p, err := FindPython(lay, py, path); err != nil || p.Source != "env:METNOS_PYTHON" {
		t.Fatalf("env: %+v %v", p, err)
	}
	py = real
	if _, err := FindPython(lay, py, path); err == nil || !strings.Contains(err.Error(), "METNOS_PYTHON") {
		t.Fatalf("a directory as METNOS_PYTHON: %v", err)
	}
	py = ""
	os.Remove(rt)
	path = shims
	if _, err := FindPython(lay, py, path); err == nil {
		t.Fatal("only a shell shim on PATH was accepted")
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
