package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/wire"
)

// joinWorld is a reference server (its join sessions shaped as the
// real server's) on loopback, with the installers in its mirror unless
// bare.
type joinWorld struct {
	srv *refserver.Server
	url string
	// mirror is the client mirror's folder ("" when bare).
	mirror string
}

func newJoinWorld(t *testing.T, bare bool) *joinWorld {
	t.Helper()
	jw := &joinWorld{}
	cfg := refserver.Config{}
	if !bare {
		jw.mirror = t.TempDir()
		if _, err := refserver.WriteInstallers(jw.mirror); err != nil {
			t.Fatal(err)
		}
		cfg.Mirror = jw.mirror
	}
	srv, err := refserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	jw.srv, jw.url = srv, hs.URL
	return jw
}

// join makes a join session for a device called laptop.
func (jw *joinWorld) join(t *testing.T) refserver.JoinInfo {
	t.Helper()
	j, err := jw.srv.NewJoin("laptop", "auto", 0)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// Pairing from a join link: the session is registered with this
// device, paired with the server the installer names, and the
// fingerprint printed is the one the server recorded, in four groups
// of four. (test/e2e watches each state on the way.)
func TestPairJoinLink(t *testing.T) {
	jw := newJoinWorld(t, false)
	j := jw.join(t)
	std, e, out, errb := identityStd(t, false)
	if code := runPair(std, []string{j.Link(jw.url)}); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb)
	}
	if s, _ := jw.srv.JoinState(j.ID); s != refserver.JoinRegistered {
		t.Errorf("the join session is %s, want registered", s)
	}
	st, err := pairing.LoadState(e.lay)
	if err != nil || !st.Paired() || *st.ServerURL != jw.url {
		t.Fatalf("state %+v, %v: want paired with %s", st, err, jw.url)
	}
	key, err := pairing.LoadKey(e.lay)
	if err != nil {
		t.Fatal(err)
	}
	fp := wire.ServerFingerprint(key.Public().(ed25519.PublicKey))
	d, ok := jw.srv.Device(*st.DeviceID)
	if !ok || fp != *st.Fingerprint || fp != d.Fingerprint {
		t.Fatalf("fingerprints: key %s, state %s, server %s", fp, *st.Fingerprint, d.Fingerprint)
	}
	m := regexp.MustCompile(`(?m)^fingerprint: ([0-9a-f]{4}) ([0-9a-f]{4}) ([0-9a-f]{4}) ([0-9a-f]{4}) \(.*"fingerprint" column of the server's Devices page, /admin/devices`).FindStringSubmatch(out.String())
	if m == nil || strings.Join(m[1:], "") != fp[:16] {
		t.Errorf("stdout %q: want the first 16 digits of %s in four groups", out, fp)
	}
	if !strings.Contains(out.String(), "to start the agent: `metnos-agent install`") {
		t.Errorf("stdout %q does not say how to start the agent", out)
	}
	if errb.Len() != 0 {
		t.Errorf("stderr %q", errb)
	}

	// The same link again, from the same device: it paired this very
	// device, nothing to do.
	if code := runPair(std, []string{j.Link(jw.url)}); code != exitOK || !strings.Contains(errb.String(), "note: this link already paired this device (device "+*st.DeviceID+"): nothing to register") {
		t.Errorf("again: exit %d, %s", code, errb)
	}

	// Unpaired (the key stays), the same link cannot pair it again: its
	// token is spent.
	if err := os.Remove(e.lay.State()); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := runPair(std, []string{j.Link(jw.url)}); code != exitFailure || !strings.Contains(errb.String(), "this link already paired this device's key as device "+*st.DeviceID+", which this device is no longer paired as: ask for a new link") {
		t.Errorf("unpaired, again: exit %d, %s", code, errb)
	}
	if _, err := os.Stat(e.lay.State()); !os.IsNotExist(err) {
		t.Errorf("state.json is back: %v", err)
	}

	// Another device (another HOME) with the same link: refused, naming
	// the device it paired, before anything is written.
	std2, e2, _, errb2 := identityStd(t, false)
	if code := runPair(std2, []string{j.Link(jw.url)}); code != exitFailure {
		t.Fatalf("second device: exit %d", code)
	}
	if want := "metnos-agent: this link was already used to pair another device (laptop): ask for a new link\n"; errb2.String() != want {
		t.Errorf("second device: %q, want %q", errb2, want)
	}
	if _, err := os.Stat(e2.lay.Data); !os.IsNotExist(err) {
		t.Errorf("the refused device got %s: %v", e2.lay.Data, err)
	}
	if n := len(jw.srv.Devices()); n != 1 {
		t.Errorf("the server has %d devices, want 1", n)
	}
}

// The link reaches the server through a proxy that passes another Host
// (the server bakes the Host header it was reached by into the
// installer): a note says so, and the device pairs with the
// installer's URL.
func TestPairJoinLinkOtherHost(t *testing.T) {
	jw := newJoinWorld(t, false)
	j := jw.join(t)
	target, _ := url.Parse(jw.url)
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }})
	defer proxy.Close()
	std, e, _, errb := identityStd(t, false)
	if code := runPair(std, []string{j.Link(proxy.URL)}); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb)
	}
	if st, _ := pairing.LoadState(e.lay); *st.ServerURL != jw.url {
		t.Errorf("paired with %s, want %s", *st.ServerURL, jw.url)
	}
	if want := "note: the server's installer names it " + jw.url + ", not " + strings.TrimPrefix(proxy.URL, "http://") + " as the link does: pairing with " + jw.url + "\n"; errb.String() != want {
		t.Errorf("stderr %q, want %q", errb, want)
	}
}

// A token used by another device: the one-liner's 409 says so, for a link.
func TestPairTokenAlreadyUsed(t *testing.T) {
	jw := newJoinWorld(t, true)
	tok, err := jw.srv.IssueToken("laptop", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	oneLiner := "curl -fsSL " + jw.url + "/agent/client/install.sh | \\\n  METNOS_SERVER=" + jw.url + " \\\n  METNOS_TOKEN=" + tok + " sh"
	std, _, out, errb := identityStd(t, false)
	if code := runPair(std, []string{oneLiner}); code != exitOK {
		t.Fatalf("first: exit %d: %s", code, errb)
	}
	if !strings.Contains(out.String(), "paired as \"laptop\"") {
		t.Errorf("stdout %q", out)
	}
	std2, _, _, errb2 := identityStd(t, false)
	if code := runPair(std2, []string{oneLiner}); code != exitFailure {
		t.Fatalf("second: exit %d", code)
	}
	if want := "metnos-agent: this link's token was already used by another device: ask for a new link\n"; errb2.String() != want {
		t.Errorf("second: %q, want %q", errb2, want)
	}
}

// A server without an installer in its mirror: one sentence, asking
// for a token instead; nothing written.
func TestPairJoinNoInstaller(t *testing.T) {
	jw := newJoinWorld(t, true)
	j := jw.join(t)
	std, e, _, errb := identityStd(t, false)
	if code := runPair(std, []string{j.Link(jw.url)}); code != exitFailure {
		t.Fatalf("exit %d", code)
	}
	if want := "metnos-agent: the server has no installer in its mirror, so its join links cannot pair a device: ask the admin for a token instead (Devices page, manual token) and run metnos-agent register\n"; errb.String() != want {
		t.Errorf("%q, want %q", errb, want)
	}
	if _, err := os.Stat(e.lay.Data); !os.IsNotExist(err) {
		t.Errorf("a failed pair left %s: %v", e.lay.Data, err)
	}
}

// The Windows installer, a .cmd, carries the same two values as the
// shell one; a server that cannot pin the Rust client's Windows build
// (503 pin_unavailable) is asked for the shell one instead.
func TestJoinInstallerWindows(t *testing.T) {
	jw := newJoinWorld(t, false)
	j := jw.join(t)
	c := client.New(jw.url, nil, "", nil)
	ctx := context.Background()
	b, err := c.JoinInstaller(ctx, j.Link(jw.url), "windows")
	if err != nil || !bytes.HasPrefix(b, []byte("#!")) {
		t.Fatalf("without a Windows client in the mirror: %.40q, %v; want the shell installer", b, err)
	}
	server, token, err := pairing.ParseInstaller(b)
	if err != nil || server != jw.url || token != j.Token {
		t.Fatalf("shell installer: %q %q %v", server, token, err)
	}
	if _, err := refserver.Publish(jw.mirror, "1.2.3", refserver.WindowsClientTarget, refserver.RustClientComponent, strings.NewReader("MZ a windows client")); err != nil {
		t.Fatal(err)
	}
	b, err = c.JoinInstaller(ctx, j.Link(jw.url), "windows")
	if err != nil || !bytes.HasPrefix(b, []byte("@echo off\r\n")) {
		t.Fatalf("with a Windows client in the mirror: %.40q, %v; want the .cmd", b, err)
	}
	server, token, err = pairing.ParseInstaller(b)
	if err != nil || server != jw.url || token != j.Token {
		t.Fatalf(".cmd installer: %q %q %v", server, token, err)
	}
}

// A link to a web server that is not Metnos: one sentence saying so.
func TestPairNotMetnos(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
		want string
	}{
		{"html 200", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<!DOCTYPE html><html><body>my blog</body></html>"))
		}, `/status does not answer as a Metnos server (it answered with an HTML page)`},
		{"404 text", http.NotFound, `/status does not answer as a Metnos server (it answered 404 Not Found: 404 page not found)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := httptest.NewServer(tc.h)
			defer hs.Close()
			std, e, _, errb := identityStd(t, false)
			if code := runPair(std, []string{hs.URL + wire.PathJoin + "0123456789abcdef"}); code != exitFailure {
				t.Fatalf("exit %d", code)
			}
			want := "metnos-agent: " + hs.URL + wire.PathJoin + "0123456789abcdef" + tc.want + "\n"
			if errb.String() != want {
				t.Errorf("%q, want %q", errb, want)
			}
			if _, err := os.Stat(e.lay.Data); !os.IsNotExist(err) {
				t.Errorf("left %s: %v", e.lay.Data, err)
			}
		})
	}
}

// --install runs install's own code once paired: here the test binary
// is a temporary build, which install refuses as it does a `go run`
// binary, after the pairing was written.
func TestPairInstallRunsInstall(t *testing.T) {
	if exe, err := os.Executable(); err != nil || !strings.Contains(filepath.ToSlash(exe), "/go-build") {
		// Built elsewhere (go test -c), install would really install.
		t.Skipf("the test binary %s is not a temporary build of go test: install would install it as this user's service", exe)
	}
	jw := newJoinWorld(t, false)
	j := jw.join(t)
	std, e, out, errb := identityStd(t, false)
	code := runPair(std, []string{"--install", j.Link(jw.url)})
	if st, _ := pairing.LoadState(e.lay); !st.Paired() {
		t.Fatalf("not paired: exit %d, %s", code, errb)
	}
	if !strings.Contains(out.String(), "paired as") || strings.Contains(out.String(), "to start the agent") {
		t.Errorf("stdout %q", out)
	}
	if code != exitFailure || !strings.Contains(errb.String(), "a temporary build of `go run`, which the service could not start later") {
		t.Errorf("exit %d, stderr %q: want install's refusal of a temporary binary", code, errb)
	}
}
