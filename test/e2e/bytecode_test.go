//go:build linux

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/metnos/agent/refserver"
)

// agentPython is the interpreter the agent picks (the first python3 on
// PATH that is not a version manager's shell script), for the runs the
// tests make outside the agent.
func agentPython(t *testing.T) string {
	t.Helper()
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(d, "python3")
		b, err := os.ReadFile(p)
		if err != nil || bytes.HasPrefix(b, []byte("#!")) {
			continue
		}
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return real
		}
	}
	t.Skip("no python3 on PATH")
	return ""
}

// probeRun runs pyc_probe once and returns its payload.
func (w *world) probeRun(t *testing.T, probe bool) map[string]any {
	t.Helper()
	info := w.wait(w.enqueue("pyc_probe", map[string]any{"probe": probe}, refserver.EnqueueOptions{}))
	r := result(t, info)
	if info.State != "done" || r["ok"] != true {
		t.Fatalf("pyc_probe: %s", info.ResultBody)
	}
	p, _ := r["payload"].(map[string]any)
	if p == nil {
		p = r
	}
	return p
}

// probeDir is pyc_probe's cache entry.
func (w *world) probeDir(t *testing.T) string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(w.cacheDir(), "executors", "pyc_probe-*"))
	if len(dirs) != 1 {
		t.Fatalf("pyc_probe cache entries: %v", dirs)
	}
	return dirs[0]
}

// TestBytecodeKept: after the first run the executor's module and the
// shim's are compiled, with their list, and Python inside the sandbox
// loads them from bytecode; an agent with METNOS_BYTECODE=off gives the
// same result, keeps no bytecode, and loads none.
func TestBytecodeKept(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	on := w.probeRun(t, true)
	dir := w.probeDir(t)
	for _, f := range []string{".metnos-pyc", "__pycache__"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the cache entry has no %s: %v", f, err)
		}
	}
	if pycs, _ := filepath.Glob(filepath.Join(w.cacheDir(), "shim", "__pycache__", "executor_helpers.*.pyc")); len(pycs) != 1 {
		t.Errorf("the shim's bytecode: %v", pycs)
	}
	loaded := func(m map[string]any) []string {
		var out []string
		for _, x := range m["from_bytecode"].([]any) {
			out = append(out, strings.SplitN(x.(string), ".", 2)[0])
		}
		return out
	}
	if got := loaded(on); !slices.Equal(got, []string{"executor_helpers", "helper"}) {
		t.Errorf("loaded from bytecode inside the sandbox: %v, want executor_helpers and helper", got)
	}
	p.stop(t)

	w.startExe(filepath.Join(binDir, "metnos-agent"), []string{"METNOS_BYTECODE=off"})
	off := w.probeRun(t, true)
	if on["greeting"] != "hello from helper" || off["greeting"] != on["greeting"] || off["shim"] != on["shim"] {
		t.Errorf("with bytecode %v, without %v", on, off)
	}
	if got := loaded(off); len(got) != 0 {
		t.Errorf("METNOS_BYTECODE=off: loaded from bytecode inside the sandbox: %v", got)
	}
	for _, d := range []string{dir, filepath.Join(w.cacheDir(), "shim")} {
		for _, f := range []string{".metnos-pyc", "__pycache__"} {
			if _, err := os.Stat(filepath.Join(d, f)); err == nil {
				t.Errorf("METNOS_BYTECODE=off: %s still has %s", d, f)
			}
		}
	}
}

// plantedPyc is bytecode for rel in dir (a module of the executor or
// the shim) whose code prints PWNED, with a checked-hash header that
// matches the real source: Python itself accepts it.
func plantedPyc(t *testing.T, py, dir, rel string) string {
	t.Helper()
	script := `import sys, importlib.util, py_compile, os, tempfile
src, out = sys.argv[1], sys.argv[2]
d = tempfile.mkdtemp()
evil = os.path.join(d, os.path.basename(src))
open(evil, "w").write("print('PWNED')\ndef greet():\n    return 'PWNED'\n")
py_compile.compile(evil, cfile=out, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
b = bytearray(open(out, "rb").read())
b[8:16] = importlib.util.source_hash(open(src, "rb").read())
open(out, "wb").write(bytes(b))
print(importlib.util.cache_from_source(src))
`
	src := filepath.Join(dir, rel)
	cached, err := exec.Command(py, "-c", "import importlib.util, sys; print(importlib.util.cache_from_source(sys.argv[1]))", src).Output()
	if err != nil {
		t.Fatal(err)
	}
	target := strings.TrimSpace(string(cached))
	os.MkdirAll(filepath.Dir(target), 0o755)
	if out, err := exec.Command(py, "-c", script, src, target).CombinedOutput(); err != nil {
		t.Fatalf("planting %s: %v\n%s", target, err, out)
	}
	return target
}

// outside runs the cached executor as the agent does (same interpreter,
// PYTHONPATH and PYTHONDONTWRITEBYTECODE) but outside the agent, and
// returns its output: where the attacks must work.
func (w *world) outside(t *testing.T, py, dir string) string {
	t.Helper()
	shim := filepath.Join(w.cacheDir(), "shim")
	cmd := exec.Command(py, filepath.Join(dir, "pyc_probe.py"))
	cmd.Env = []string{"PYTHONPATH=" + shim + ":" + dir, "METNOS_RUNTIME=" + shim, "PYTHONDONTWRITEBYTECODE=1", "PATH=/usr/bin:/bin"}
	cmd.Stdin = strings.NewReader("{}")
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// TestPlantedBytecodeNeverLoads: bytecode planted in the cache — for
// the executor's own module and for the shim's, its checked-hash header
// matching the real source so that Python itself accepts it — and a
// module that shadows the standard library's json, planted beside the
// executor's code or in the shim's folder, are each loaded by Python
// run outside the agent with
// the agent's PYTHONPATH (the attack works), and never by the agent's
// run, which returns the real result and says what it found.
func TestPlantedBytecodeNeverLoads(t *testing.T) {
	py := agentPython(t)
	plants := []struct {
		name  string
		plant func(t *testing.T, w *world, dir string) string // returns the planted file
		log   string
	}{
		{"executor-module-pyc", func(t *testing.T, w *world, dir string) string {
			return plantedPyc(t, py, dir, "helper.py")
		}, "bytecode the agent did not write"},
		{"shim-module-pyc", func(t *testing.T, w *world, dir string) string {
			return plantedPyc(t, py, filepath.Join(w.cacheDir(), "shim"), "executor_helpers.py")
		}, "bytecode the agent did not write"},
		{"stdlib-shadow", func(t *testing.T, w *world, dir string) string {
			p := filepath.Join(dir, "json.py")
			os.WriteFile(p, []byte("print('PWNED')\nfrom importlib import import_module as _i\nimport sys as _s\n"), 0o644)
			return p
		}, "its cache folder holds json.py"},
		{"shim-stdlib-shadow", func(t *testing.T, w *world, dir string) string {
			p := filepath.Join(w.cacheDir(), "shim", "json.py")
			os.WriteFile(p, []byte("print('PWNED')\n"), 0o644)
			return p
		}, "the shim in the cache no longer verifies"},
	}
	for _, c := range plants {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			w.pair()
			p := w.start()
			if got := w.probeRun(t, false); got["greeting"] != "hello from helper" {
				t.Fatalf("first run: %v", got)
			}
			dir := w.probeDir(t)
			planted := c.plant(t, w, dir)
			if out := w.outside(t, py, dir); !strings.Contains(out, "PWNED") {
				t.Fatalf("the planted %s is not loaded outside the agent either, so this test proves nothing:\n%s", planted, out)
			}
			info := w.wait(w.enqueue("pyc_probe", map[string]any{}, refserver.EnqueueOptions{}))
			if r := result(t, info); info.State != "done" || r["ok"] != true || bytes.Contains(info.ResultBody, []byte("PWNED")) || !bytes.Contains(info.ResultBody, []byte("hello from helper")) {
				t.Errorf("the agent's run: %s", info.ResultBody)
			}
			if !logHas(p, c.log) {
				t.Errorf("the agent's log does not say %q", c.log)
			}
			if b, err := os.ReadFile(planted); err == nil && bytes.Contains(b, []byte("PWNED")) {
				t.Errorf("the planted %s is still there", planted)
			}
			// And the next run is served from the agent's own bytecode again.
			if got := w.probeRun(t, true); got["greeting"] != "hello from helper" || len(got["from_bytecode"].([]any)) != 2 {
				t.Errorf("the run after: %v", got)
			}
		})
	}
}
