package pyc

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// python is a real interpreter for the tests: METNOS_PYTHON, else the
// first python3 on PATH that is not a version manager's shell script.
func python(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("METNOS_PYTHON"); p != "" {
		return p
	}
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(d, "python3")
		b, err := os.ReadFile(p)
		if err != nil || bytes.HasPrefix(b, []byte("#!")) {
			continue
		}
		real, err := filepath.EvalSymlinks(p)
		if err == nil {
			return real
		}
	}
	t.Skip("no python3 interpreter")
	return ""
}

// folder writes a small executor folder: an entry and a module it
// imports, and returns the folder.
func folder(t *testing.T) string {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.py"), []byte("import helper\nprint(helper.greet())\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "helper.py"), []byte("def greet():\n    return 'hello from source'\n"), 0o644)
	return dir
}

// run runs the entry as the agent does (PYTHONPATH the folder,
// PYTHONDONTWRITEBYTECODE=1) with -v, and returns its stdout and
// whether helper came from bytecode.
func run(t *testing.T, py, dir string) (string, bool) {
	t.Helper()
	cmd := exec.Command(py, "-v", filepath.Join(dir, "main.py"))
	cmd.Env = []string{"PYTHONPATH=" + dir, "PYTHONDONTWRITEBYTECODE=1"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("python: %v\n%s", err, errb.String())
	}
	fromPyc := strings.Contains(errb.String(), "code object from '"+filepath.Join(dir, CacheDir, "helper."))
	return strings.TrimSpace(out.String()), fromPyc
}

func newBytecode(t *testing.T) *Bytecode {
	return &Bytecode{Python: python(t), Key: KeyFrom([]byte("device seed for the tests, 32 b"))}
}

// TestCompileThenVerify: the first Prepare compiles the module, Python
// then loads it from the bytecode, and the next Prepare verifies it
// without compiling again.
func TestCompileThenVerify(t *testing.T) {
	b := newBytecode(t)
	dir := folder(t)
	if out, fromPyc := run(t, b.Python, dir); out != "hello from source" || fromPyc {
		t.Fatalf("before: %q, from bytecode %v", out, fromPyc)
	}
	o := b.Prepare(dir, []string{"helper.py"})
	if !o.Trusted || !o.Compiled || o.Err != nil || o.Untrusted != nil {
		t.Fatalf("first Prepare: %+v", o)
	}
	if out, fromPyc := run(t, b.Python, dir); out != "hello from source" || !fromPyc {
		t.Fatalf("after: %q, from bytecode %v", out, fromPyc)
	}
	if o := b.Prepare(dir, []string{"helper.py"}); !o.Trusted || o.Compiled || o.Untrusted != nil || o.Err != nil {
		t.Fatalf("second Prepare: %+v", o)
	}
}

// TestTamperedBytecodeIsRemoved: whatever changes the bytecode behind
// the agent's back (a flipped byte, an extra file in __pycache__, a
// sourceless .pyc beside the code, a list rewritten without the key,
// a list copied from another folder) is found by the next Prepare,
// which removes the bytecode (the planted file goes with it) and
// compiles again; the module still runs as its source says.
func TestTamperedBytecodeIsRemoved(t *testing.T) {
	b := newBytecode(t)
	cases := map[string]func(t *testing.T, dir, pyc string) string{
		"flipped byte": func(t *testing.T, dir, pyc string) string {
			data, _ := os.ReadFile(pyc)
			data[len(data)-3] ^= 1
			os.WriteFile(pyc, data, 0o644)
			return ""
		},
		"extra pyc": func(t *testing.T, dir, pyc string) string {
			p := filepath.Join(filepath.Dir(pyc), "json.cpython-311.pyc")
			data, _ := os.ReadFile(pyc)
			os.WriteFile(p, data, 0o644)
			return p
		},
		"sourceless pyc": func(t *testing.T, dir, pyc string) string {
			p := filepath.Join(dir, "pathlib.pyc")
			data, _ := os.ReadFile(pyc)
			os.WriteFile(p, data, 0o644)
			return p
		},
		"forged list": func(t *testing.T, dir, pyc string) string {
			data, _ := os.ReadFile(pyc)
			data[len(data)-3] ^= 1
			os.WriteFile(pyc, data, 0o644)
			forger := &Bytecode{Python: b.Python, Key: KeyFrom([]byte("not the device's seed"))}
			if err := forger.writeList(dir); err != nil {
				t.Fatal(err)
			}
			return ""
		},
		"list of another folder": func(t *testing.T, dir, pyc string) string {
			other := folder(t)
			os.WriteFile(filepath.Join(other, "helper.py"), []byte("def greet():\n    return 'other'\n"), 0o644)
			if o := b.Prepare(other, []string{"helper.py"}); !o.Trusted {
				t.Fatalf("other folder: %+v", o)
			}
			os.RemoveAll(filepath.Join(dir, CacheDir))
			os.Rename(filepath.Join(other, CacheDir), filepath.Join(dir, CacheDir))
			os.Rename(filepath.Join(other, ListName), filepath.Join(dir, ListName))
			return ""
		},
		"no list": func(t *testing.T, dir, pyc string) string {
			os.Remove(filepath.Join(dir, ListName))
			return ""
		},
	}
	for name, tamper := range cases {
		t.Run(name, func(t *testing.T) {
			dir := folder(t)
			if o := b.Prepare(dir, []string{"helper.py"}); !o.Trusted {
				t.Fatalf("Prepare: %+v", o)
			}
			pycs, _ := filepath.Glob(filepath.Join(dir, CacheDir, "helper.*.pyc"))
			if len(pycs) != 1 {
				t.Fatalf("compiled: %v", pycs)
			}
			planted := tamper(t, dir, pycs[0])
			if err := b.Verify(dir); err == nil {
				t.Fatal("Verify accepts the tampered folder")
			}
			o := b.Prepare(dir, []string{"helper.py"})
			if o.Untrusted == nil || !o.Compiled || !o.Trusted {
				t.Fatalf("Prepare after tampering: %+v", o)
			}
			t.Logf("found: %v", o.Untrusted)
			if planted != "" {
				if _, err := os.Stat(planted); err == nil {
					t.Errorf("%s is still there", planted)
				}
			}
			if err := b.Verify(dir); err != nil {
				t.Errorf("the bytecode compiled again does not verify: %v", err)
			}
			if out, fromPyc := run(t, b.Python, dir); out != "hello from source" || !fromPyc {
				t.Errorf("run: %q, from bytecode %v", out, fromPyc)
			}
		})
	}
}

// TestAnotherInterpreterCompilesAgain: bytecode compiled for one
// interpreter is compiled again when the agent runs another (here the
// same one through another path, which the list cannot tell apart from
// an upgrade), without a warning.
func TestAnotherInterpreterCompilesAgain(t *testing.T) {
	b := newBytecode(t)
	dir := folder(t)
	if o := b.Prepare(dir, []string{"helper.py"}); !o.Trusted {
		t.Fatalf("Prepare: %+v", o)
	}
	link := filepath.Join(t.TempDir(), "python3")
	if err := os.Symlink(b.Python, link); err != nil {
		t.Skip(err)
	}
	other := &Bytecode{Python: link, Key: b.Key}
	o := other.Prepare(dir, []string{"helper.py"})
	if !o.Stale || !o.Compiled || !o.Trusted || o.Untrusted != nil {
		t.Fatalf("Prepare with another interpreter: %+v", o)
	}
	if err := b.Verify(dir); err == nil {
		t.Error("the first interpreter still trusts the list written for the second")
	}
}

// TestOffRemovesBytecode: with bytecode off, Prepare removes any there
// is (Python would load a planted one even with
// PYTHONDONTWRITEBYTECODE=1) and the module runs from source.
func TestOffRemovesBytecode(t *testing.T) {
	b := newBytecode(t)
	dir := folder(t)
	b.Prepare(dir, []string{"helper.py"})
	off := &Bytecode{Off: true}
	if o := off.Prepare(dir, []string{"helper.py"}); o.Trusted || o.Compiled || o.Err != nil {
		t.Fatalf("Prepare off: %+v", o)
	}
	if out, fromPyc := run(t, b.Python, dir); out != "hello from source" || fromPyc {
		t.Fatalf("off: %q, from bytecode %v", out, fromPyc)
	}
	if _, err := os.Stat(filepath.Join(dir, ListName)); err == nil {
		t.Error("the list is still there")
	}
}

// TestCompileFailureRunsFromSource: a module that does not compile
// leaves the others compiled and listed, and is reported.
func TestCompileFailureRunsFromSource(t *testing.T) {
	b := newBytecode(t)
	dir := folder(t)
	os.WriteFile(filepath.Join(dir, "broken.py"), []byte("def (:\n"), 0o644)
	o := b.Prepare(dir, []string{"helper.py", "broken.py"})
	if o.Err == nil || !strings.Contains(o.Err.Error(), "broken.py") || !o.Trusted {
		t.Fatalf("Prepare: %+v", o)
	}
	if out, fromPyc := run(t, b.Python, dir); out != "hello from source" || !fromPyc {
		t.Fatalf("run: %q, from bytecode %v", out, fromPyc)
	}
}
