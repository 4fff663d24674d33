package refserver

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/metnos/agent/wire"
)

// runtimeNameRule is the tarball name rule of §7 (length and the
// .tar.gz suffix are checked apart).
var runtimeNameRule = regexp.MustCompile(`^[A-Za-z0-9._+-]+$`)

// ValidRuntimeName reports whether name is a runtime tarball name a
// device may ask for: non-empty, at most 240 characters of
// [A-Za-z0-9._+-], no "..", ending in .tar.gz.
func ValidRuntimeName(name string) bool {
	return len(name) <= 240 && runtimeNameRule.MatchString(name) &&
		!strings.Contains(name, "..") && strings.HasSuffix(name, ".tar.gz")
}

// RuntimeDescriptor returns the signed descriptor envelope of a runtime
// tarball, {"descriptor": {...}, "sig": "<b64url>"}, the signature being
// over the canonical descriptor {archive_sha256, archive_size, filename,
// version: 1}.
func RuntimeDescriptor(key ed25519.PrivateKey, filename, sha256Hex string, size int64) (map[string]any, error) {
	d := map[string]any{"version": 1, "filename": filename, "archive_sha256": sha256Hex, "archive_size": size}
	sig, err := wire.SignCanonical(key, d)
	if err != nil {
		return nil, fmt.Errorf("refserver: signing the descriptor of %s: %w", filename, err)
	}
	return map[string]any{"descriptor": d, "sig": sig}, nil
}

// openRuntime opens a runtime file, answering 400/404 itself on failure.
func (s *Server) openRuntime(w http.ResponseWriter, name string) (*os.File, fs.FileInfo, bool) {
	if !ValidRuntimeName(name) {
		http.Error(w, fmt.Sprintf("invalid runtime filename %q", name), http.StatusBadRequest)
		return nil, nil, false
	}
	if s.cfg.RuntimeDir == "" {
		http.Error(w, "no runtime mirror on this server", http.StatusNotFound)
		return nil, nil, false
	}
	f, err := os.Open(filepath.Join(s.cfg.RuntimeDir, name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			http.Error(w, "runtime "+name+" not found", http.StatusNotFound)
		} else {
			http.Error(w, "runtime "+name+": "+err.Error(), http.StatusInternalServerError)
		}
		return nil, nil, false
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		http.Error(w, "runtime "+name+" not found", http.StatusNotFound)
		return nil, nil, false
	}
	return f, st, true
}

// handleRuntimeDescriptor is GET /agent/runtime/descriptor/{filename} (§7).
func (s *Server) handleRuntimeDescriptor(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("filename")
	f, st, ok := s.openRuntime(w, name)
	if !ok {
		return
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil || n != st.Size() {
		http.Error(w, "reading runtime "+name+" failed", http.StatusInternalServerError)
		return
	}
	env, err := RuntimeDescriptor(s.key, name, hex.EncodeToString(h.Sum(nil)), n)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, http.StatusOK, env)
}

// handleRuntimeFile is GET /agent/runtime/{filename} (§7); Range requests
// are answered with 206.
func (s *Server) handleRuntimeFile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("filename")
	f, st, ok := s.openRuntime(w, name)
	if !ok {
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, name, st.ModTime(), f)
}
