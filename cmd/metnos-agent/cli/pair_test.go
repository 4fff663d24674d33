package cli

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/pairing"
)

// pairedState is a Rust client's state.json: paired with
// http://127.0.0.1:8765, with a device name holding an escape sequence,
// a bidi override and a bell (as a hostile server could have given it).
const pairedState = `{
  "device_id": "7d2397b0895e48a190a155fb289168d5",
  "device_name": "conf-pc\u001b[2J\u001b]0;owned\u0007\u202etxt.exe",
  "server_url": "http://127.0.0.1:8765",
  "fingerprint": "56475aa75463474c0285df5dbf2bcab73da651358839e9b77481b2eab107708c",
  "paired_at": "2026-12-02T09:28:09Z",
  "server_public_key": "A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg"
}
`

// identityStd returns a stdio running with the environment vars over a
// temporary HOME (created unless noHome), and its stdout and stderr.
func identityStd(t *testing.T, noHome bool, vars ...string) (stdio, environment, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	home := filepath.Join(t.TempDir(), "home")
	if !noHome {
		os.Mkdir(home, 0o700)
	}
	env := map[string]string{"HOME": home, "PATH": "/usr/bin:/bin"}
	for i := 0; i+1 < len(vars); i += 2 {
		env[vars[i]] = vars[i+1]
	}
	e, err := readEnvironment(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	return stdio{out: &out, err: &errb, env: &envResult{e: e}}, e, &out, &errb
}

// writePaired writes pairedState and a device key into e's data folder.
func writePaired(t *testing.T, e environment) {
	t.Helper()
	os.MkdirAll(e.lay.Data, 0o700)
	if err := os.WriteFile(e.lay.State(), []byte(pairedState), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.lay.Key()); err != nil {
		os.WriteFile(e.lay.Key(), bytes.Repeat([]byte{7}, 32), 0o600)
	}
}

// While `run` holds the lock, unpair and register refuse, say which
// process runs and how to stop it, and change nothing.
func TestPairingChangesRefusedWhileRunning(t *testing.T) {
	std, e, _, errb := identityStd(t, false)
	writePaired(t, e)
	held, err := lockfile.Lock(e.lay.Lock())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	for _, args := range [][]string{
		{"unpair"},
		{"register", "--server", "http://127.0.0.1:1", "--token", "DEV.x.y", "--force"},
	} {
		errb.Reset()
		run := runUnpair
		if args[0] == "register" {
			run = runRegister
		}
		if code := run(std, args[1:]); code != exitLocked {
			t.Errorf("%s while running: exit %d, want %d; stderr %s", args[0], code, exitLocked, errb)
		}
		want := "metnos-agent is running (pid " + strconv.Itoa(os.Getpid()) + "), serving the current pairing: stop it first with `systemctl --user stop metnos-agent` (or Ctrl-C in its terminal)"
		if !strings.Contains(errb.String(), want) {
			t.Errorf("%s: stderr %q, want %q", args[0], errb, want)
		}
		if b, _ := os.ReadFile(e.lay.State()); string(b) != pairedState {
			t.Errorf("%s changed state.json while the agent runs", args[0])
		}
	}
	held.Release()
	if code := runUnpair(std, nil); code != exitOK {
		t.Errorf("unpair once stopped: exit %d: %s", code, errb)
	}
}

// register holds run's lock from its check until state.json is
// written: a `run` started while register waits for the server is
// refused as another agent, and once register ends the lock is free.
func TestRunRefusedWhileRegistering(t *testing.T) {
	arrived := make(chan struct{}, 10)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, "token refused")
	}))
	defer srv.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	std, e, _, errb := identityStd(t, false)
	writePaired(t, e)
	done := make(chan int, 1)
	go func() { done <- runRegister(std, []string{"--server", srv.URL, "--token", "DEV.x.y", "--force"}) }()
	select {
	case <-arrived:
	case code := <-done:
		t.Fatalf("register ended (exit %d) before asking the server: %s", code, errb)
	case <-time.After(20 * time.Second):
		t.Fatal("register never asked the server")
	}
	// run's first step past its checks is this lock: it must be held.
	// (Were it free, run would go on to serve, so the test looks first.)
	if held, err := lockfile.Lock(e.lay.Lock()); err == nil {
		held.Release()
		t.Fatal("while register waits for the server, run's lock is free")
	} else if !errors.Is(err, lockfile.ErrLocked) {
		t.Fatalf("taking run's lock: %v", err)
	}
	runStd, _, _, runErr := identityStd(t, false)
	runStd.env = std.env // the same data folder
	if code := runRun(runStd, nil); code != exitLocked {
		t.Errorf("run while register waits for the server: exit %d, want %d; stderr %s", code, exitLocked, runErr)
	}
	if want := "another agent is already running for this user"; !strings.Contains(runErr.String(), want) {
		t.Errorf("run: stderr %q, want %q", runErr, want)
	}
	close(release)
	if code := <-done; code != exitFailure {
		t.Errorf("register: exit %d: %s", code, errb)
	}
	held, err := lockfile.Lock(e.lay.Lock())
	if err != nil {
		t.Fatalf("after register ended, run could not take its lock: %v", err)
	}
	held.Release()
}

// Pairing with another server says it replaces the pinned key and
// server; without a terminal it refuses unless --force.
func TestRepairWithAnotherServer(t *testing.T) {
	std, e, _, errb := identityStd(t, false)
	writePaired(t, e)
	code := runRegister(std, []string{"--server", "http://127.0.0.1:1", "--token", "DEV.x.y"})
	if code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	for _, want := range []string{
		"this device is paired with http://127.0.0.1:8765 as device 7d2397b0895e48a190a155fb289168d5: pairing with http://127.0.0.1:1 replaces the pinned server key and the server",
		"run register again with --force",
	} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr %q, want %q", errb, want)
		}
	}
	if strings.Contains(errb.String(), "pairing failed") {
		t.Error("the server was contacted without --force")
	}
	if b, _ := os.ReadFile(e.lay.State()); string(b) != pairedState {
		t.Error("state.json changed")
	}
	// With --force it goes on (and fails here, the server being absent,
	// which leaves the pairing as it was).
	errb.Reset()
	runRegister(std, []string{"--server", "http://127.0.0.1:1", "--token", "DEV.x.y", "--force"})
	if !strings.Contains(errb.String(), "pairing failed") {
		t.Errorf("--force did not go on: %s", errb)
	}
	if b, _ := os.ReadFile(e.lay.State()); string(b) != pairedState {
		t.Error("a failed pairing changed state.json")
	}
}

func TestAskYes(t *testing.T) {
	for in, want := range map[string]bool{"y\n": true, "YES\n": true, "\n": false, "n\n": false, "": false, "yep\n": false} {
		var w bytes.Buffer
		if got := askYes(strings.NewReader(in), &w, "Replace it? [y/N] "); got != want {
			t.Errorf("answer %q: %v, want %v", in, got, want)
		}
	}
}

// whoami prints names from state.json with their control characters
// escaped, and on a paired device whose key is gone it says so, exits 1
// and writes nothing.
func TestWhoamiSanitisesAndWritesNothing(t *testing.T) {
	std, e, out, _ := identityStd(t, false)
	writePaired(t, e)
	if code := runWhoami(std, nil); code != exitOK {
		t.Fatalf("whoami: exit %d", code)
	}
	if strings.ContainsAny(out.String(), "\x1b\x07\u202e") {
		t.Errorf("whoami printed raw control characters: %q", out)
	}
	if !strings.Contains(out.String(), `conf-pc\x1b[2J\x1b]0;owned\x07\u202etxt.exe`) {
		t.Errorf("whoami does not show the name escaped: %q", out)
	}
	os.Remove(e.lay.Key())
	out.Reset()
	if code := runWhoami(std, nil); code != exitFailure {
		t.Errorf("whoami without the key of a paired device: exit %d", code)
	}
	if !strings.Contains(out.String(), "device key:          unusable: pairing: no device key yet: "+e.lay.Key()+" does not exist") {
		t.Errorf("whoami: %q", out)
	}
	if _, err := os.Stat(e.lay.Key()); err == nil {
		t.Error("whoami made a key")
	}
}

// No command creates a missing home folder: run, register and whoami
// each say what is wrong, and the folder is still not there.
func TestMissingHomeIsNeverCreated(t *testing.T) {
	std, e, _, errb := identityStd(t, true)
	for name, run := range map[string]func() int{
		"run":      func() int { return runRun(std, nil) },
		"register": func() int { return runRegister(std, []string{"--server", "http://127.0.0.1:1", "--token", "DEV.x.y"}) },
		"whoami":   func() int { return runWhoami(std, nil) },
		"unpair":   func() int { return runUnpair(std, nil) },
		"runtime install": func() int {
			return runRuntimeInstall(std, []string{"--url", "http://127.0.0.1:1/x.tar.gz", "--sha256", strings.Repeat("0", 64)})
		},
		"install": func() int { return runInstall(std, nil) },
	} {
		errb.Reset()
		run()
		if name != "whoami" && name != "unpair" && name != "install" && !strings.Contains(errb.String(), "the home folder "+e.lay.Home+" does not exist") {
			t.Errorf("%s: stderr %q", name, errb)
		}
		if _, err := os.Lstat(e.lay.Home); err == nil {
			t.Fatalf("%s created the missing home folder", name)
		}
	}
	if err := pairing.CheckHome(e.lay); err == nil {
		t.Error("CheckHome: no error")
	}
}

// What a server says in a refusal reaches the terminal escaped.
func TestRegisterErrorFromServerIsSanitised(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, "token refused\x1b]0;owned\x07\x1b[2J")
	}))
	defer srv.Close()
	std, _, _, errb := identityStd(t, false)
	if code := runRegister(std, []string{"--server", srv.URL, "--token", "DEV.x.y"}); code != exitFailure {
		t.Errorf("exit %d: %s", code, errb)
	}
	if strings.ContainsAny(errb.String(), "\x1b\x07") || !strings.Contains(errb.String(), `\x1b]0;owned\x07`) {
		t.Errorf("stderr %q: want the server's text escaped", errb)
	}
}

// run on a paired device whose key is gone, or is a dangling link (a
// vault not mounted), does not start, names the file and what to do,
// and makes no key.
func TestRunWithoutTheKeyMakesNoNewOne(t *testing.T) {
	for _, link := range []bool{false, true} {
		std, e, _, errb := identityStd(t, false)
		writePaired(t, e)
		os.Remove(e.lay.Key())
		target := filepath.Join(t.TempDir(), "vault", "key")
		want := "is missing, but this device is paired"
		if link {
			os.Symlink(target, e.lay.Key())
			want = "does not exist (a vault or drive not mounted?)"
		}
		if code := runRun(std, nil); code != exitFailure {
			t.Errorf("link %v: exit %d", link, code)
		}
		if !strings.Contains(errb.String(), want) || !strings.Contains(errb.String(), e.lay.Key()) {
			t.Errorf("link %v: stderr %q, want %q and the file", link, errb, want)
		}
		if link {
			if got, _ := os.Readlink(e.lay.Key()); got != target {
				t.Errorf("the link was replaced")
			}
			if _, err := os.Lstat(target); err == nil {
				t.Errorf("a key was written through the link")
			}
		} else if _, err := os.Lstat(e.lay.Key()); err == nil {
			t.Errorf("run made a new key")
		}
	}
}

// A state.json whose server URL is ftp:// stops run before it writes
// anything (not even its lock), naming the file.
func TestRunRefusesABadPairedURL(t *testing.T) {
	std, e, _, errb := identityStd(t, false)
	writePaired(t, e)
	b, _ := os.ReadFile(e.lay.State())
	os.WriteFile(e.lay.State(), bytes.Replace(b, []byte("http://127.0.0.1:8765"), []byte("ftp://127.0.0.1:8765"), 1), 0o600)
	if code := runRun(std, nil); code != exitFailure {
		t.Errorf("exit %d", code)
	}
	if want := e.lay.State() + `: the server URL "ftp://127.0.0.1:8765" does not start with http:// or https://`; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr %q, want %q", errb, want)
	}
	if _, err := os.Lstat(e.lay.Lock()); err == nil {
		t.Error("run took its lock before checking the URL")
	}
}
