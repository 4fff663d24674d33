package pairing

import (
	"bytes"
	"crypto/ed25519"
	"os"
	"path/filepath"
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
