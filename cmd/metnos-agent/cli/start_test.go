package cli

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/wire"
)

// TestDanglingStateLinkIsNotUnpaired: a state.json that is a link to a
// missing file (a vault not mounted) is not "not paired": whoami and
// run name the link and its target and fail, and run writes nothing,
// not even its lock.
func TestDanglingStateLinkIsNotUnpaired(t *testing.T) {
	std, e, out, errb := identityStd(t, false)
	writePaired(t, e)
	os.Remove(e.lay.State())
	target := filepath.Join(t.TempDir(), "nowhere.json")
	if err := os.Symlink(target, e.lay.State()); err != nil {
		t.Fatal(err)
	}
	want := "metnos-agent: pairing: the pairing file " + e.lay.State() + " is a link to " + target + ", which does not exist (a vault or drive not mounted?): mount it, or restore the file there\n"
	if code := runWhoami(std, nil); code != exitFailure || errb.String() != want {
		t.Errorf("whoami: exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errb, want)
	}
	errb.Reset()
	if code := runRun(std, nil); code != exitFailure || errb.String() != want {
		t.Errorf("run: exit %d, stderr %q; want exit 1 and %q", code, errb, want)
	}
	for _, p := range []string{e.lay.Lock(), e.lay.Log(), target} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("run wrote %s", p)
		}
	}
}

// TestDamagedStateSaysWhatToDo: whoami and run on a damaged state.json
// say which file, what is wrong in words, and what to do.
func TestDamagedStateSaysWhatToDo(t *testing.T) {
	for _, body := range []string{"", `{"device_id": 12345}`, "[1,2,3]"} {
		std, e, _, errb := identityStd(t, false)
		writePaired(t, e)
		os.WriteFile(e.lay.State(), []byte(body), 0o600)
		for name, cmd := range map[string]func(stdio, []string) int{"whoami": runWhoami, "run": runRun} {
			errb.Reset()
			code := cmd(std, nil)
			msg := errb.String()
			if code != exitFailure || !strings.HasPrefix(msg, "metnos-agent: pairing: the pairing file "+e.lay.State()+" is damaged (") ||
				!strings.HasSuffix(msg, "): restore it, or run `metnos-agent unpair` and pair again\n") {
				t.Errorf("%s on state.json %q: exit %d, %q", name, body, code, msg)
			}
			if strings.Contains(msg, "json:") || strings.Contains(msg, "Go ") || strings.Contains(msg, "unexpected end") {
				t.Errorf("%s on state.json %q: Go decoder words in %q", name, body, msg)
			}
		}
		if _, err := os.Lstat(e.lay.Lock()); err == nil {
			t.Errorf("run took its lock on a damaged state.json")
		}
	}
}

// TestRunStartErrorIsASentence: an error after run took its lock (here
// a tailnet auth key file that does not exist) is one `metnos-agent:`
// sentence on stderr naming the file, not a log line; the log file
// keeps the line for the service's log.
func TestRunStartErrorIsASentence(t *testing.T) {
	std, e, _, errb := identityStd(t, false)
	writePaired(t, e)
	missing := filepath.Join(t.TempDir(), "nonexistent", "key")
	code := runRun(std, []string{"--tailnet-authkey-file", missing, "--tailnet-control-url", "http://127.0.0.1:1"})
	want := "metnos-agent: tailnet: the auth key file " + missing + " does not exist: check --tailnet-authkey-file"
	if code != exitFailure || !strings.HasPrefix(errb.String(), want) || strings.Count(errb.String(), "\n") != 1 {
		t.Errorf("exit %d, stderr %q; want exit 1 and one line starting %q", code, errb, want)
	}
	if strings.Contains(errb.String(), "level=") || strings.Contains(errb.String(), "stat ") {
		t.Errorf("stderr %q: a log line or a raw Go error", errb)
	}
	if b, _ := os.ReadFile(e.lay.Log()); !strings.Contains(string(b), `"msg":"cannot start"`) {
		t.Errorf("the log file has no \"cannot start\" line: %q", b)
	}
}

// TestRunWhileAnotherRunsIsOneSentence: run while another agent holds
// the lock exits 3 with one sentence naming the lock and its holder
// once, and how to stop it.
func TestRunWhileAnotherRunsIsOneSentence(t *testing.T) {
	std, e, _, errb := identityStd(t, false)
	writePaired(t, e)
	l, err := lockfile.Lock(e.lay.Lock())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	code := runRun(std, nil)
	want := fmt.Sprintf("metnos-agent: another agent is already running for this user (%s is held by process %d): stop it first with `systemctl --user stop metnos-agent`, or Ctrl-C in its terminal\n", e.lay.Lock(), os.Getpid())
	if code != exitLocked || errb.String() != want {
		t.Errorf("exit %d, stderr %q; want %d and %q", code, errb, exitLocked, want)
	}
}

// TestRegisterWritesTheKeyOnlyOnceServerPaired: register against a
// server that is not a Metnos server (an HTML page, garbage, a huge
// answer) leaves no file behind and says "not a Metnos server?"; against
// one that pairs it, the key it sent is the key it wrote.
func TestRegisterWritesTheKeyOnlyOnceServerPaired(t *testing.T) {
	for name, tc := range map[string]struct{ body, want string }{
		"html":    {"<html><body>It works!</body></html>", "answered with an HTML page"},
		"garbage": {"\x00\x01garbage", "answered with something that is not JSON"},
		"huge":    {strings.Repeat(" ", 5<<20), "is larger than 4 MiB: not a Metnos server?"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, tc.body) }))
		std, e, _, errb := identityStd(t, false)
		code := runRegister(std, []string{"--server", srv.URL, "--token", "DEV.x.y"})
		srv.Close()
		if code != exitFailure || !strings.Contains(errb.String(), tc.want) || strings.Contains(errb.String(), "invalid character") {
			t.Errorf("%s: exit %d, stderr %q, want %q", name, code, errb, tc.want)
		}
		if _, err := os.Stat(e.lay.Data); err == nil {
			t.Errorf("%s: register wrote %v", name, files(t, e.lay.Data))
		}
	}
	var sent string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			PublicKey string `json:"public_key"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		sent = body.PublicKey
		io.WriteString(w, `{"device_id":"d1","name":"pc","fingerprint":"f","paired_at":"now","server_public_key":"A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg"}`)
	}))
	defer srv.Close()
	std, e, _, errb := identityStd(t, false)
	if code := runRegister(std, []string{"--server", srv.URL, "--token", "DEV.x.y"}); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb)
	}
	key, err := pairing.LoadKey(e.lay)
	if err != nil {
		t.Fatalf("no key after a pairing: %v", err)
	}
	if got := wire.PublicKeyWire(key.Public().(ed25519.PublicKey)); got != sent {
		t.Errorf("the key written (%s) is not the key registered (%s)", got, sent)
	}
}
