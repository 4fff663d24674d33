package pairing

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/wire"
)

// copyFixture copies testdata/rust-client (a key and state.json as the
// Rust client writes them) into a temporary data directory.
func copyFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"key", "state.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", "rust-client", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// An existing Rust-client installation is picked up as it is: the key
// (the protocol's test seed, docs/protocol.md §3.5) gives its public key and both
// fingerprints, and the pinned server key decodes.
func TestRustClientInstallation(t *testing.T) {
	dir := copyFixture(t)
	key, err := LoadOrCreateKey(layout.Layout{Data: dir})
	if err != nil {
		t.Fatal(err)
	}
	pub := key.Public().(ed25519.PublicKey)
	if got := wire.PublicKeyWire(pub); got != "A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg" {
		t.Errorf("public key %s", got)
	}
	if got := LocalFingerprint(pub); got != "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8" {
		t.Errorf("local fingerprint %s", got)
	}
	st, err := LoadState(layout.Layout{Data: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Paired() || *st.DeviceID != "7d2397b0895e48a190a155fb289168d5" {
		t.Fatalf("state not paired: %+v", st)
	}
	if got := wire.ServerFingerprint(pub); got != *st.Fingerprint {
		t.Errorf("server fingerprint %s, state.json says %s", got, *st.Fingerprint)
	}
	sk, err := st.ServerKey()
	if err != nil || wire.PublicKeyWire(sk) != "uw1qxYcj8vFOBS79x-pCuqNZcZj1WcnGFQ94-Y8Mz5M" {
		t.Errorf("server key %v, %v", sk, err)
	}
	// Written back, state.json is byte for byte what the Rust client wrote.
	if err := SaveState(layout.Layout{Data: dir}, st); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "state.json"))
	want, _ := os.ReadFile(filepath.Join("testdata", "rust-client", "state.json"))
	if !bytes.Equal(got, want) {
		t.Errorf("state.json rewritten differently:\n%s\nwant\n%s", got, want)
	}
}

func TestNewKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	k1, err := LoadOrCreateKey(layout.Layout{Data: dir})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "key"))
	if err != nil || fi.Size() != 32 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	k2, err := LoadOrCreateKey(layout.Layout{Data: dir})
	if err != nil || !k1.Equal(k2) {
		t.Errorf("the key changed on reload: %v", err)
	}
	if st, err := LoadState(layout.Layout{Data: dir}); err != nil || st.Paired() {
		t.Errorf("a new device is paired: %+v %v", st, err)
	}
}

func TestBadKeyIsNeverOverwritten(t *testing.T) {
	dir := t.TempDir()
	bad := []byte("-----BEGIN PRIVATE KEY-----\n")
	os.WriteFile(filepath.Join(dir, "key"), bad, 0o600)
	if _, err := LoadOrCreateKey(layout.Layout{Data: dir}); err == nil || !strings.Contains(err.Error(), "not a Metnos device key") {
		t.Fatalf("got %v, want a clear error", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "key")); !bytes.Equal(got, bad) {
		t.Error("the unreadable key file was overwritten")
	}
}

func TestCorruptedPinnedKey(t *testing.T) {
	s := "not-a-key"
	if _, err := (State{ServerPublicKey: &s}).ServerKey(); err == nil {
		t.Error("a corrupted pinned key decoded")
	}
	if _, err := (State{}).ServerKey(); err == nil {
		t.Error("a missing pinned key decoded")
	}
}

// A paired device whose key file is gone gets an error naming the file
// and what to do, never a new key: the server knows the old one, and
// would answer every request with bad_signature.
func TestPairedKeyMissingIsNotReplaced(t *testing.T) {
	dir := copyFixture(t)
	lay := layout.Layout{Data: dir}
	os.Remove(lay.Key())
	_, err := LoadOrCreateKey(lay)
	if err == nil {
		t.Fatal("a paired device without its key got a new one")
	}
	for _, want := range []string{lay.Key(), "restore", "metnos-agent unpair"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := os.Lstat(lay.Key()); err == nil {
		t.Error("a key file was written")
	}
}

// A key that is a dangling link (a vault not mounted) is an error, paired
// or not, and the link is left as it is: nothing is written through it
// nor over it.
func TestDanglingKeyLinkIsLeftAlone(t *testing.T) {
	for _, paired := range []bool{true, false} {
		dir := copyFixture(t)
		lay := layout.Layout{Data: dir}
		if !paired {
			os.Remove(lay.State())
		}
		os.Remove(lay.Key())
		target := filepath.Join(t.TempDir(), "vault", "key")
		if err := os.Symlink(target, lay.Key()); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreateKey(lay)
		if err == nil || !strings.Contains(err.Error(), "does not exist (a vault or drive not mounted?)") || !strings.Contains(err.Error(), lay.Key()) {
			t.Errorf("paired %v: got %v, want an error about the link", paired, err)
		}
		if got, err := os.Readlink(lay.Key()); err != nil || got != target {
			t.Errorf("paired %v: the link was replaced: %q %v", paired, got, err)
		}
		if _, err := os.Lstat(target); err == nil {
			t.Errorf("paired %v: a key was written through the link", paired)
		}
		if _, err := LoadKey(lay); errors.Is(err, ErrNoKey) {
			t.Errorf("paired %v: LoadKey takes a dangling link for no key", paired)
		}
	}
}

// A key others can read is refused, as the tailnet auth-key file is, and
// its mode is left for the user to fix.
func TestKeyReadableByOthersIsRefused(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix modes on Windows")
	}
	dir := copyFixture(t)
	lay := layout.Layout{Data: dir}
	os.Chmod(lay.Key(), 0o644)
	_, err := LoadOrCreateKey(lay)
	if err == nil || !strings.Contains(err.Error(), "readable by others (-rw-r--r--): chmod 600 it") {
		t.Fatalf("got %v, want a refusal", err)
	}
	if fi, _ := os.Stat(lay.Key()); fi.Mode().Perm() != 0o644 {
		t.Errorf("the mode was changed silently: %v", fi.Mode())
	}
	os.Chmod(lay.Key(), 0o600)
	if _, err := LoadOrCreateKey(lay); err != nil {
		t.Errorf("after chmod 600: %v", err)
	}
}

// A missing home folder is never created: the key (and state.json) are
// refused with a sentence that says to fix $HOME.
func TestMissingHomeIsNotCreated(t *testing.T) {
	home := filepath.Join(t.TempDir(), "nohome")
	lay, err := layout.For(runtime.GOOS, func(string) string { return "" }, home)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(lay); err == nil || !strings.Contains(err.Error(), "the home folder "+home+" does not exist") {
		t.Errorf("LoadOrCreateKey: %v", err)
	}
	if err := SaveState(lay, State{}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("SaveState: %v", err)
	}
	if _, err := os.Lstat(home); err == nil {
		t.Fatal("the home folder was created")
	}
	// With the home folder there, its data folder is made as before.
	os.Mkdir(home, 0o700)
	if _, err := LoadOrCreateKey(lay); err != nil {
		t.Fatal(err)
	}
}

// state.json as a link is neither written through nor replaced.
func TestStateLinkIsNotWrittenThrough(t *testing.T) {
	dir := t.TempDir()
	lay := layout.Layout{Data: dir}
	target := filepath.Join(t.TempDir(), "elsewhere.json")
	os.Symlink(target, lay.State())
	id := "x"
	if err := SaveState(lay, State{DeviceID: &id}); err == nil {
		t.Fatal("state.json was written over a link")
	}
	if _, err := os.Lstat(target); err == nil {
		t.Error("state.json was written through a link")
	}
}

// Server URLs are checked before anything is sent or written: each bad
// one gets one sentence saying what is wrong and what is wanted.
func TestCheckServerURL(t *testing.T) {
	for _, ok := range []string{"http://metnos:8765", "https://metnos.example", "http://127.0.0.1:8765/", "http://[::1]:8765/metnos", "HTTP://metnos"} {
		if err := CheckServerURL(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for bad, says := range map[string]string{
		"http://":                 "has no host",
		"http://:8765":            "has no host",
		"notaurl":                 "has no scheme",
		"metnos:8765":             "does not start with http:// or https://",
		"ftp://metnos:8765":       "does not start with http:// or https://",
		"http://metnos:8765/?x=1": "has a query",
		"http://metnos:8765/#top": "has a fragment",
		"http://u:p@metnos:8765":  "user name or password",
		"http://metnos:99999":     "not 1 to 65535",
		"http://metnos:x":         "is not a URL",
		"http:metnos":             "has no host",
		"http://a b":              "is not a URL",
		"http://\x1b[31m":         `\x1b[31m`,
	} {
		err := CheckServerURL(bad)
		if err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "want http:// or https://") {
			t.Errorf("%q: %v, want it to say %q", bad, err, says)
		}
		if err != nil && strings.Contains(err.Error(), "\x1b") {
			t.Errorf("%q: the error holds a raw escape", bad)
		}
		if err != nil && (strings.Contains(err.Error(), `\\x1b`) || strings.Contains(err.Error(), "net/url")) {
			t.Errorf("%q: %v: escaped twice, or a Go package's words", bad, err)
		}
	}
	// A state.json naming an ftp:// server is found out by CheckServer,
	// which names the file.
	dir := t.TempDir()
	id, u := "d", "ftp://metnos:8765"
	lay := layout.Layout{Data: dir}
	if err := SaveState(lay, State{DeviceID: &id, ServerURL: &u}); err != nil {
		t.Fatal(err)
	}
	if err := CheckServer(lay, ""); err == nil || !strings.Contains(err.Error(), lay.State()) || !strings.Contains(err.Error(), "ftp://") {
		t.Errorf("CheckServer of a state.json with ftp://: %v", err)
	}
	if err := CheckServer(lay, "http://other:8765"); err != nil {
		t.Errorf("--server overrides state.json: %v", err)
	}
}

// The fallback for file systems without hard links creates the key in
// place, but never through a link nor over a file.
func TestCreateExclRefusesLinksAndFiles(t *testing.T) {
	dir := t.TempDir()
	link, target := filepath.Join(dir, "key"), filepath.Join(dir, "vault-key")
	os.Symlink(target, link)
	if err := createExcl(link, []byte("seed")); !errors.Is(err, os.ErrExist) {
		t.Errorf("through a dangling link: %v, want ErrExist", err)
	}
	if _, err := os.Lstat(target); err == nil {
		t.Error("written through the link")
	}
	p := filepath.Join(dir, "new")
	if err := createExcl(p, []byte("seed")); err != nil {
		t.Fatal(err)
	}
	if err := createExcl(p, []byte("other")); !errors.Is(err, os.ErrExist) {
		t.Errorf("over a file: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "seed" {
		t.Errorf("the file was overwritten: %q", b)
	}
}

// TestDamagedStateFile: a state.json that is empty, not JSON, of the
// wrong types or not an object is one sentence naming the file, what is
// wrong in words and what to do, with no Go decoder words.
func TestDamagedStateFile(t *testing.T) {
	for body, says := range map[string]string{
		"":                        "it is empty",
		"not json {":              "it is not JSON",
		`{"device_id": 12345}`:    "its device_id is a JSON number, not a string",
		"[1,2,3]":                 "it is a JSON array, not an object",
		`{"server_url": {"a":1}}`: "its server_url is a JSON object, not a string",
	} {
		dir := t.TempDir()
		lay := layout.Layout{Data: dir}
		if err := os.WriteFile(lay.State(), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadState(lay)
		want := "pairing: the pairing file " + lay.State() + " is damaged (" + says + "): restore it, or run `metnos-agent unpair` and pair again"
		if err == nil || err.Error() != want {
			t.Errorf("state.json %q: %v, want %q", body, err, want)
		}
		if b, _ := os.ReadFile(lay.State()); string(b) != body {
			t.Errorf("state.json %q was changed", body)
		}
	}
}

// TestDanglingStateLink: a state.json that is a link to a missing file
// (a vault not mounted) is an error naming the link and its target, not
// "not paired"; CheckPaired and LoadOrNewKey say the same.
func TestDanglingStateLink(t *testing.T) {
	dir := t.TempDir()
	lay := layout.Layout{Data: dir}
	target := filepath.Join(dir, "nowhere.json")
	if err := os.Symlink(target, lay.State()); err != nil {
		t.Fatal(err)
	}
	want := "pairing: the pairing file " + lay.State() + " is a link to " + target + ", which does not exist (a vault or drive not mounted?): mount it, or restore the file there"
	if _, err := LoadState(lay); err == nil || err.Error() != want {
		t.Errorf("LoadState: %v, want %q", err, want)
	}
	if err := CheckPaired(lay); err == nil || err.Error() != want {
		t.Errorf("CheckPaired: %v, want %q", err, want)
	}
	if _, _, err := LoadOrNewKey(lay); err == nil || err.Error() != want {
		t.Errorf("LoadOrNewKey: %v, want %q", err, want)
	}
	if _, err := os.Stat(lay.Key()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a key was made beside a dangling state.json: %v", err)
	}
}

// TestNewKeyOnlyInMemory: LoadOrNewKey makes a key without writing a
// file (register writes it once the server paired it), SaveNewKey
// writes it, and then LoadOrNewKey gives that same key back; CheckPaired
// on an unpaired device says so and writes nothing.
func TestNewKeyOnlyInMemory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	lay := layout.Layout{Data: dir}
	key, fresh, err := LoadOrNewKey(lay)
	if err != nil || !fresh {
		t.Fatalf("LoadOrNewKey on a new device: fresh %v, %v", fresh, err)
	}
	if err := CheckPaired(lay); !errors.Is(err, ErrNotPaired) {
		t.Errorf("CheckPaired on a new device: %v, want ErrNotPaired", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the data folder was made before the key was saved: %v", err)
	}
	if err := SaveNewKey(lay, key); err != nil {
		t.Fatal(err)
	}
	again, fresh, err := LoadOrNewKey(lay)
	if err != nil || fresh || !again.Equal(key) {
		t.Errorf("after SaveNewKey: fresh %v, same key %v, %v", fresh, again.Equal(key), err)
	}
	if err := SaveNewKey(lay, key); err == nil {
		t.Error("SaveNewKey wrote over an existing key")
	}
}

// TestUnwritableDataFolder: a data folder this user cannot write is
// named, with what to do, before register spends its token; no
// temporary file is named or left.
func TestUnwritableDataFolder(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes any folder; run as another user to test this")
	}
	dir := filepath.Join(t.TempDir(), "data")
	os.Mkdir(dir, 0o500)
	defer os.Chmod(dir, 0o700)
	lay := layout.Layout{Data: dir}
	want := "pairing: the data folder " + dir + " is not writable by this user: fix its owner or mode, or point " + layout.DataDirEnv + " at a folder of yours"
	if err := CheckDataWritable(lay); err == nil || err.Error() != want {
		t.Errorf("CheckDataWritable: %v, want %q", err, want)
	}
	key, _, _ := LoadOrNewKey(lay)
	if err := SaveNewKey(lay, key); err == nil || !strings.HasPrefix(err.Error(), "pairing: the data folder "+dir+" is not writable") || strings.Contains(err.Error(), ".key.new") {
		t.Errorf("SaveNewKey: %v", err)
	}
}
