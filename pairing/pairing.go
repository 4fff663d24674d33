// Package pairing keeps the device's identity: its Ed25519 key and the
// state.json that pins the server it is paired with. Both live where the
// Metnos Rust client keeps them, the [layout.Layout]'s Key and State, and
// in the same format (docs/protocol.md §2.1, §2.4, §14), so metnos-agent
// picks up an existing pairing as it is, and the Rust client would pick
// up ours.
package pairing

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/layout"
)

// LoadOrCreateKey reads the device key from lay's Key (exactly the 32
// raw bytes of an Ed25519 seed), creating its folder and a new key,
// mode 0600, when there is none. A key file of any other size is an
// error, never overwritten.
func LoadOrCreateKey(lay layout.Layout) (ed25519.PrivateKey, error) {
	path := lay.Key()
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) != ed25519.SeedSize {
			return nil, fmt.Errorf("pairing: %s is %d bytes, want the %d raw bytes of an Ed25519 seed; it is not a Metnos device key (move it away to make a new key, and pair again)", path, len(b), ed25519.SeedSize)
		}
		return ed25519.NewKeyFromSeed(b), nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("pairing: reading the device key: %w", err)
	}
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, fmt.Errorf("pairing: making a device key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("pairing: %w", err)
	}
	if err := atomicfile.WriteFile(path, seed, 0o600); err != nil {
		return nil, fmt.Errorf("pairing: writing the device key: %w", err)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// State is state.json. Every field is optional; the device is paired
// when DeviceID is set.
type State struct {
	DeviceID   *string `json:"device_id"`
	DeviceName *string `json:"device_name"`
	ServerURL  *string `json:"server_url"`
	// Fingerprint is the server's fingerprint of this device: SHA-256
	// of its public key, lower-case hex (see
	// [github.com/metnos/agent/wire.ServerFingerprint]).
	Fingerprint *string `json:"fingerprint"`
	PairedAt    *string `json:"paired_at"`
	// ServerPublicKey is the pinned server key, base64url raw 32 bytes.
	ServerPublicKey *string `json:"server_public_key"`
}

// Paired reports whether the device is paired.
func (s State) Paired() bool { return s.DeviceID != nil && *s.DeviceID != "" }

// ServerKey decodes the pinned server key.
func (s State) ServerKey() (ed25519.PublicKey, error) {
	if s.ServerPublicKey == nil || *s.ServerPublicKey == "" {
		return nil, errors.New("pairing: no server key is pinned (pair again with a server that has one)")
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(*s.ServerPublicKey, "="))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("pairing: the pinned server key %q is not 32 bytes of base64url; pair again", *s.ServerPublicKey)
	}
	return ed25519.PublicKey(b), nil
}

// LoadState reads lay's State, state.json; a missing file is the empty,
// unpaired State.
func LoadState(lay layout.Layout) (State, error) {
	path := lay.State()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("pairing: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("pairing: %s is not a device state file: %w", path, err)
	}
	return s, nil
}

// SaveState writes lay's State, state.json, as the Rust client does:
// pretty JSON (two-space indent) through state.json.tmp and a rename.
func SaveState(lay layout.Layout, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("pairing: %w", err)
	}
	path := lay.State()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("pairing: %w", err)
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("pairing: writing the device state: %w", err)
	}
	return nil
}

// LocalFingerprint is what whoami calls the device key's fingerprint:
// the lower-case hex of the raw public key (not a hash, docs/protocol.md §2.1).
func LocalFingerprint(pub ed25519.PublicKey) string { return hex.EncodeToString(pub) }
