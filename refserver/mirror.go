package refserver

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/metnos/agent/wire"
)

// ManifestName is the client mirror's manifest file, in the mirror
// directory ([Config.Mirror]).
const ManifestName = "manifest.json"

// RustClientComponent is the component name of the Rust client in the
// mirror's manifest; GET /agent/client/update/{target} serves it.
const RustClientComponent = "client"

var (
	// mirrorFileName is the real mirror's _safe_filename rule.
	mirrorFileName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._+-]+$`) })
	// componentRoute and targetRoute are the real routes' rules.
	componentRoute = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9_\-]*$`) })
	targetRoute    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9_\-]+$`) })
)

// safeMirrorName reports whether name may be one path segment under
// the mirror, as the real server's _safe_filename does.
func safeMirrorName(name string) bool {
	return mirrorFileName().MatchString(name) && !strings.Contains(name, "..")
}

// errNoManifest and errBadManifest tell why [Server.readManifest]
// returned nothing.
var (
	errNoManifest  = errors.New("no client mirror manifest")
	errBadManifest = errors.New("client mirror manifest unreadable")
)

// readManifest reads the mirror's manifest afresh, as the real server
// does on every request, so that publishing takes effect at once.
func (s *Server) readManifest() (map[string]any, error) {
	if s.cfg.Mirror == "" {
		return nil, errNoManifest
	}
	b, err := os.ReadFile(filepath.Join(s.cfg.Mirror, ManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoManifest
	}
	if err != nil {
		return nil, errBadManifest
	}
	m, ok := decodeObject(b)
	if !ok {
		return nil, errBadManifest
	}
	return m, nil
}

// clientVersion is the poll's server_client_version: the manifest's
// "latest" as written, nil without a readable manifest.
func (s *Server) clientVersion() any {
	m, err := s.readManifest()
	if err != nil {
		return nil
	}
	return m["latest"]
}

// mirrorError is an error answer of the mirror's routes.
type mirrorError struct {
	status        int
	code, message string
}

func (e *mirrorError) write(w http.ResponseWriter) { writeError(w, e.status, e.code, "%s", e.message) }

// lookupEntry finds the entry of component for target under the
// manifest's latest version, as the real _mirror_component_entry does
// (a Rust client entry of an old mirror may sit directly under the
// target).
func (s *Server) lookupEntry(component, target string) (string, map[string]any, *mirrorError) {
	m, err := s.readManifest()
	if errors.Is(err, errNoManifest) {
		return "", nil, &mirrorError{http.StatusNotFound, "no_manifest", "no client mirror on this server"}
	}
	bad := &mirrorError{http.StatusInternalServerError, "bad_manifest", "the client mirror's manifest is unreadable"}
	if err != nil {
		return "", nil, bad
	}
	var version string
	if v, ok := m["latest"].(string); ok {
		version = v
	} else if truthy(m["latest"]) {
		return "", nil, bad
	}
	obj := func(v any) (map[string]any, bool) {
		if !truthy(v) {
			return map[string]any{}, true
		}
		o, ok := v.(map[string]any)
		return o, ok
	}
	versions, ok1 := obj(m["versions"])
	perTarget, ok2 := obj(versions[version])
	targetEntry, ok3 := obj(perTarget[target])
	if !ok1 || !ok2 || !ok3 {
		return "", nil, bad
	}
	var entry map[string]any
	switch e := targetEntry[component].(type) {
	case nil:
		if _, legacy := targetEntry["sha256"].(string); legacy && component == RustClientComponent {
			entry = targetEntry
		}
	case map[string]any:
		entry = e
	default:
		if truthy(e) {
			return "", nil, bad
		}
	}
	if version == "" || len(entry) == 0 {
		return "", nil, &mirrorError{http.StatusNotFound, "no_binary", fmt.Sprintf("no %s %s in %q", component, target, version)}
	}
	return version, entry, nil
}

// mirrorEntry is lookupEntry answering the error itself.
func (s *Server) mirrorEntry(w http.ResponseWriter, component, target string) (string, map[string]any, bool) {
	v, e, merr := s.lookupEntry(component, target)
	if merr != nil {
		merr.write(w)
		return "", nil, false
	}
	return v, e, true
}

// entryString is a string field of a manifest entry, "" otherwise.
func entryString(e map[string]any, k string) string {
	s, _ := e[k].(string)
	return s
}

// handleClientDescriptor is GET /agent/client/update/{target}, the Rust
// client's descriptor: the signature covers {sha256, target, version},
// without the component (docs/protocol.md §9.1).
func (s *Server) handleClientDescriptor(w http.ResponseWriter, r *http.Request) {
	target := r.PathValue("target")
	if !targetRoute().MatchString(target) {
		writeError(w, http.StatusBadRequest, "bad_target", "target %q is not valid", target)
		return
	}
	version, entry, ok := s.mirrorEntry(w, RustClientComponent, target)
	if !ok {
		return
	}
	payload := map[string]any{"version": version, "target": target, "sha256": entryString(entry, "sha256")}
	sig, err := wire.SignCanonical(s.key, payload)
	if err != nil {
		writeError(w, http.StatusInternalServerError, wire.CodeInternal, "signing the descriptor: %v", err)
		return
	}
	payload["url_path"] = wire.PathClientFiles + entryString(entry, "path")
	payload["sig"] = sig
	writeJSON(w, http.StatusOK, payload)
}

// handleComponentDescriptor is GET
// /agent/component/{component}/update/{target} (docs/protocol.md §9.4).
func (s *Server) handleComponentDescriptor(w http.ResponseWriter, r *http.Request) {
	component, target := r.PathValue("component"), r.PathValue("target")
	if !componentRoute().MatchString(component) {
		writeError(w, http.StatusBadRequest, "bad_component", "component %q is not valid", component)
		return
	}
	if !targetRoute().MatchString(target) {
		writeError(w, http.StatusBadRequest, "bad_target", "target %q is not valid", target)
		return
	}
	version, entry, ok := s.mirrorEntry(w, component, target)
	if !ok {
		return
	}
	d, err := wire.SignComponentDescriptor(s.key, wire.ComponentDescriptor{
		Component: component, Version: version, Target: target,
		SHA256: entryString(entry, "sha256"), URLPath: wire.PathClientFiles + entryString(entry, "path"),
	})
	if err != nil {
		writeError(w, http.StatusInternalServerError, wire.CodeInternal, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// serveMirrorFile serves DIR/parts... with Range support, or answers
// 400 for an unsafe name and 404 for a missing file, as the real
// mirror does.
func (s *Server) serveMirrorFile(w http.ResponseWriter, r *http.Request, cacheControl, contentType string, parts ...string) {
	for _, p := range parts {
		if !safeMirrorName(p) {
			http.Error(w, "400: invalid filename", http.StatusBadRequest)
			return
		}
	}
	if s.cfg.Mirror == "" {
		http.Error(w, "404: client file not present", http.StatusNotFound)
		return
	}
	f, err := os.Open(filepath.Join(append([]string{s.cfg.Mirror}, parts...)...))
	if err != nil {
		http.Error(w, "404: client file not present", http.StatusNotFound)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		http.Error(w, "404: client file not present", http.StatusNotFound)
		return
	}
	w.Header().Set("Cache-Control", cacheControl)
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	http.ServeContent(w, r, st.Name(), st.ModTime(), f)
}

const immutable = "public, max-age=31536000, immutable"

// handleClientManifest is GET /agent/client/manifest.json.
func (s *Server) handleClientManifest(w http.ResponseWriter, r *http.Request) {
	s.serveMirrorFile(w, r, "no-store", "application/json", ManifestName)
}

// handleClientFile is GET /agent/client/{filename}: the installers.
func (s *Server) handleClientFile(w http.ResponseWriter, r *http.Request) {
	s.serveMirrorFile(w, r, immutable, "", r.PathValue("filename"))
}

// handleClientVersioned is GET /agent/client/{version}/{target}/{filename}.
func (s *Server) handleClientVersioned(w http.ResponseWriter, r *http.Request) {
	s.serveMirrorFile(w, r, immutable, "", r.PathValue("version"), r.PathValue("target"), r.PathValue("filename"))
}
