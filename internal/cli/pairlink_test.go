package cli

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/wire"
)

// joinFront serves one join session in front of a reference server,
// shaped as the real server's (runtime/agent_server.py: status JSON,
// HTML page, the shell installer with _sh_squote'd values baked from
// the Host header), advancing created → opened → downloaded, and
// registered when the reference server pairs a device with its token.
type joinFront struct {
	srv   *refserver.Server
	token string
	// installerMissing makes the installer answer the real 503.
	installerMissing bool
	// bakeHost, when set, is baked instead of the Host header (as a
	// server reached through a proxy would).
	bakeHost string

	mu     sync.Mutex
	states []string
	device map[string]any
}

const testJoinID = "0123456789abcdef"

func (j *joinFront) state() string { return j.states[len(j.states)-1] }

func (j *joinFront) advance(s string) {
	order := strings.Join(joinStates, " ")
	if strings.Index(order, s) > strings.Index(order, j.state()) {
		j.states = append(j.states, s)
	}
}

var joinStates = []string{"created", "opened", "downloaded", "registered", "heartbeat"}

func (j *joinFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	j.mu.Lock()
	defer j.mu.Unlock()
	link := wire.PathJoin + testJoinID
	switch r.URL.Path {
	case link + "/status":
		out := map[string]any{"join_id": testJoinID, "state": j.state(), "device_name": "laptop", "platform": "auto", "expires_at": 1}
		if j.device != nil {
			out["device"] = j.device
		}
		json.NewEncoder(w).Encode(out)
	case link:
		j.advance("opened")
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("<!DOCTYPE html><html><body>join</body></html>"))
	case link + "/installer":
		if j.installerMissing {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(503)
			w.Write([]byte(`{"error": "installer_missing", "message": "installer non presente nel mirror"}`))
			return
		}
		j.advance("downloaded")
		sq := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
		host := r.Host
		if j.bakeHost != "" {
			host = j.bakeHost
		}
		w.Write([]byte("#!/bin/sh\nMETNOS_SERVER=" + sq("http://"+host) + "; export METNOS_SERVER\nMETNOS_TOKEN=" + sq(j.token) + "; export METNOS_TOKEN\nset -eu\necho installing\n"))
	case wire.PathRegister:
		var body struct {
			Token     string `json:"token"`
			PublicKey string `json:"public_key"`
		}
		b := new(bytes.Buffer)
		b.ReadFrom(r.Body)
		json.Unmarshal(b.Bytes(), &body)
		rec := httptest.NewRecorder()
		r2 := r.Clone(r.Context())
		r2.Body = io.NopCloser(bytes.NewReader(b.Bytes()))
		r2.ContentLength = int64(b.Len())
		j.srv.Handler().ServeHTTP(rec, r2)
		if rec.Code == 200 && body.Token == j.token {
			var reg wire.Registration
			json.Unmarshal(rec.Body.Bytes(), &reg)
			j.advance("registered")
			j.device = map[string]any{"id": reg.DeviceID, "name": reg.Name, "fingerprint": reg.Fingerprint}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	default:
		j.srv.Handler().ServeHTTP(w, r)
	}
}

func newJoinFront(t *testing.T) (*joinFront, string) {
	t.Helper()
	srv, err := refserver.New(refserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	tok, err := srv.IssueToken("laptop", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	j := &joinFront{srv: srv, token: tok, states: []string{"created"}}
	hs := httptest.NewServer(j)
	t.Cleanup(hs.Close)
	return j, hs.URL
}

// Pairing from a join link: the session goes created → opened →
// downloaded → registered, the device is paired with the server the
// installer names, and the fingerprint printed is the one the server
// recorded, in four groups of four.
func TestPairJoinLink(t *testing.T) {
	j, url := newJoinFront(t)
	std, e, out, errb := identityStd(t, false)
	code := runPair(std, []string{url + wire.PathJoin + testJoinID})
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb)
	}
	if got := strings.Join(j.states, " "); got != "created opened downloaded registered" {
		t.Errorf("join session went %s", got)
	}
	st, err := pairing.LoadState(e.lay)
	if err != nil || !st.Paired() || *st.ServerURL != url {
		t.Fatalf("state %+v, %v: want paired with %s", st, err, url)
	}
	key, err := pairing.LoadKey(e.lay)
	if err != nil {
		t.Fatal(err)
	}
	fp := wire.ServerFingerprint(key.Public().(ed25519.PublicKey))
	if fp != *st.Fingerprint || fp != j.device["fingerprint"] {
		t.Fatalf("fingerprints: key %s, state %s, server %v", fp, *st.Fingerprint, j.device["fingerprint"])
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
	out.Reset()
	if code := runPair(std, []string{url + wire.PathJoin + testJoinID}); code != exitOK || !strings.Contains(errb.String(), "this link already paired this device") {
		t.Errorf("again: exit %d, %s", code, errb)
	}

	// Another device (another HOME) with the same link: refused, naming
	// the device it paired, before anything is written.
	std2, e2, _, errb2 := identityStd(t, false)
	if code := runPair(std2, []string{url + wire.PathJoin + testJoinID}); code != exitFailure {
		t.Fatalf("second device: exit %d", code)
	}
	if want := "metnos-agent: this link was already used to pair another device (laptop): ask for a new link\n"; errb2.String() != want {
		t.Errorf("second device: %q, want %q", errb2, want)
	}
	if _, err := os.Stat(e2.lay.Data); !os.IsNotExist(err) {
		t.Errorf("the refused device got %s: %v", e2.lay.Data, err)
	}
}

// The link's host is not the one the installer names (the real server
// bakes the Host header it was reached by, a proxy may change it): a
// note says so, and the device pairs with the installer's.
func TestPairJoinLinkOtherHost(t *testing.T) {
	j, url := newJoinFront(t)
	j.bakeHost = strings.Replace(strings.TrimPrefix(url, "http://"), "127.0.0.1", "localhost", 1)
	std, e, _, errb := identityStd(t, false)
	if code := runPair(std, []string{url + wire.PathJoin + testJoinID}); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb)
	}
	st, _ := pairing.LoadState(e.lay)
	if want := "http://" + j.bakeHost; *st.ServerURL != want {
		t.Errorf("paired with %s, want %s", *st.ServerURL, want)
	}
	if want := "note: the server's installer names it http://" + j.bakeHost + ", not " + strings.TrimPrefix(url, "http://") + " as the link does: pairing with http://" + j.bakeHost + "\n"; errb.String() != want {
		t.Errorf("stderr %q, want %q", errb, want)
	}
}

// A token used by another device: the one-liner's 409 says so for a link.
func TestPairTokenAlreadyUsed(t *testing.T) {
	j, url := newJoinFront(t)
	oneLiner := "curl -fsSL " + url + "/agent/client/install.sh | \\\n  METNOS_SERVER=" + url + " \\\n  METNOS_TOKEN=" + j.token + " sh"
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
	j, url := newJoinFront(t)
	j.installerMissing = true
	std, e, _, errb := identityStd(t, false)
	if code := runPair(std, []string{url + wire.PathJoin + testJoinID}); code != exitFailure {
		t.Fatalf("exit %d", code)
	}
	if want := "metnos-agent: the server has no installer in its mirror, so its join links cannot pair a device: ask the admin for a token instead (Devices page, manual token) and run metnos-agent register\n"; errb.String() != want {
		t.Errorf("%q, want %q", errb, want)
	}
	if _, err := os.Stat(e.lay.Data); !os.IsNotExist(err) {
		t.Errorf("a failed pair left %s: %v", e.lay.Data, err)
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
			if code := runPair(std, []string{hs.URL + wire.PathJoin + testJoinID}); code != exitFailure {
				t.Fatalf("exit %d", code)
			}
			want := "metnos-agent: " + hs.URL + wire.PathJoin + testJoinID + tc.want + "\n"
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
	j, url := newJoinFront(t)
	std, e, out, errb := identityStd(t, false)
	code := runPair(std, []string{"--install", "METNOS_SERVER=" + url + " METNOS_TOKEN=" + j.token})
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
