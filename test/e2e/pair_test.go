//go:build linux

package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// withMirror gives the server a client mirror holding the installers,
// so that its join links lead to one.
func withMirror(t *testing.T) func(*refserver.Config) {
	dir := t.TempDir()
	if _, err := refserver.WriteInstallers(dir); err != nil {
		t.Fatal(err)
	}
	return func(c *refserver.Config) { c.Mirror = dir }
}

// newHome is another device's home on the same machine.
func (w *world) newHome(name string) string {
	w.t.Helper()
	h := filepath.Join(w.dir, name)
	if err := os.MkdirAll(h, 0o755); err != nil {
		w.t.Fatal(err)
	}
	return h
}

// cliIn runs one agent command with home as HOME and stdin, and
// returns its exit status and output.
func (w *world) cliIn(home, stdin string, args ...string) (int, string) {
	w.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), args...)
	cmd.Env = append(w.env(), "HOME="+home)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		w.t.Fatalf("running metnos-agent %v: %v", args, err)
	}
	return 0, string(out)
}

// stateRecorder is an HTTP proxy in front of the world's server that
// records, after each answer, the state of one join session: what an
// admin watching the Devices page sees change.
type stateRecorder struct {
	mu     sync.Mutex
	states []string
	url    string
}

func (w *world) recordJoin(id string) *stateRecorder {
	w.t.Helper()
	target, err := url.Parse(w.url)
	if err != nil {
		w.t.Fatal(err)
	}
	rec := &stateRecorder{}
	note := func() {
		s, _ := w.srv.JoinState(id)
		rec.mu.Lock()
		if len(rec.states) == 0 || rec.states[len(rec.states)-1] != s {
			rec.states = append(rec.states, s)
		}
		rec.mu.Unlock()
	}
	note()
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Host = r.In.Host // the server bakes the Host it was reached by
	}}
	hs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rp.ServeHTTP(rw, r)
		note()
	}))
	w.t.Cleanup(hs.Close)
	rec.url = hs.URL
	return rec
}

func (r *stateRecorder) seen() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.states, " ")
}

var fingerprintLine = regexp.MustCompile(`(?m)^fingerprint: ([0-9a-f]{4}) ([0-9a-f]{4}) ([0-9a-f]{4}) ([0-9a-f]{4}) `)

// Pairing from a join link, as a user sent it in a chat: the session
// goes created → opened → downloaded → registered as the agent walks
// it, the fingerprint printed is the server's, then the agent's first
// heartbeat makes it "heartbeat" (the admin sees "client active").
func TestPairFromJoinLink(t *testing.T) {
	w := newWorld(t, withMirror(t))
	j, err := w.srv.NewJoin("e2e-laptop", "auto", 0)
	if err != nil {
		t.Fatal(err)
	}
	rec := w.recordJoin(j.ID)
	code, out := w.cli("pair", " <"+j.Link(rec.url)+"/>\n")
	if code != 0 {
		t.Fatalf("pair: exit %d\n%s", code, out)
	}
	if got := rec.seen(); got != "created opened downloaded registered" {
		t.Errorf("the join session went %q, want created opened downloaded registered", got)
	}
	devs := w.srv.Devices()
	if len(devs) != 1 || devs[0].Name != "e2e-laptop" {
		t.Fatalf("the server has %+v", devs)
	}
	w.device = devs[0].ID
	m := fingerprintLine.FindStringSubmatch(out)
	if m == nil || strings.Join(m[1:], "") != devs[0].Fingerprint[:16] {
		t.Errorf("pair printed %q; want the first 16 digits of the server's fingerprint %s in four groups", out, devs[0].Fingerprint)
	}
	for _, want := range []string{`paired as "e2e-laptop" (device ` + w.device + `) with ` + rec.url, `"fingerprint" column of the server's Devices page, /admin/devices`, "`metnos-agent run`"} {
		if !strings.Contains(out, want) {
			t.Errorf("pair printed %q, want %q", out, want)
		}
	}

	// The agent, started as the user is told, heartbeats.
	p := w.start()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a safety net
	defer cancel()
	for {
		if s, _ := w.srv.JoinState(j.ID); s == refserver.JoinHeartbeat {
			break
		}
		select {
		case <-ctx.Done():
			s, _ := w.srv.JoinState(j.ID)
			t.Fatalf("the join session is %q after the agent ran 60 s, want heartbeat", s)
		case <-p.done:
			t.Fatalf("the agent ended: %v", p.err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	p.stop(t)

	// Another device (another home) with the same link: refused, naming
	// the device it paired, and writing nothing.
	other := w.newHome("other")
	code, out = w.cliIn(other, "", "pair", j.Link(w.url))
	if want := "metnos-agent: this link was already used to pair another device (e2e-laptop): ask for a new link\n"; code != 1 || out != want {
		t.Errorf("a second device: exit %d, %q; want 1, %q", code, out, want)
	}
	if _, err := os.Stat(filepath.Join(other, ".local")); !os.IsNotExist(err) {
		t.Errorf("the refused device got files: %v", err)
	}
	if n := len(w.srv.Devices()); n != 1 {
		t.Errorf("the server has %d devices, want 1", n)
	}
}

// The links that cannot pair: expired, unknown, a server without an
// installer, a web server that is not Metnos. Each is one sentence, and
// nothing is written.
func TestPairJoinLinkRefused(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().Unix())
	clock := func(c *refserver.Config) { c.Now = func() time.Time { return time.Unix(now.Load(), 0) } }
	w := newWorld(t, withMirror(t), clock)
	bare := newWorld(t, clock) // no mirror: no installer
	html := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/html")
		rw.Write([]byte("<!DOCTYPE html><html><body>my blog</body></html>"))
	}))
	defer html.Close()
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()

	expired, err := w.srv.NewJoin("late", "linux", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	noInstaller, err := bare.srv.NewJoin("bare", "linux", 0)
	if err != nil {
		t.Fatal(err)
	}
	now.Add(120) // the clock passes the expiry
	const id = "/agent/client/join/0123456789abcdef"
	for _, tc := range []struct{ name, link, want string }{
		{"expired", expired.Link(w.url), "metnos-agent: this join link has expired: ask the admin for a new one (links last 30 minutes)\n"},
		{"unknown", w.url + id, "metnos-agent: this join link is unknown to the server (mistyped, or already cleaned up): ask for a new link\n"},
		{"no installer", noInstaller.Link(bare.url), "metnos-agent: the server has no installer in its mirror, so its join links cannot pair a device: ask the admin for a token instead (Devices page, manual token) and run metnos-agent register\n"},
		{"html", html.URL + id, "metnos-agent: " + html.URL + id + "/status does not answer as a Metnos server (it answered with an HTML page)\n"},
		{"404 text", notFound.URL + id, "metnos-agent: " + notFound.URL + id + "/status does not answer as a Metnos server (it answered 404 Not Found: 404 page not found)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := w.newHome(tc.name)
			code, out := w.cliIn(home, "", "pair", tc.link)
			if code != 1 || out != tc.want {
				t.Errorf("exit %d, %q; want 1, %q", code, out, tc.want)
			}
			if _, err := os.Stat(filepath.Join(home, ".local")); !os.IsNotExist(err) {
				t.Errorf("a refused link left files: %v", err)
			}
		})
	}
	if s, _ := w.srv.JoinState(expired.ID); s != refserver.JoinExpired {
		t.Errorf("the expired session is %q", s)
	}
	if n := len(w.srv.Devices()) + len(bare.srv.Devices()); n != 0 {
		t.Errorf("the servers have %d devices", n)
	}
}

// The manual one-liners of the Devices page, pasted as they are shown:
// each pairs a device with its token; a token used twice is refused.
func TestPairOneLiners(t *testing.T) {
	w := newWorld(t)
	for _, tc := range []struct {
		name  string
		text  func(tok string) string
		stdin bool
	}{
		{"linux, three lines, from stdin", func(tok string) string {
			return "curl -fsSL " + w.url + "/agent/client/install.sh | \\\n  METNOS_SERVER=" + w.url + " \\\n  METNOS_TOKEN=" + tok + " sh\n"
		}, true},
		{"linux, one line", func(tok string) string {
			return "curl -fsSL " + w.url + "/agent/client/install.sh | METNOS_SERVER=" + w.url + " METNOS_TOKEN=" + tok + " sh"
		}, false},
		{"powershell", func(tok string) string {
			return "$env:METNOS_SERVER='" + w.url + "'; $env:METNOS_TOKEN='" + tok + "'; `\niwr " + w.url + "/agent/client/install.ps1 -UseBasicParsing | iex"
		}, false},
		{"cmd set", func(tok string) string {
			return "set \"METNOS_SERVER=" + w.url + "\"\r\nset \"METNOS_TOKEN=" + tok + "\"\r\n"
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := w.srv.IssueToken("one-liner", 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			before := len(w.srv.Devices())
			home := w.newHome(strings.ReplaceAll(tc.name, " ", "_"))
			var code int
			var out string
			if tc.stdin {
				code, out = w.cliIn(home, tc.text(tok), "pair", "-")
			} else {
				code, out = w.cliIn(home, "", "pair", tc.text(tok))
			}
			if code != 0 || !strings.Contains(out, `paired as "one-liner"`) || !fingerprintLine.MatchString(out) {
				t.Fatalf("exit %d\n%s", code, out)
			}
			if n := len(w.srv.Devices()); n != before+1 {
				t.Errorf("the server has %d devices, want %d", n, before+1)
			}
			// The same one-liner on another device: the token is spent.
			code, out = w.cliIn(w.newHome(strings.ReplaceAll(tc.name, " ", "_")+"-2"), tc.text(tok), "pair", "-")
			if want := "metnos-agent: this link's token was already used by another device: ask for a new link\n"; code != 1 || out != want {
				t.Errorf("the token again: exit %d, %q; want 1, %q", code, out, want)
			}
		})
	}
}
