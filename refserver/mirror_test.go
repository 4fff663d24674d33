package refserver

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/wire"
)

// mirrorHarness is a harness serving a fresh mirror directory.
func mirrorHarness(t *testing.T) (*harness, string) {
	t.Helper()
	dir := t.TempDir()
	return newHarness(t, func(c *Config) { c.Mirror = dir }), dir
}

func publish(t *testing.T, dir, version, target, component string, data []byte) Entry {
	t.Helper()
	e, err := Publish(dir, version, target, component, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestComponentDescriptorAndDownload(t *testing.T) {
	h, dir := mirrorHarness(t)
	build := bytes.Repeat([]byte("new metnos-agent build "), 100)
	publish(t, dir, "1.4.0", "linux-amd64", wire.AgentComponent, build)
	publish(t, dir, "1.4.0", "windows-amd64", wire.AgentComponent, []byte("windows build"))

	st, body, _ := h.do("GET", "/agent/component/metnos-agent/update/linux-amd64", nil, nil)
	if st != 200 {
		t.Fatalf("descriptor: %d %s", st, body)
	}
	d, err := wire.VerifyComponentDescriptor(body, h.srv.PublicKey(), wire.AgentComponent, "linux-amd64")
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != "1.4.0" || d.SHA256 != sha(build) || d.URLPath != "/agent/client/1.4.0/linux-amd64/metnos-agent" {
		t.Errorf("descriptor %+v", d)
	}
	// Another server's key does not verify it, and it cannot pass for
	// the other target.
	if _, err := wire.VerifyComponentDescriptor(body, newKey(t).Public().(ed25519.PublicKey), wire.AgentComponent, "linux-amd64"); err == nil {
		t.Error("descriptor verified with a foreign key")
	}
	if _, err := wire.VerifyComponentDescriptor(body, h.srv.PublicKey(), wire.AgentComponent, "windows-amd64"); err == nil {
		t.Error("the linux descriptor passed for windows")
	}
	_, wbody, _ := h.do("GET", "/agent/component/metnos-agent/update/windows-amd64", nil, nil)
	if wd, err := wire.VerifyComponentDescriptor(wbody, h.srv.PublicKey(), wire.AgentComponent, "windows-amd64"); err != nil || !strings.HasSuffix(wd.URLPath, "/metnos-agent.exe") {
		t.Errorf("windows descriptor %+v %v", wd, err)
	}

	st, got, _ := h.do("GET", d.URLPath, nil, nil)
	if st != 200 || !bytes.Equal(got, build) {
		t.Fatalf("download: %d, %d bytes, equal=%v", st, len(got), bytes.Equal(got, build))
	}
	// A download cut after 100 bytes resumes with Range.
	st, rest, resp := h.do("GET", d.URLPath, nil, map[string]string{"Range": "bytes=100-"})
	if st != 206 || !bytes.Equal(rest, build[100:]) || resp.Header.Get("Content-Range") != "bytes 100-2299/2300" {
		t.Errorf("range: %d %q, %d bytes", st, resp.Header.Get("Content-Range"), len(rest))
	}
}

func TestDescriptorErrors(t *testing.T) {
	h, dir := mirrorHarness(t)
	bare := newHarness(t) // no mirror at all
	writeManifest := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, ManifestName), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name     string
		h        *harness
		manifest string // "" leaves the mirror as it is
		path     string
		status   int
		code     string
	}{
		{"no mirror configured", bare, "", "/agent/component/metnos-agent/update/linux-amd64", 404, "no_manifest"},
		{"mirror without manifest", h, "", "/agent/component/metnos-agent/update/linux-amd64", 404, "no_manifest"},
		{"legacy route without manifest", h, "", "/agent/client/update/x86_64-unknown-linux-musl", 404, "no_manifest"},
		{"bad component", h, "", "/agent/component/Metnos-agent/update/linux-amd64", 400, "bad_component"},
		{"component starting with a digit", h, "", "/agent/component/9agent/update/linux-amd64", 400, "bad_component"},
		{"bad target", h, "", "/agent/component/metnos-agent/update/Linux-amd64", 400, "bad_target"},
		{"legacy bad target", h, "", "/agent/client/update/x86.64", 400, "bad_target"},
		{"unreadable manifest", h, "{not json", "/agent/component/metnos-agent/update/linux-amd64", 500, "bad_manifest"},
		{"manifest not an object", h, "[1]", "/agent/component/metnos-agent/update/linux-amd64", 500, "bad_manifest"},
		{"versions not an object", h, `{"latest":"1.0","versions":[1]}`, "/agent/component/metnos-agent/update/linux-amd64", 500, "bad_manifest"},
		{"no latest", h, `{"versions":{"1.0":{"linux-amd64":{"metnos-agent":{"sha256":"ab","path":"p"}}}}}`, "/agent/component/metnos-agent/update/linux-amd64", 404, "no_binary"},
		{"latest without the target", h, `{"latest":"2.0","versions":{"1.0":{"linux-amd64":{"metnos-agent":{"sha256":"ab","path":"p"}}}}}`, "/agent/component/metnos-agent/update/linux-amd64", 404, "no_binary"},
		{"target without the component", h, `{"latest":"1.0","versions":{"1.0":{"linux-amd64":{"client":{"sha256":"ab","path":"p"}}}}}`, "/agent/component/metnos-agent/update/linux-amd64", 404, "no_binary"},
		{"legacy fields serve only the client", h, `{"latest":"1.0","versions":{"1.0":{"linux-amd64":{"sha256":"ab","path":"p"}}}}`, "/agent/component/metnos-agent/update/linux-amd64", 404, "no_binary"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.manifest != "" {
				writeManifest(c.manifest)
			}
			st, body, _ := c.h.do("GET", c.path, nil, nil)
			m := c.h.object(body)
			if st != c.status || m["error"] != c.code || m["message"] == "" {
				t.Errorf("got %d %s, want %d %s", st, body, c.status, c.code)
			}
		})
	}
}

func TestLegacyClientDescriptor(t *testing.T) {
	h, dir := mirrorHarness(t)
	build := []byte("rust client")
	e := publish(t, dir, "0.3.1", "x86_64-unknown-linux-musl", RustClientComponent, build)
	if e.Filename != "metnos-client" || e.Path != "0.3.1/x86_64-unknown-linux-musl/metnos-client" {
		t.Errorf("entry %+v", e)
	}
	check := func(body []byte, wantURL string) {
		t.Helper()
		m := h.object(body)
		if len(m) != 5 || m["version"] != "0.3.1" || m["target"] != "x86_64-unknown-linux-musl" || m["sha256"] != sha(build) || m["url_path"] != wantURL {
			t.Errorf("legacy descriptor %s", body)
		}
		signed := map[string]any{"sha256": m["sha256"], "target": m["target"], "version": m["version"]}
		sig, _ := m["sig"].(string)
		if err := wire.VerifyCanonical(h.srv.PublicKey(), signed, sig); err != nil {
			t.Errorf("legacy signature: %v", err)
		}
		// The legacy signature does not cover a component: it must not
		// verify as a component descriptor.
		if _, err := wire.VerifyComponentDescriptor(body, h.srv.PublicKey(), RustClientComponent, "x86_64-unknown-linux-musl"); err == nil {
			t.Error("a legacy descriptor verified as a component descriptor")
		}
	}
	st, body, _ := h.do("GET", "/agent/client/update/x86_64-unknown-linux-musl", nil, nil)
	if st != 200 {
		t.Fatalf("%d %s", st, body)
	}
	check(body, "/agent/client/0.3.1/x86_64-unknown-linux-musl/metnos-client")

	// A mirror of before the helper kept the client's fields under the
	// target itself.
	os.WriteFile(filepath.Join(dir, ManifestName), []byte(`{"latest":"0.3.1","versions":{"0.3.1":{"x86_64-unknown-linux-musl":{"sha256":"`+sha(build)+`","path":"old/metnos-client"}}}}`), 0o644)
	_, body, _ = h.do("GET", "/agent/client/update/x86_64-unknown-linux-musl", nil, nil)
	check(body, "/agent/client/old/metnos-client")
}

func TestMirrorFiles(t *testing.T) {
	h, dir := mirrorHarness(t)
	publish(t, dir, "1.0.0", "linux-arm64", wire.AgentComponent, []byte("arm build"))
	if _, err := WriteInstallers(dir); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, want string
		status     int
		cache      string
	}{
		{"/agent/client/1.0.0/linux-arm64/metnos-agent", "arm build", 200, immutable},
		{"/agent/client/install.sh", InstallSh, 200, immutable},
		{"/agent/client/install.ps1", InstallPs1, 200, immutable},
		{"/agent/client/manifest.json", "", 200, "no-store"},
		{"/agent/client/1.0.0/linux-arm64/metnos-helper", "", 404, ""},
		{"/agent/client/nothing.sh", "", 404, ""},
		{"/agent/client/1.0.0/linux-arm64/a%20b", "", 400, ""},
		{"/agent/client/1.0.0/..linux-arm64/metnos-agent", "", 400, ""},
		{"/agent/client/1.0.0/linux-arm64/..%2f..%2fmanifest.json", "", 400, ""},
		{"/agent/client/1.0.0", "", 404, ""}, // a directory
	} {
		st, body, resp := h.do("GET", c.path, nil, nil)
		if st != c.status || (c.want != "" && string(body) != c.want) || (c.cache != "" && resp.Header.Get("Cache-Control") != c.cache) {
			t.Errorf("%s: %d %q (Cache-Control %q)", c.path, st, body, resp.Header.Get("Cache-Control"))
		}
	}
	_, body, _ := h.do("GET", "/agent/client/manifest.json", nil, nil)
	if m := h.object(body); m["latest"] != "1.0.0" {
		t.Errorf("served manifest: %s", body)
	}
}

func TestPollServerClientVersion(t *testing.T) {
	h, dir := mirrorHarness(t)
	d := h.pair("laptop")
	if m := h.poll(d, nil, 0); m["server_client_version"] != nil {
		t.Errorf("without manifest: %v", m["server_client_version"])
	}
	publish(t, dir, "1.0.0", "linux-amd64", wire.AgentComponent, []byte("a"))
	if m := h.poll(d, nil, 0); m["server_client_version"] != "1.0.0" {
		t.Errorf("after publishing 1.0.0: %v", m["server_client_version"])
	}
	publish(t, dir, "1.10.0", "linux-amd64", wire.AgentComponent, []byte("b"))
	if m := h.poll(d, nil, 0); m["server_client_version"] != "1.10.0" {
		t.Errorf("after publishing 1.10.0: %v", m["server_client_version"])
	}
	os.WriteFile(filepath.Join(dir, ManifestName), []byte("garbage"), 0o644)
	if m := h.poll(d, nil, 0); m["server_client_version"] != nil {
		t.Errorf("unreadable manifest: %v", m["server_client_version"])
	}
}
