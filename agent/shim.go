package agent

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/metnos/agent/wire"
)

// ShimBundle is the body of GET /agent/shim (§5.7): the Python helpers
// every executor imports.
type ShimBundle struct {
	Files  map[string]string `json:"files"` // wire path -> standard base64
	Sig    string            `json:"sig"`   // b64url over canonical {"files": files}
	SHA256 string            `json:"sha256"`
}

// ShimDigest is the shim's digest as the server announces it in
// shim_sha256: SHA-256 over name, 0x00, content, 0x00 of every file in
// sorted name order.
func ShimDigest(files map[string][]byte) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write(files[n])
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// InstallShim verifies a shim bundle against the pinned server key and
// writes it to cacheDir/shim (through cacheDir/shim.tmp and a rename).
// It returns the directory and the shim's digest.
func InstallShim(cacheDir string, b ShimBundle, server ed25519.PublicKey) (string, string, error) {
	files := make(map[string]any, len(b.Files))
	for k, v := range b.Files {
		files[k] = v
	}
	if err := wire.VerifyCanonical(server, map[string]any{"files": files}, b.Sig); err != nil {
		return "", "", fmt.Errorf("%w: shim: %v", ErrUnverified, err)
	}
	raw := make(map[string][]byte, len(b.Files))
	for name, enc := range b.Files {
		if !SafePath(name) {
			return "", "", fmt.Errorf("%w: shim: unsafe file name %q", ErrUnverified, name)
		}
		data, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			return "", "", fmt.Errorf("%w: shim: %s is not base64: %v", ErrUnverified, name, err)
		}
		raw[name] = data
	}
	dir := filepath.Join(cacheDir, "shim")
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
	return dir, ShimDigest(raw), nil
}
