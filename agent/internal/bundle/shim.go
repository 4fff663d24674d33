package bundle

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

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

// ShimSums are the SHA-256 of each file of a shim bundle (by its slash
// path), for [CheckShim]; a file that is not base64 is left out (then
// InstallShim refused the bundle).
func ShimSums(b wire.ShimBundle) map[string][32]byte {
	out := make(map[string][32]byte, len(b.Files))
	for name, enc := range b.Files {
		if data, err := base64.StdEncoding.DecodeString(enc); err == nil {
			out[name] = sha256.Sum256(data)
		}
	}
	return out
}

// CheckShim verifies the installed shim in dir again, as on every use:
// each file of sums it holds has that SHA-256, and it holds nothing
// else but their folders and the bytecode package pyc checks (a module
// planted in the shim folder, which is on Python's path before the
// standard library, would shadow the library's). A missing file is not
// an error: Python then finds no module or one of the interpreter's
// own, and a run missing a module of the shim fetches it again
// (docs/protocol.md §8.3). An error wraps [ErrUnverified]: install the
// shim again.
func CheckShim(dir string, sums map[string][32]byte) error {
	files := slices.Sorted(maps.Keys(sums))
	if err := onlyFiles(dir, "shim", files); err != nil {
		return err
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: shim: %v", ErrUnverified, err)
		}
		if sum, want := sha256.Sum256(data), sums[f]; !bytes.Equal(sum[:], want[:]) {
			return fmt.Errorf("%w: shim: %s is not the file the server signed", ErrUnverified, f)
		}
	}
	return nil
}
