package refserver

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

// newJoin creates a join session through the admin API.
func (h *harness) newJoin(body map[string]any) map[string]any {
	h.t.Helper()
	st, m := h.admin("POST", "/admin/devices/join", body)
	if st != 200 {
		h.t.Fatalf("join: %d %v", st, m)
	}
	return m
}

func (h *harness) joinStatus(id string) map[string]any {
	h.t.Helper()
	st, body, _ := h.do("GET", wire.PathJoin+id+"/status", nil, nil)
	if st != 200 {
		h.t.Fatalf("status: %d %s", st, body)
	}
	return h.object(body)
}

func (h *harness) heartbeat(d testDevice) {
	h.t.Helper()
	body, _ := json.Marshal(map[string]any{"device_id": d.id, "profile": map[string]any{}})
	if st, m := h.signed("/agent/heartbeat", d.key, body); st != 200 {
		h.t.Fatalf("heartbeat: %d %v", st, m)
	}
}

func TestJoinStates(t *testing.T) {
	h, dir := mirrorHarness(t)
	if _, err := WriteInstallers(dir); err != nil {
		t.Fatal(err)
	}
	before := h.clock.Now().Unix()
	m := h.newJoin(map[string]any{"name": "family-laptop", "platform": "linux"})
	id, _ := m["join_id"].(string)
	tok, _ := m["token"].(string)
	exp, _ := m["expires_at"].(json.Number).Int64()
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) || m["join_url"] != h.url+"/agent/client/join/"+id ||
		m["state"] != "created" || m["device_name"] != "family-laptop" || m["platform"] != "linux" ||
		!strings.HasPrefix(tok, TokenPrefix) || exp < before+1800 || exp > h.clock.Now().Unix()+1800 {
		t.Fatalf("admin join: %v", m)
	}
	state := func(want string) {
		t.Helper()
		s := h.joinStatus(id)
		if s["state"] != want {
			t.Fatalf("state %v, want %s (%v)", s["state"], want, s)
		}
		if got, ok := h.srv.JoinState(id); !ok || got != want {
			t.Fatalf("JoinState %q %v, want %s", got, ok, want)
		}
	}
	page := func() {
		t.Helper()
		st, body, resp := h.do("GET", wire.PathJoin+id, nil, map[string]string{"User-Agent": "Mozilla/5.0 (X11; Linux x86_64)"})
		if st != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !bytes.Contains(body, []byte("family-laptop")) {
			t.Fatalf("page: %d %s", st, body)
		}
	}
	installer := func() {
		t.Helper()
		if st, body, _ := h.do("GET", wire.PathJoin+id+"/installer?platform=linux", nil, nil); st != 200 {
			t.Fatalf("installer: %d %s", st, body)
		}
	}

	state("created")
	page()
	state("opened")
	if j, _ := h.srv.Join(id); j.ClientHint["ip"] != "127.0.0.1" || !strings.Contains(j.ClientHint["user_agent"], "Linux") {
		t.Errorf("client hint %v", j.ClientHint)
	}
	installer()
	state("downloaded")
	page() // a second visit does not go back
	state("downloaded")

	k := newKey(t)
	st, reg := h.register(tok, k)
	if st != 200 {
		t.Fatalf("register: %d %v", st, reg)
	}
	d := testDevice{key: k, id: reg["device_id"].(string)}
	state("registered")
	s := h.joinStatus(id)
	dev, _ := s["device"].(map[string]any)
	if dev["id"] != d.id || dev["name"] != "family-laptop" || dev["fingerprint"] != reg["fingerprint"] || dev["os_family"] != "linux" || dev["last_heartbeat"] != nil {
		t.Errorf("status device: %v", s)
	}
	// Polling is not a heartbeat for the join session (as on the real server).
	h.poll(d, nil, 0)
	state("registered")
	h.heartbeat(d)
	state("heartbeat")
	if dev, _ := h.joinStatus(id)["device"].(map[string]any); dev["last_heartbeat"] == nil {
		t.Error("status device has no last_heartbeat after one")
	}
	// The token was used: a second device cannot register with it.
	if st, m := h.register(tok, newKey(t)); st != 409 || m["error"] != wire.CodeTokenAlreadyUsed {
		t.Errorf("second register with the join token: %d %v", st, m)
	}
	page()
	installer()
	h.clock.Advance(time.Hour) // a finished session never expires
	state("heartbeat")
}

func TestJoinExpired(t *testing.T) {
	h, dir := mirrorHarness(t)
	WriteInstallers(dir)
	j, err := h.srv.NewJoin("pc", "auto", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	h.do("GET", wire.PathJoin+j.ID, nil, nil)
	h.clock.Advance(61 * time.Second)
	if s := h.joinStatus(j.ID); s["state"] != "expired" {
		t.Errorf("status after the TTL: %v", s)
	}
	st, body, _ := h.do("GET", wire.PathJoin+j.ID+"/installer?platform=linux", nil, nil)
	if m := h.object(body); st != 410 || m["error"] != "expired" {
		t.Errorf("installer after the TTL: %d %s", st, body)
	}
	if st, body, _ := h.do("GET", wire.PathJoin+j.ID, nil, nil); st != 200 || !bytes.Contains(body, []byte("expired")) {
		t.Errorf("page after the TTL: %d %s", st, body)
	}
	if s, _ := h.srv.JoinState(j.ID); s != "expired" {
		t.Errorf("state after visiting the page: %s", s)
	}
	if st, _ := h.register(j.Token, newKey(t)); st != 400 {
		t.Errorf("register with the expired token: %d", st)
	}
}

func TestJoinUnknown(t *testing.T) {
	h, _ := mirrorHarness(t)
	for _, id := range []string{"0123456789abcdef", "XYZ", "0123456"} {
		st, body, resp := h.do("GET", wire.PathJoin+id, nil, nil)
		if st != 404 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("page %s: %d %s", id, st, body)
		}
		for _, sub := range []string{"/status", "/installer?platform=linux"} {
			st, body, _ := h.do("GET", wire.PathJoin+id+sub, nil, nil)
			if m := h.object(body); st != 404 || m["error"] != "unknown_join" {
				t.Errorf("%s%s: %d %s", id, sub, st, body)
			}
		}
	}
	if _, ok := h.srv.JoinState("0123456789abcdef"); ok {
		t.Error("JoinState knows an unknown id")
	}
}

func TestAdminJoinRefuses(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct {
		body map[string]any
		code string
	}{
		{map[string]any{"name": ""}, "invalid_name"},
		{map[string]any{"name": "my pc"}, "invalid_name"},
		{map[string]any{"name": "pc", "platform": "mac"}, "token_error"},
		{map[string]any{"name": "a/b"}, "token_error"},
		{map[string]any{"name": "pc", "ttl_s": "long"}, wire.CodeMissingField},
	} {
		if st, m := h.admin("POST", "/admin/devices/join", c.body); st != 400 || m["error"] != c.code {
			t.Errorf("%v: %d %v", c.body, st, m)
		}
	}
}

// shValue evaluates the shell assignments of a prelude and prints one
// variable: the prelude must parse back to what the server baked in.
func shValue(t *testing.T, prelude, name string) string {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to evaluate the prelude with")
	}
	out, err := exec.Command("sh", "-c", prelude+`printf %s "$`+name+`"`).Output()
	if err != nil {
		t.Fatalf("sh: %v", err)
	}
	return string(out)
}

func TestJoinInstallerLinux(t *testing.T) {
	h, dir := mirrorHarness(t)
	j, _ := h.srv.NewJoin("pc", "linux", 0)
	path := wire.PathJoin + j.ID + "/installer"
	if st, body, _ := h.do("GET", path, nil, nil); st != 503 || h.object(body)["error"] != "installer_missing" {
		t.Errorf("without install.sh: %d %s", st, body)
	}
	if s, _ := h.srv.JoinState(j.ID); s != "created" {
		t.Errorf("a refused download moved the state to %s", s)
	}
	WriteInstallers(dir)
	for _, host := range []string{"", "127.0.0.1:1'$(id);y'"} {
		hdr := map[string]string{}
		if host != "" {
			hdr["Host"] = host
		}
		st, body, resp := h.do("GET", path, nil, hdr)
		if st != 200 || resp.Header.Get("Content-Disposition") != `attachment; filename="metnos-client-install.sh"` ||
			resp.Header.Get("Content-Type") != "text/x-shellscript; charset=utf-8" {
			t.Fatalf("installer: %d %v %s", st, resp.Header, body)
		}
		lines := strings.SplitN(string(body), "\n", 4)
		if len(lines) != 4 || lines[0] != "#!/bin/sh" || "#!/bin/sh\n"+lines[3] != InstallSh ||
			!strings.HasPrefix(lines[1], "METNOS_SERVER=") || !strings.HasSuffix(lines[1], "; export METNOS_SERVER") ||
			!strings.HasPrefix(lines[2], "METNOS_TOKEN=") || !strings.HasSuffix(lines[2], "; export METNOS_TOKEN") {
			t.Fatalf("installer shape:\n%s", body)
		}
		want := "http://" + strings.TrimPrefix(h.url, "http://")
		if host != "" {
			want = "http://" + host
		}
		prelude := lines[1] + "\n" + lines[2] + "\n"
		if got := shValue(t, prelude, "METNOS_SERVER"); got != want {
			t.Errorf("METNOS_SERVER parses back as %q, want %q", got, want)
		}
		if got := shValue(t, prelude, "METNOS_TOKEN"); got != j.Token {
			t.Errorf("METNOS_TOKEN parses back as %q", got)
		}
	}
	if s, _ := h.srv.JoinState(j.ID); s != "downloaded" {
		t.Errorf("state %s", s)
	}
	// An install.sh without a shebang gets the prelude first.
	os.WriteFile(filepath.Join(dir, "install.sh"), []byte("echo hi\n"), 0o644)
	if _, body, _ := h.do("GET", path, nil, nil); !strings.HasPrefix(string(body), "METNOS_SERVER='") || !strings.HasSuffix(string(body), "; export METNOS_TOKEN\necho hi\n") {
		t.Errorf("without shebang:\n%s", body)
	}
	if st, body, _ := h.do("GET", path+"?platform=mac", nil, nil); st != 400 || h.object(body)["error"] != "invalid_platform" {
		t.Errorf("platform mac: %d %s", st, body)
	}
	bare := newHarness(t)
	bj, _ := bare.srv.NewJoin("pc", "linux", 0)
	if st, body, _ := bare.do("GET", wire.PathJoin+bj.ID+"/installer", nil, nil); st != 503 || bare.object(body)["error"] != "installer_missing" {
		t.Errorf("no mirror: %d %s", st, body)
	}
}

func TestJoinInstallerWindows(t *testing.T) {
	rt := t.TempDir()
	dir := t.TempDir()
	h := newHarness(t, func(c *Config) { c.Mirror, c.RuntimeDir = dir, rt })
	WriteInstallers(dir)
	j, _ := h.srv.NewJoin("pc", "auto", 0)
	path := wire.PathJoin + j.ID + "/installer"
	winUA := map[string]string{"User-Agent": "Mozilla/5.0 (Windows NT 10.0; Win64; x64)"}
	// Without the Rust client's Windows build the installer cannot be
	// pinned: 503, and the state does not move.
	if st, body, _ := h.do("GET", path, nil, winUA); st != 503 || h.object(body)["error"] != "pin_unavailable" {
		t.Errorf("without a client pin: %d %s", st, body)
	}
	if s, _ := h.srv.JoinState(j.ID); s != "created" {
		t.Errorf("state %s", s)
	}
	client := []byte("rust windows client")
	publish(t, dir, "0.4.0", WindowsClientTarget, RustClientComponent, client)
	runtime := []byte("python")
	os.WriteFile(filepath.Join(rt, "cpython-3.12.1-x86_64-pc-windows-msvc-install_only.tar.gz"), runtime, 0o644)

	st, body, resp := h.do("GET", path, nil, winUA) // platform auto + a Windows browser
	if st != 200 || resp.Header.Get("Content-Disposition") != `attachment; filename="MetnosClientSetup.cmd"` || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("windows installer: %d %v %s", st, resp.Header, body)
	}
	head, tail, ok := strings.Cut(string(body), "\r\n"+CmdMarker+"\r\n")
	if !ok || tail != InstallPs1 {
		t.Fatalf("no marker, or install.ps1 not intact after it:\n%s", body)
	}
	lines := strings.Split(head, "\r\n")
	var sets []string
	for _, l := range lines {
		if strings.ContainsAny(l, "\r\n") || strings.IndexFunc(l, func(r rune) bool { return r > 127 }) >= 0 {
			t.Errorf("head line not ASCII/CRLF: %q", l)
		}
		if strings.HasPrefix(l, `set "METNOS_`) {
			sets = append(sets, l)
		}
	}
	want := []string{
		`set "METNOS_SERVER=` + h.url + `"`,
		`set "METNOS_TOKEN=` + j.Token + `"`,
		`set "METNOS_CLIENT_VERSION=0.4.0"`,
		`set "METNOS_CLIENT_SHA256=` + sha(client) + `"`,
		`set "METNOS_PYTHON_RUNTIME_WIN=cpython-3.12.1-x86_64-pc-windows-msvc-install_only.tar.gz"`,
		`set "METNOS_PYTHON_RUNTIME_WIN_SHA256=` + sha(runtime) + `"`,
		`set "METNOS_SELF=%~f0"`,
	}
	if strings.Join(sets, "\n") != strings.Join(want, "\n") || lines[0] != "@echo off" {
		t.Errorf("set lines:\n%s\nwant:\n%s", strings.Join(sets, "\n"), strings.Join(want, "\n"))
	}
	if strings.Count(string(body), CmdMarker) != 1 {
		t.Error("the marker appears whole more than once: the head must split it")
	}
	if s, _ := h.srv.JoinState(j.ID); s != "downloaded" {
		t.Errorf("state %s", s)
	}
	// A value outside the batch-safe charset is never baked in.
	if st, body, _ := h.do("GET", path+"?platform=windows", nil, map[string]string{"Host": "127.0.0.1:1'x"}); st != 503 || h.object(body)["error"] != "unsafe_value" {
		t.Errorf("unsafe host: %d %s", st, body)
	}
}

// The join route of the admin API answers loopback clients only, as
// the rest of it.
func TestAdminJoinLoopbackOnly(t *testing.T) {
	h := newHarness(t)
	req, _ := http.NewRequest("POST", "/admin/devices/join", strings.NewReader(`{"name":"pc"}`))
	req.RemoteAddr = "192.0.2.1:5555"
	rec := &recorder{h: http.Header{}}
	h.srv.AdminHandler().ServeHTTP(rec, req)
	if rec.code != 403 {
		t.Errorf("non-loopback admin join: %d", rec.code)
	}
}

type recorder struct {
	h    http.Header
	code int
}

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) WriteHeader(c int)           { r.code = c }
