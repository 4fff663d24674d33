package bundle

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/wire"
)

// InstallShim verifies a shim bundle against the pinned server key and
// writes it to lay's [layout.Layout.Shim] (through a .tmp folder beside
// it and a rename).
// It returns the directory and the shim's digest.
func InstallShim(lay layout.Layout, b wire.ShimBundle, server ed25519.PublicKey) (string, string, error) {
	files := make(map[string]any, len(b.Files))
	for k, v := range b.Files {
		files[k] = v
	}
	if err := wire.VerifyCanonical(server, map[string]any{"files": files}, b.Sig); err != nil {
		return "", "", fmt.Errorf("%w: shim: %v", ErrUnverified, err)
	}
	raw := make(map[string][]byte, len(b.Files))
	for name, enc := range b.Files {
		if !wire.SafePath(name) {
			return "", "", fmt.Errorf("%w: shim: unsafe file name %q", ErrUnverified, name)
		}
		data, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			return "", "", fmt.Errorf("%w: shim: %s is not base64: %v", ErrUnverified, name, err)
		}
		raw[name] = data
	}
	dir := lay.Shim()
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", "", fmt.Errorf("shim: %w", err)
	}
	for name, data := range raw {
		p := filepath.Join(tmp, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", "", fmt.Errorf("shim: %w", err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return "", "", fmt.Errorf("shim: %w", err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", "", fmt.Errorf("shim: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", "", fmt.Errorf("shim: %w", err)
	}
	return dir, wire.ShimDigest(raw), nil
}
