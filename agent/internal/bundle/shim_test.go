package bundle

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/wire"
)

func shimBundle(t *testing.T, files map[string]string) wire.ShimBundle {
	t.Helper()
	enc := map[string]any{}
	b := wire.ShimBundle{Files: map[string]string{}}
	for k, v := range files {
		s := base64.StdEncoding.EncodeToString([]byte(v))
		b.Files[k], enc[k] = s, s
	}
	sig, err := wire.SignCanonical(serverKey, map[string]any{"files": enc})
	if err != nil {
		t.Fatal(err)
	}
	b.Sig = sig
	return b
}

func TestInstallShim(t *testing.T) {
	cache := t.TempDir()
	files := map[string]string{"executor_helpers.py": "def run_stdio(): pass\n", "backends/files/local.py": "X = 1\n"}
	dir, digest, err := InstallShim(layout.Layout{Cache: cache}, shimBundle(t, files), pub())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "backends", "files", "local.py")); string(b) != "X = 1\n" {
		t.Errorf("local.py = %q", b)
	}
	raw := map[string][]byte{}
	for k, v := range files {
		raw[k] = []byte(v)
	}
	if digest != wire.ShimDigest(raw) || len(digest) != 64 {
		t.Errorf("digest %s", digest)
	}
	// Tampered after signing, or an unsafe name even if signed: refused.
	b := shimBundle(t, files)
	b.Files["executor_helpers.py"] = base64.StdEncoding.EncodeToString([]byte("evil"))
	if _, _, err := InstallShim(layout.Layout{Cache: cache}, b, pub()); !errors.Is(err, ErrUnverified) {
		t.Errorf("tampered shim: %v", err)
	}
	if _, _, err := InstallShim(layout.Layout{Cache: cache}, shimBundle(t, map[string]string{"../x.py": ""}), pub()); !errors.Is(err, ErrUnverified) {
		t.Errorf("unsafe name: %v", err)
	}
	// The installed shim is untouched by the refused ones.
	if b, _ := os.ReadFile(filepath.Join(dir, "executor_helpers.py")); string(b) != files["executor_helpers.py"] {
		t.Error("a refused shim replaced the installed one")
	}
}

// TestCheckShim: the installed shim verifies again, with the bytecode
// the agent compiles beside it; a module planted in its folder (which
// would shadow the standard library's) and a changed file do not; a
// missing file is left to the self-heal of a run that misses it.
func TestCheckShim(t *testing.T) {
	files := map[string]string{"executor_helpers.py": "def run_stdio(): pass\n", "backends/files/local.py": "X = 1\n"}
	cases := map[string]func(dir string) error{
		"planted module": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "json.py"), []byte("print('PWNED')\n"), 0o644)
		},
		"planted in a package": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "backends", "os.py"), []byte("print('PWNED')\n"), 0o644)
		},
		"changed file": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "backends", "files", "local.py"), []byte("print('PWNED')\n"), 0o644)
		},
	}
	for name, tamper := range cases {
		t.Run(name, func(t *testing.T) {
			b := shimBundle(t, files)
			dir, _, err := InstallShim(layout.Layout{Cache: t.TempDir()}, b, pub())
			if err != nil {
				t.Fatal(err)
			}
			os.MkdirAll(filepath.Join(dir, "backends", "files", "__pycache__"), 0o755)
			os.WriteFile(filepath.Join(dir, "backends", "files", "__pycache__", "local.cpython-311.pyc"), []byte("x"), 0o644)
			os.WriteFile(filepath.Join(dir, ".metnos-pyc"), []byte("x"), 0o644)
			if err := CheckShim(dir, ShimSums(b)); err != nil {
				t.Fatalf("the installed shim: %v", err)
			}
			os.Remove(filepath.Join(dir, "executor_helpers.py"))
			if err := CheckShim(dir, ShimSums(b)); err != nil {
				t.Fatalf("the installed shim missing a file: %v", err)
			}
			if err := tamper(dir); err != nil {
				t.Fatal(err)
			}
			err = CheckShim(dir, ShimSums(b))
			if !errors.Is(err, ErrUnverified) {
				t.Fatalf("CheckShim: %v", err)
			}
			t.Log(err)
		})
	}
}
