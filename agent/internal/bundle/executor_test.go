package bundle

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/wire"
)

var serverKey = ed25519.NewKeyFromSeed([]byte("metnos-agent-test-server-key-32b"))

const manifestText = `name = "echo_args"
[code]
files = ["echo_args.py", "lib/helper.py"]
digest = "sha256:x"

[[capabilities]]
name = "fs:read"
hint = ["~/notes/**"]

[placement]
min_sandbox = "job-object"
`

// bundle returns a signed bundle and the invocation's digests.
func bundle(t *testing.T, manifest string, files map[string]string) (wire.ExecutorBundle, string, string) {
	t.Helper()
	b := wire.ExecutorBundle{Name: "echo_args", ManifestTOML: base64.StdEncoding.EncodeToString([]byte(manifest)),
		ManifestSig: base64.StdEncoding.EncodeToString(ed25519.Sign(serverKey, []byte(manifest))),
		Files:       map[string]string{}}
	h := sha256.New()
	for _, f := range []string{"echo_args.py", "lib/helper.py"} {
		h.Write([]byte(files[f]))
	}
	for f, c := range files {
		b.Files[f] = base64.StdEncoding.EncodeToString([]byte(c))
	}
	ms := sha256.Sum256([]byte(manifest))
	return b, hex.EncodeToString(ms[:]), hex.EncodeToString(h.Sum(nil))
}

var code = map[string]string{"echo_args.py": "print('hi')\n", "lib/helper.py": "X = 1\n"}

func pub() ed25519.PublicKey { return serverKey.Public().(ed25519.PublicKey) }

func TestMaterializeAndReuse(t *testing.T) {
	cache := t.TempDir()
	b, ms, cs := bundle(t, manifestText, code)
	ex, err := Materialize(layout.Layout{Cache: cache}, b, "echo_args", ms, cs, pub())
	if err != nil {
		t.Fatal(err)
	}
	if ex.Entry != filepath.Join(cache, "executors", "echo_args-"+ms[:16], "echo_args.py") {
		t.Errorf("entry %s", ex.Entry)
	}
	if ex.Manifest.Capabilities[0].Name != "fs:read" || ex.Manifest.Capabilities[0].Hints[0] != "~/notes/**" {
		t.Errorf("capabilities %+v", ex.Manifest.Capabilities)
	}
	if _, err := Cached(layout.Layout{Cache: cache}, "echo_args", ms, cs, pub()); err != nil {
		t.Fatalf("the cache entry does not verify: %v", err)
	}
	// Tampered on disk: deleted, and reported as unverified.
	os.WriteFile(filepath.Join(ex.Dir, "lib", "helper.py"), []byte("import os; os.system('x')\n"), 0o644)
	if _, err := Cached(layout.Layout{Cache: cache}, "echo_args", ms, cs, pub()); !errors.Is(err, ErrUnverified) {
		t.Fatalf("a tampered cache entry: %v", err)
	}
	if _, err := os.Stat(ex.Dir); !os.IsNotExist(err) {
		t.Error("the tampered cache entry is still there")
	}
}

func TestMaterializeRefuses(t *testing.T) {
	other := ed25519.NewKeyFromSeed(make([]byte, 32))
	for name, c := range map[string]func(b *wire.ExecutorBundle, ms, cs *string){
		"other name":      func(b *wire.ExecutorBundle, ms, cs *string) { b.Name = "rm_rf" },
		"manifest digest": func(b *wire.ExecutorBundle, ms, cs *string) { *ms = strings.Repeat("0", 64) },
		"code digest":     func(b *wire.ExecutorBundle, ms, cs *string) { *cs = strings.Repeat("0", 64) },
		"signature by another key": func(b *wire.ExecutorBundle, ms, cs *string) {
			m, _ := base64.StdEncoding.DecodeString(b.ManifestTOML)
			b.ManifestSig = base64.StdEncoding.EncodeToString(ed25519.Sign(other, m))
		},
		"tampered code": func(b *wire.ExecutorBundle, ms, cs *string) {
			b.Files["echo_args.py"] = base64.StdEncoding.EncodeToString([]byte("evil"))
		},
		"missing file": func(b *wire.ExecutorBundle, ms, cs *string) { delete(b.Files, "lib/helper.py") },
	} {
		b, ms, cs := bundle(t, manifestText, code)
		c(&b, &ms, &cs)
		if _, err := Materialize(layout.Layout{Cache: t.TempDir()}, b, "echo_args", ms, cs, pub()); !errors.Is(err, ErrUnverified) {
			t.Errorf("%s: got %v, want ErrUnverified", name, err)
		}
	}
	// An unsafe path, even signed, is refused.
	unsafe := strings.Replace(manifestText, `"lib/helper.py"`, `"../escape.py"`, 1)
	b, ms, _ := bundle(t, unsafe, code)
	if _, err := Materialize(layout.Layout{Cache: t.TempDir()}, b, "echo_args", ms, strings.Repeat("a", 64), pub()); err == nil || !strings.Contains(err.Error(), "unsafe code path") {
		t.Errorf("unsafe path: %v", err)
	}
	// Dependencies are refused with a clear error.
	deps := "dependencies = [\"requests\"]\n" + manifestText
	b, ms, cs := bundle(t, deps, code)
	if _, err := Materialize(layout.Layout{Cache: t.TempDir()}, b, "echo_args", ms, cs, pub()); err == nil || !strings.Contains(err.Error(), "dependencies") {
		t.Errorf("dependencies: %v", err)
	}
}

// TestMaterializeLeavesNoTemp: a bundle that cannot be written into the
// cache (here one code path is a file and, below it, another code path)
// fails naming the cache folder and leaves no .tmp folder, and a .tmp
// folder a crash left beside the cached executors is removed at the next
// Materialize.
func TestMaterializeLeavesNoTemp(t *testing.T) {
	cache := t.TempDir()
	lay := layout.Layout{Cache: cache}
	stale := filepath.Join(cache, "executors", "list_dirs-0123456789abcdef.tmp")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(stale, "half.py"), []byte("pri"), 0o644)

	files := []string{"echo_args.py", "echo_args.py/inner.py"}
	manifest := strings.Replace(manifestText, `"lib/helper.py"`, `"echo_args.py/inner.py"`, 1)
	b := wire.ExecutorBundle{Name: "echo_args", ManifestTOML: base64.StdEncoding.EncodeToString([]byte(manifest)),
		ManifestSig: base64.StdEncoding.EncodeToString(ed25519.Sign(serverKey, []byte(manifest))), Files: map[string]string{}}
	h := sha256.New()
	for _, f := range files {
		h.Write([]byte("x = 1\n"))
		b.Files[f] = base64.StdEncoding.EncodeToString([]byte("x = 1\n"))
	}
	ms := sha256.Sum256([]byte(manifest))
	_, err := Materialize(lay, b, "echo_args", hex.EncodeToString(ms[:]), hex.EncodeToString(h.Sum(nil)), pub())
	if err == nil || !strings.Contains(err.Error(), filepath.Join(cache, "executors")) {
		t.Fatalf("got %v, want an error naming the cache folder", err)
	}
	if left, _ := filepath.Glob(filepath.Join(cache, "executors", "*")); len(left) != 0 {
		t.Errorf("left in the cache: %v", left)
	}

	// And a good bundle still goes in.
	good, gms, gcs := bundle(t, manifestText, code)
	if _, err := Materialize(lay, good, "echo_args", gms, gcs, pub()); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(cache, "executors", "*.tmp")); len(left) != 0 {
		t.Errorf("left in the cache: %v", left)
	}
}

// TestManifestWhenDefaults: a capability's when clause reads the
// schema's default of an argument the invocation leaves out, as the
// server does; the clause itself is kept from the signed manifest.
func TestManifestWhenDefaults(t *testing.T) {
	for _, c := range []struct {
		def     string
		refused bool
	}{{"local", false}, {"google_workspace", true}} {
		m := strings.Replace(manifestText, "[placement]", `[args.properties.client]
type = "string"
default = "`+c.def+`"

[[capabilities]]
name = "provider:access"
hint = ["google-workspace"]
when = { arg = "client", values = ["google_workspace"] }

[placement]`, 1)
		b, ms, cs := bundle(t, m, code)
		ex, err := Materialize(layout.Layout{Cache: t.TempDir()}, b, "echo_args", ms, cs, pub())
		if err != nil {
			t.Fatal(err)
		}
		_, err = policy.Derive(policy.DeriveInput{Manifest: ex.Manifest.Facts, Args: map[string]any{}, Host: policy.Host{Home: t.TempDir()}})
		if got := errors.Is(err, policy.ErrCapabilityRefused); got != c.refused {
			t.Errorf("client defaulting to %s: err %v, want refused %v", c.def, err, c.refused)
		}
	}
}

// TestCachedRefusesPlantedFiles: a cache entry holding a file the agent
// did not write — a module beside the code that would shadow the
// standard library's (the folder is first on Python's path), a
// sourceless .pyc, a link, a folder — is refused as unverified and
// deleted, to be fetched again; the bytecode the agent writes
// (__pycache__ beside the code, and its list) is left to package pyc.
func TestCachedRefusesPlantedFiles(t *testing.T) {
	plants := map[string]func(dir string) error{
		"module shadowing the stdlib": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "pathlib.py"), []byte("print('PWNED')\n"), 0o644)
		},
		"sourceless pyc": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "lib", "json.pyc"), []byte("x"), 0o644)
		},
		"link": func(dir string) error {
			return os.Symlink("/etc/passwd", filepath.Join(dir, "lib", "passwd"))
		},
		"package folder": func(dir string) error {
			return os.Mkdir(filepath.Join(dir, "email"), 0o755)
		},
		"pycache in a folder of no code": func(dir string) error {
			return os.MkdirAll(filepath.Join(dir, "other", "__pycache__"), 0o755)
		},
	}
	for name, plant := range plants {
		t.Run(name, func(t *testing.T) {
			cache := t.TempDir()
			b, ms, cs := bundle(t, manifestText, code)
			ex, err := Materialize(layout.Layout{Cache: cache}, b, "echo_args", ms, cs, pub())
			if err != nil {
				t.Fatal(err)
			}
			if err := plant(ex.Dir); err != nil {
				t.Fatal(err)
			}
			_, err = Cached(layout.Layout{Cache: cache}, "echo_args", ms, cs, pub())
			if !errors.Is(err, ErrUnverified) {
				t.Fatalf("Cached: %v", err)
			}
			t.Log(err)
			if _, err := os.Stat(ex.Dir); !os.IsNotExist(err) {
				t.Error("the cache entry is still there")
			}
		})
	}
	t.Run("bytecode", func(t *testing.T) {
		cache := t.TempDir()
		b, ms, cs := bundle(t, manifestText, code)
		ex, err := Materialize(layout.Layout{Cache: cache}, b, "echo_args", ms, cs, pub())
		if err != nil {
			t.Fatal(err)
		}
		os.Mkdir(filepath.Join(ex.Dir, "lib", "__pycache__"), 0o755)
		os.WriteFile(filepath.Join(ex.Dir, "lib", "__pycache__", "helper.cpython-311.pyc"), []byte("x"), 0o644)
		os.WriteFile(filepath.Join(ex.Dir, ".metnos-pyc"), []byte("x"), 0o644)
		if _, err := Cached(layout.Layout{Cache: cache}, "echo_args", ms, cs, pub()); err != nil {
			t.Fatalf("Cached refuses the bytecode folders: %v", err)
		}
	})
}
