package refserver

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"io/fs"
	"net/http"
	"time"

	"github.com/metnos/agent/wire"
)

// shimState is the served shim: its files and the signature and digest
// of the last signed version.
type shimState struct {
	files map[string][]byte
	sig   string
	sha   string
}

// loadShim reads every regular file of fsys and signs the set.
func loadShim(fsys fs.FS, key ed25519.PrivateKey) (*shimState, error) {
	sh := &shimState{files: map[string][]byte{}}
	if fsys == nil {
		return sh, nil
	}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sh.files[p] = b
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("refserver: reading the shim folder: %w", err)
	}
	if err := sh.sign(key); err != nil {
		return nil, err
	}
	return sh, nil
}

func (sh *shimState) count() int {
	if sh == nil {
		return 0
	}
	return len(sh.files)
}

// digest is the shim_sha256 poll announces: "" when there is no shim.
func (sh *shimState) digest() string {
	if sh == nil || len(sh.files) == 0 {
		return ""
	}
	return sh.sha
}

// encoded returns the files map as the wire carries it.
func (sh *shimState) encoded() map[string]string {
	out := make(map[string]string, len(sh.files))
	for k, v := range sh.files {
		out[k] = base64.StdEncoding.EncodeToString(v)
	}
	return out
}

// sign signs canonical {"files": {path: std-base64}} and recomputes the
// digest.
func (sh *shimState) sign(key ed25519.PrivateKey) error {
	files := map[string]any{}
	for k, v := range sh.encoded() {
		files[k] = v
	}
	sig, err := wire.SignCanonical(key, map[string]any{"files": files})
	if err != nil {
		return fmt.Errorf("refserver: signing the shim: %w", err)
	}
	sh.sig, sh.sha = sig, wire.ShimDigest(sh.files)
	return nil
}

// SetShimFile changes (nil data: removes) one file of the served shim.
// With resign the shim is signed again and its digest changes, as after a
// server upgrade; without, the old signature and digest stay: a tampered
// shim the device must refuse. [Server.Reload] undoes it.
func (s *Server) SetShimFile(p string, data []byte, resign bool) error {
	if !wire.SafePath(p) {
		return fmt.Errorf("refserver: SetShimFile: path %q is not a safe '/'-separated relative path", p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if data == nil {
		delete(s.shim.files, p)
	} else {
		s.shim.files[p] = bytes.Clone(data)
	}
	if resign {
		return s.shim.sign(s.key)
	}
	return nil
}

// ShimDigest is the shim_sha256 poll currently announces ("" = no shim).
func (s *Server) ShimDigest() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shim.digest()
}

// handleShim is GET /agent/shim (docs/protocol.md §5.7).
func (s *Server) handleShim(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	b := wire.ShimBundle{Files: s.shim.encoded(), Sig: s.shim.sig, SHA256: s.shim.sha}
	delay := s.shimDelay
	s.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, http.StatusOK, b)
}

// SetShimDelay makes GET /agent/shim answer only after d (0: at once),
// for tests of a device stuck inside an execution.
func (s *Server) SetShimDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shimDelay = d
}
