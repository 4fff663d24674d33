package refserver

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/metnos/agent/wire"
)

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

func TestHealth(t *testing.T) {
	h := newHarness(t)
	st, b, _ := h.do("GET", "/agent/health", nil, nil)
	if m := h.object(b); st != 200 || m["status"] != "ok" {
		t.Errorf("health: %d %s", st, b)
	}
}
