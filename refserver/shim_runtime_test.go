package refserver

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/metnos/agent/agent"
	"github.com/metnos/agent/wire"
)

func (h *harness) shim() agent.ShimBundle {
	h.t.Helper()
	st, b, _ := h.do("GET", "/agent/shim", nil, nil)
	if st != 200 {
		h.t.Fatalf("GET /agent/shim: %d %s", st, b)
	}
	var out agent.ShimBundle
	if err := json.Unmarshal(b, &out); err != nil {
		h.t.Fatal(err)
	}
	return out
}

func TestShimInstallsAndTamperingIsRefused(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	b := h.shim()
	dir, digest, err := agent.InstallShim(t.TempDir(), b, h.srv.PublicKey())
	if err != nil {
		t.Fatalf("the agent refuses the shim: %v", err)
	}
	if digest != b.SHA256 || digest != h.poll(d, nil, 0)["shim_sha256"] {
		t.Errorf("digest %s, bundle %s", digest, b.SHA256)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "backends", "files", "local.py")); string(got) != "ROOT = \"local\"\n" {
		t.Errorf("local.py = %q", got)
	}
	if len(b.Files) != 4 {
		t.Errorf("shim files %v", b.Files)
	}

	// Changed without signing again: refused, and the announced digest stays.
	if err := h.srv.SetShimFile("executor_helpers.py", []byte("evil = 1\n"), false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := agent.InstallShim(t.TempDir(), h.shim(), h.srv.PublicKey()); !errors.Is(err, agent.ErrUnverified) {
		t.Errorf("tampered shim: %v", err)
	}
	if h.srv.ShimDigest() != digest {
		t.Error("an unsigned change moved the announced digest")
	}
	// Signed again (a server upgrade): accepted, new digest announced.
	if err := h.srv.SetShimFile("parallel_walk.py", []byte("X = 2\n"), true); err != nil {
		t.Fatal(err)
	}
	b2 := h.shim()
	_, digest2, err := agent.InstallShim(t.TempDir(), b2, h.srv.PublicKey())
	if err != nil || digest2 == digest || digest2 != h.poll(d, nil, 0)["shim_sha256"] || len(b2.Files) != 5 {
		t.Errorf("resigned shim: %v, %s vs %s", err, digest2, digest)
	}
	if err := h.srv.SetShimFile("../x.py", nil, true); err == nil {
		t.Error("unsafe shim path accepted")
	}
}

// testKey is the test key of §3.5.
func testKey(t *testing.T) ed25519.PrivateKey {
	seed, err := hex.DecodeString("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	if err != nil {
		t.Fatal(err)
	}
	return ed25519.NewKeyFromSeed(seed)
}

func TestRuntimeDescriptorVectorV4(t *testing.T) {
	const (
		name  = "cpython-3.12.13+20260623-x86_64-pc-windows-msvc-install_only.tar.gz"
		sum   = "22c27b021752596140145a93194d9cdf33b0b1b454f50fd1b430491eb3eb3cb9"
		canon = `{"archive_sha256":"` + sum + `","archive_size":25600,"filename":"` + name + `","version":1}`
		sig   = "bGnriNvpflq6k6vr28uxDE8dDfHsw_8EzD9d8LDcRern3i6uLWyoWfzLWRMXQNPEBo55ySVeA0AnHeDWOUAxAg"
	)
	env, err := RuntimeDescriptor(testKey(t), name, sum, 25600)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := wire.Canonical(env["descriptor"]); string(got) != canon {
		t.Errorf("canonical descriptor %s", got)
	}
	if env["sig"] != sig {
		t.Errorf("sig %s, want V4 %s", env["sig"], sig)
	}
	if err := wire.VerifyBytes(testKey(t).Public().(ed25519.PublicKey), []byte(canon), sig); err != nil {
		t.Error(err)
	}
}

func TestRuntimeEndpoints(t *testing.T) {
	dir := t.TempDir()
	const name = "cpython-3.12.13+20260623-x86_64-unknown-linux-gnu-install_only.tar.gz"
	data := make([]byte, 25600)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.RuntimeDir = dir })

	st, b, _ := h.do("GET", "/agent/runtime/descriptor/"+name, nil, nil)
	if st != 200 {
		t.Fatalf("descriptor: %d %s", st, b)
	}
	env := h.object(b)
	desc, _ := env["descriptor"].(map[string]any)
	sum := sha256.Sum256(data)
	if desc["version"] != json.Number("1") || desc["filename"] != name || desc["archive_sha256"] != hex.EncodeToString(sum[:]) || desc["archive_size"] != json.Number("25600") {
		t.Errorf("descriptor %v", desc)
	}
	if err := wire.VerifyCanonical(h.srv.PublicKey(), desc, env["sig"].(string)); err != nil {
		t.Errorf("descriptor signature: %v", err)
	}

	st, b, resp := h.do("GET", "/agent/runtime/"+name, nil, map[string]string{"Range": "bytes=100-199"})
	if st != 206 || resp.Header.Get("Content-Range") != "bytes 100-199/25600" || !bytes.Equal(b, data[100:200]) {
		t.Errorf("range: %d %q %d bytes", st, resp.Header.Get("Content-Range"), len(b))
	}
	st, _, resp = h.do("GET", "/agent/runtime/"+name, nil, map[string]string{"Range": "bytes=0-0"})
	if st != 206 || resp.Header.Get("Content-Range") != "bytes 0-0/25600" {
		t.Errorf("probe: %d %q", st, resp.Header.Get("Content-Range"))
	}
	if st, b, _ := h.do("GET", "/agent/runtime/"+name, nil, nil); st != 200 || !bytes.Equal(b, data) {
		t.Errorf("full GET: %d, %d bytes", st, len(b))
	}

	for path, want := range map[string]int{
		"/agent/runtime/absent.tar.gz":            404,
		"/agent/runtime/descriptor/absent.tar.gz": 404,
		"/agent/runtime/archive.zip":              400,
		"/agent/runtime/descriptor/a..b.tar.gz":   400,
		"/agent/runtime/descriptor/a%20b.tar.gz":  400,
	} {
		if st, b, _ := h.do("GET", path, nil, nil); st != want {
			t.Errorf("%s: %d %s, want %d", path, st, b, want)
		}
	}
	// No runtime directory: 404.
	h2 := newHarness(t)
	if st, _, _ := h2.do("GET", "/agent/runtime/descriptor/"+name, nil, nil); st != 404 {
		t.Errorf("no RuntimeDir: %d", st)
	}
}

func TestValidRuntimeName(t *testing.T) {
	cases := map[string]bool{
		"cpython-3.12+x.tar.gz": true, "a.tar.gz": true, "": false, ".tar.gz": true, "x.tgz": false,
		"a/b.tar.gz": false, `a\b.tar.gz`: false, "a..tar.gz": false, "a b.tar.gz": false,
		string(make([]byte, 241)): false,
	}
	for in, want := range cases {
		if got := ValidRuntimeName(in); got != want {
			t.Errorf("ValidRuntimeName(%q) = %v", in, got)
		}
	}
}

func TestHealth(t *testing.T) {
	h := newHarness(t)
	st, b, _ := h.do("GET", "/agent/health", nil, nil)
	if m := h.object(b); st != 200 || m["status"] != "ok" {
		t.Errorf("health: %d %s", st, b)
	}
}
