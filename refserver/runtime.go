package refserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/metnos/agent/wire"
)

// openRuntime opens a runtime file, answering 400/404 itself on failure.
func (s *Server) openRuntime(w http.ResponseWriter, name string) (*os.File, fs.FileInfo, bool) {
	if !wire.ValidRuntimeName(name) {
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

// handleRuntimeDescriptor is GET /agent/runtime/descriptor/{filename} (docs/protocol.md §11).
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
	env, err := wire.SignRuntimeDescriptor(s.key, name, hex.EncodeToString(h.Sum(nil)), n)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, http.StatusOK, env)
}

// handleRuntimeFile is GET /agent/runtime/{filename} (docs/protocol.md §11); Range requests
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
