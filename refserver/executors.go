package refserver

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/metnos/agent/wire"
)

// executor is a loaded, signed executor and the bytes it is served with.
type executor struct {
	name           string
	manifestSHA    string // of the signed manifest
	codeSHA        string // of the signed code
	reversePattern []string
	codeFiles      []string
	manifest       []byte            // served manifest.toml (maybe tampered)
	sig            []byte            // detached signature of the signed manifest
	files          map[string][]byte // served code files (maybe tampered)
}

// manifestHead is what the server reads of a manifest.
type manifestHead struct {
	Name string `toml:"name"`
	Code struct {
		Files []string `toml:"files"`
	} `toml:"code"`
	ReversePattern any `toml:"reverse_pattern"`
}

// loadExecutors reads every top-level directory of fsys as an executor
// and signs it.
func loadExecutors(fsys fs.FS, key ed25519.PrivateKey) (map[string]*executor, error) {
	out := map[string]*executor{}
	if fsys == nil {
		return out, nil
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("refserver: reading the executors folder: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sub, err := fs.Sub(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("refserver: executor %s: %w", e.Name(), err)
		}
		ex, err := loadExecutor(e.Name(), sub, key)
		if err != nil {
			return nil, err
		}
		out[ex.name] = ex
	}
	return out, nil
}

// loadExecutor signs one executor as Metnos's `sign.py sign` does: the
// code digest goes into the manifest's [code] digest line and the final
// manifest bytes are signed.
func loadExecutor(name string, fsys fs.FS, key ed25519.PrivateKey) (*executor, error) {
	if !wire.ValidExecutorName(name) {
		return nil, fmt.Errorf("refserver: executor folder %q: the name must match %s", name, wire.ExecutorNamePattern)
	}
	text, err := fs.ReadFile(fsys, "manifest.toml")
	if err != nil {
		return nil, fmt.Errorf("refserver: executor %s: %w", name, err)
	}
	var head manifestHead
	if err := toml.Unmarshal(text, &head); err != nil {
		return nil, fmt.Errorf("refserver: executor %s: manifest.toml: %w", name, err)
	}
	if head.Name != "" && head.Name != name {
		return nil, fmt.Errorf("refserver: executor %s: manifest.toml says name = %q: rename the folder or the manifest", name, head.Name)
	}
	if len(head.Code.Files) == 0 {
		return nil, fmt.Errorf("refserver: executor %s: manifest.toml lists no [code].files", name)
	}
	patterns, err := reversePatterns(head.ReversePattern)
	if err != nil {
		return nil, fmt.Errorf("refserver: executor %s: %w", name, err)
	}
	files := map[string][]byte{}
	h := sha256.New()
	for _, f := range head.Code.Files {
		if !wire.SafePath(f) {
			return nil, fmt.Errorf("refserver: executor %s: code path %q is not a safe relative path", name, f)
		}
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, fmt.Errorf("refserver: executor %s: [code].files: %w", name, err)
		}
		files[f] = b
		h.Write(b)
	}
	codeSHA := hex.EncodeToString(h.Sum(nil))
	signed, err := SetCodeDigest(text, "sha256:"+codeSHA)
	if err != nil {
		return nil, fmt.Errorf("refserver: executor %s: %w", name, err)
	}
	ms := sha256.Sum256(signed)
	return &executor{
		name: name, manifestSHA: hex.EncodeToString(ms[:]), codeSHA: codeSHA,
		reversePattern: patterns, codeFiles: head.Code.Files,
		manifest: signed, sig: ed25519.Sign(key, signed), files: files,
	}, nil
}

// reversePatterns reads reverse_pattern: absent, a string or a list of
// strings.
func reversePatterns(v any) ([]string, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{x}, nil
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, errors.New("reverse_pattern must be a string or a list of strings")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, errors.New("reverse_pattern must be a string or a list of strings")
}

var (
	tableHeader = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\s*\[`) })
	codeHeader  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\s*\[\s*code\s*\]\s*(#.*)?$`) })
	digestLine  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\s*digest\s*=`) })
)

// SetCodeDigest edits manifest text so that its [code] table has the line
// digest = "<digest>": an existing digest line of the table is replaced,
// else one is inserted right after the [code] header. The rest of the
// text (comments, order, line endings) is kept as is.
func SetCodeDigest(manifest []byte, digest string) ([]byte, error) {
	lines := bytes.SplitAfter(manifest, []byte("\n"))
	newLine := func(old []byte) []byte {
		eol := "\n"
		if bytes.HasSuffix(old, []byte("\r\n")) {
			eol = "\r\n"
		} else if !bytes.HasSuffix(old, []byte("\n")) {
			eol = ""
		}
		return []byte(`digest = "` + digest + `"` + eol)
	}
	header := -1
	for i, l := range lines {
		text := strings.TrimRight(string(l), "\r\n")
		if header < 0 {
			if codeHeader().MatchString(text) {
				header = i
			}
			continue
		}
		if tableHeader().MatchString(text) {
			break
		}
		if digestLine().MatchString(text) {
			lines[i] = newLine(l)
			return bytes.Join(lines, nil), nil
		}
	}
	if header < 0 {
		return nil, errors.New("manifest.toml has no [code] table")
	}
	hl := lines[header]
	if !bytes.HasSuffix(hl, []byte("\n")) {
		lines[header] = append(append([]byte{}, hl...), '\n')
	}
	ins := newLine([]byte("\n"))
	if bytes.HasSuffix(hl, []byte("\r\n")) {
		ins = newLine([]byte("\r\n"))
	}
	out := append([][]byte{}, lines[:header+1]...)
	out = append(out, ins)
	out = append(out, lines[header+1:]...)
	return bytes.Join(out, nil), nil
}

// ExecutorDigests returns the manifest_sha256 and code_sha256 an
// invocation of the executor carries.
func (s *Server) ExecutorDigests(name string) (manifestSHA, codeSHA string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ex, ok := s.executors[name]
	if !ok {
		return "", "", false
	}
	return ex.manifestSHA, ex.codeSHA, true
}

// Executors returns the names of the loaded executors, sorted.
func (s *Server) Executors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.executors))
	for n := range s.executors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// SetExecutorFile changes the bytes served for one file of an executor's
// bundle without signing again: a tampered bundle. p is a path of
// [code].files or "manifest.toml"; nil data drops the file from the
// bundle. Enqueue keeps using the signed digests. [Server.Reload] undoes
// it.
func (s *Server) SetExecutorFile(name, p string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ex, ok := s.executors[name]
	if !ok {
		return fmt.Errorf("refserver: SetExecutorFile: executor %s is not loaded", name)
	}
	if p == "manifest.toml" {
		ex.manifest = bytes.Clone(data)
		return nil
	}
	if !wire.SafePath(p) {
		return fmt.Errorf("refserver: SetExecutorFile: executor %s: path %q is not a safe relative path", name, p)
	}
	if data == nil {
		delete(ex.files, p)
	} else {
		ex.files[path.Clean(p)] = bytes.Clone(data)
	}
	return nil
}

// handleExecutor is GET /agent/executor/{name} (docs/protocol.md §5.6).
func (s *Server) handleExecutor(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !wire.ValidExecutorName(name) {
		writeError(w, http.StatusBadRequest, wire.CodeInvalidName, "executor name %q must match %s", name, wire.ExecutorNamePattern)
		return
	}
	s.mu.Lock()
	ex, ok := s.executors[name]
	var b wire.ExecutorBundle
	if ok {
		std := base64.StdEncoding
		b = wire.ExecutorBundle{Name: name, ManifestTOML: std.EncodeToString(ex.manifest),
			ManifestSig: std.EncodeToString(ex.sig), Files: map[string]string{}}
		for _, f := range ex.codeFiles {
			if data, ok := ex.files[f]; ok {
				b.Files[f] = std.EncodeToString(data)
			}
		}
	}
	gate := s.exGate
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, wire.CodeUnknownExecutor, "executor %s is not known to this server", name)
		return
	}
	if gate != nil {
		switch status := gate(name); {
		case status == CutAnswer:
			// Half the bundle, then the connection is closed: the
			// client reads a short body.
			body, _ := json.Marshal(b)
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusOK)
			w.Write(body[:len(body)/2])
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		case status != 0:
			writeError(w, status, wire.CodeInternal, "refused by the test gate")
			return
		}
	}
	writeJSON(w, http.StatusOK, b)
}

// CutAnswer, returned by the gate of [Server.SetExecutorGate], cuts the
// connection halfway through the bundle.
const CutAnswer = -1

// SetExecutorGate installs a test hook called with every executor
// bundle GET, for a download that fails: a status is answered instead
// of the bundle, [CutAnswer] sends half of it and closes the
// connection, 0 serves it. Nil removes it.
func (s *Server) SetExecutorGate(gate func(name string) int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exGate = gate
}
