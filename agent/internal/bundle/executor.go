// Package bundle is a device's cache of what the server signs and the
// agent runs: executors (docs/protocol.md §7.3), in <cache>/executors/<name>-<sha16>, and
// the shim (docs/protocol.md §8), in <cache>/shim: the folders of a
// [layout.Layout]. The files in an executor's folder (manifest.toml,
// manifest.toml.sig and the code) and the .tmp folder beside it while it
// is written are the package's own.
//
// What it guarantees: nothing is written to the cache, and nothing is
// returned from it, that does not verify against the pinned server key
// and the invocation's digests; a cache entry is verified again on every
// use, and one that no longer verifies is deleted. A failed
// verification wraps [ErrUnverified]. What it does not: it fetches
// nothing (the caller hands it the bundles the server sent), and it
// installs no dependencies (an executor that declares some is refused).
package bundle

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/metnos/agent/agent/internal/pyc"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/wire"
)

// Manifest is what the agent reads of an executor's manifest.toml
// (docs/protocol.md §7.3); everything else in the file is signed but not interpreted.
type Manifest struct {
	Name string `toml:"name"`
	Code struct {
		Files  []string `toml:"files"`
		Digest string   `toml:"digest"`
	} `toml:"code"`
	Capabilities []policy.Capability `toml:"capabilities"`
	Placement    struct {
		MinSandbox string `toml:"min_sandbox"`
	} `toml:"placement"`
	Dependencies []any `toml:"dependencies"`
	// Args is the arguments' schema, of which the agent reads the
	// defaults: a capability's when clause reads one when the
	// invocation leaves its argument out.
	Args struct {
		Properties map[string]struct {
			Default any `toml:"default"`
		} `toml:"properties"`
	} `toml:"args"`
	// ReversePattern is one pattern name or a list of them (docs/protocol.md §10.1);
	// see [Manifest.Reverse].
	ReversePattern any `toml:"reverse_pattern"`

	// Facts are the capabilities and min_sandbox above as the sandbox
	// policy reads them, parsed once when the manifest is verified.
	Facts policy.Manifest `toml:"-"`
}

// Reverse is the manifest's reverse_pattern as a list: Metnos's
// manifests write it either as one string or as a list of strings.
func (m Manifest) Reverse() []string {
	switch v := m.ReversePattern.(type) {
	case string:
		if v != "" {
			return []string{v}
		}
	case []any:
		var out []string
		for _, x := range v {
			if s, ok := x.(string); ok && s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// Executor is a verified executor in the cache.
type Executor struct {
	Name     string
	Dir      string // the cache directory holding manifest.toml and the code
	Entry    string // absolute path of the first [code].files entry
	Manifest Manifest
}

// ErrUnverified is wrapped by every verification failure of an executor
// bundle or cache entry: nothing from it may run.
var ErrUnverified = errors.New("executor does not verify")

var digestRule = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-fA-F]{64}$`) })

// checkRequest applies the rules the client checks before asking the
// server for an executor (docs/protocol.md §5.6): the name's shape and 64-hex digests.
func checkRequest(name, manifestSHA, codeSHA string) error {
	if !wire.ValidExecutorName(name) {
		return fmt.Errorf("executor name %q is not one the server serves", name)
	}
	if !digestRule().MatchString(manifestSHA) || !digestRule().MatchString(codeSHA) {
		return fmt.Errorf("executor %s: manifest and code digests must be 64 hex digits", name)
	}
	return nil
}

// verify checks manifest bytes, signature and code against the
// invocation's digests and the pinned key, and parses the manifest.
func verify(name, manifestSHA, codeSHA string, manifest, sig []byte, code func(string) ([]byte, error), server ed25519.PublicKey) (Manifest, error) {
	sum := sha256.Sum256(manifest)
	if !strings.EqualFold(hex.EncodeToString(sum[:]), manifestSHA) {
		return Manifest{}, fmt.Errorf("%w: executor %s: manifest.toml does not match the invocation's manifest_sha256", ErrUnverified, name)
	}
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(server, manifest, sig) {
		return Manifest{}, fmt.Errorf("%w: executor %s: the manifest's signature is not the paired server's", ErrUnverified, name)
	}
	var m Manifest
	if err := toml.Unmarshal(manifest, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: executor %s: manifest.toml: %v", ErrUnverified, name, err)
	}
	if len(m.Code.Files) == 0 {
		return Manifest{}, fmt.Errorf("%w: executor %s: manifest lists no [code].files", ErrUnverified, name)
	}
	h := sha256.New()
	for _, f := range m.Code.Files {
		if !wire.SafePath(f) {
			return Manifest{}, fmt.Errorf("%w: executor %s: unsafe code path %q", ErrUnverified, name, f)
		}
		b, err := code(f)
		if err != nil {
			return Manifest{}, fmt.Errorf("%w: executor %s: %s: %v", ErrUnverified, name, f, err)
		}
		h.Write(b)
	}
	if !strings.EqualFold(hex.EncodeToString(h.Sum(nil)), codeSHA) {
		return Manifest{}, fmt.Errorf("%w: executor %s: the code does not match the invocation's code_sha256", ErrUnverified, name)
	}
	if len(m.Dependencies) > 0 {
		return Manifest{}, fmt.Errorf("executor %s needs dependencies (%d), which this agent does not install yet: it can only run stdlib executors", name, len(m.Dependencies))
	}
	facts, err := policy.ParseManifest(m.Capabilities, m.Placement.MinSandbox)
	if err != nil {
		return Manifest{}, fmt.Errorf("executor %s: [placement] min_sandbox: %w", name, err)
	}
	defaults := map[string]any{}
	for k, p := range m.Args.Properties {
		if p.Default != nil {
			defaults[k] = p.Default
		}
	}
	m.Facts = facts.WithArgDefaults(defaults)
	return m, nil
}

// Materialize verifies a bundle fetched for an invocation and writes it
// into lay's cache, in [layout.Layout.Executor], through a .tmp directory and a
// rename, replacing what was there.
func Materialize(lay layout.Layout, b wire.ExecutorBundle, name, manifestSHA, codeSHA string, server ed25519.PublicKey) (Executor, error) {
	if err := checkRequest(name, manifestSHA, codeSHA); err != nil {
		return Executor{}, err
	}
	if b.Name != name {
		return Executor{}, fmt.Errorf("%w: asked for executor %s, the server sent %q", ErrUnverified, name, b.Name)
	}
	manifest, err := base64.StdEncoding.DecodeString(b.ManifestTOML)
	if err != nil {
		return Executor{}, fmt.Errorf("%w: executor %s: manifest_toml is not base64: %v", ErrUnverified, name, err)
	}
	sig, err := base64.StdEncoding.DecodeString(b.ManifestSig)
	if err != nil {
		return Executor{}, fmt.Errorf("%w: executor %s: manifest_sig is not base64: %v", ErrUnverified, name, err)
	}
	code := func(p string) ([]byte, error) {
		s, ok := b.Files[p]
		if !ok {
			return nil, errors.New("missing from the bundle")
		}
		return base64.StdEncoding.DecodeString(s)
	}
	m, err := verify(name, manifestSHA, codeSHA, manifest, sig, code, server)
	if err != nil {
		return Executor{}, err
	}
	dir := lay.Executor(name, manifestSHA)
	tmp := dir + ".tmp"
	removeStaleTemps(filepath.Dir(dir))
	if err := os.RemoveAll(tmp); err != nil {
		return Executor{}, fmt.Errorf("executor %s: %w", name, err)
	}
	ex, err := write(tmp, dir, m, manifest, sig, code)
	if err != nil {
		// Nothing half-written stays in the cache.
		os.RemoveAll(tmp)
		return Executor{}, fmt.Errorf("executor %s: writing it into the cache at %s: %w", name, dir, err)
	}
	ex.Name = name
	return ex, nil
}

// removeStaleTemps removes the .tmp folders beside the cached executors
// in dir: what a Materialize cut short by a crash or a full disk left.
// The agent materializes one executor at a time, so none is in use.
func removeStaleTemps(dir string) {
	tmps, _ := filepath.Glob(filepath.Join(dir, "*.tmp"))
	for _, t := range tmps {
		os.RemoveAll(t)
	}
}

// write writes a verified executor into tmp, then renames tmp to dir.
func write(tmp, dir string, m Manifest, manifest, sig []byte, code func(string) ([]byte, error)) (Executor, error) {
	put := func(rel string, data []byte) error {
		p := filepath.Join(tmp, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, data, 0o644)
	}
	if err := put("manifest.toml", manifest); err != nil {
		return Executor{}, err
	}
	if err := put("manifest.toml.sig", sig); err != nil {
		return Executor{}, err
	}
	for _, f := range m.Code.Files {
		data, _ := code(f)
		if err := put(f, data); err != nil {
			return Executor{}, err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return Executor{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return Executor{}, err
	}
	return Executor{Dir: dir, Entry: filepath.Join(dir, filepath.FromSlash(m.Code.Files[0])), Manifest: m}, nil
}

// foreign returns an error wrapping [ErrUnverified] when the executor
// folder dir holds a file or folder other than its manifest, its
// signature, its code files (and their folders), the bytecode list and
// __pycache__ folders of regular files beside a folder of the code.
func foreign(dir, name string, code []string) error {
	return onlyFiles(dir, "executor "+name, append([]string{"manifest.toml", "manifest.toml.sig"}, code...))
}

// onlyFiles returns an error wrapping [ErrUnverified] when dir (the
// folder of what) holds a file or folder other than files (slash paths)
// and their folders, the bytecode list, and __pycache__ folders of
// regular files beside a folder of files.
func onlyFiles(dir, what string, files []string) error {
	want := map[string]bool{pyc.ListName: true}
	dirs := map[string]bool{".": true}
	for _, f := range files {
		want[f] = true
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrUnverified, what, err)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		parent := path.Dir(rel)
		switch {
		case d.IsDir() && dirs[rel]:
			return nil
		case d.IsDir() && d.Name() == pyc.CacheDir && dirs[parent]:
			return nil
		case d.Type().IsRegular() && want[rel]:
			return nil
		case d.Type().IsRegular() && path.Base(parent) == pyc.CacheDir && dirs[path.Dir(parent)]:
			return nil
		}
		return fmt.Errorf("%w: %s: its cache folder holds %s, which the agent did not write", ErrUnverified, what, rel)
	})
}

// Cached returns the cached executor after verifying it again, as on
// every use (docs/protocol.md §7.3): its manifest and code, and that
// its folder holds nothing the agent did not write there (a module
// planted beside the code would shadow the standard library's, the
// executor's folder being the first on Python's path). The bytecode
// under __pycache__ and its list ([pyc.ListName]) are left to package
// pyc, which checks them. A cache entry that no longer verifies is deleted and
// the error wraps [ErrUnverified]: fetch it again. A missing entry is
// reported with [os.ErrNotExist].
func Cached(lay layout.Layout, name, manifestSHA, codeSHA string, server ed25519.PublicKey) (Executor, error) {
	if err := checkRequest(name, manifestSHA, codeSHA); err != nil {
		return Executor{}, err
	}
	dir := lay.Executor(name, manifestSHA)
	manifest, err := os.ReadFile(filepath.Join(dir, "manifest.toml"))
	if err != nil {
		return Executor{}, fmt.Errorf("executor %s: %w", name, err)
	}
	sig, err := os.ReadFile(filepath.Join(dir, "manifest.toml.sig"))
	if err != nil {
		sig = nil
	}
	code := func(p string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, filepath.FromSlash(p))) }
	m, err := verify(name, manifestSHA, codeSHA, manifest, sig, code, server)
	if err == nil {
		err = foreign(dir, name, m.Code.Files)
	}
	if errors.Is(err, ErrUnverified) {
		os.RemoveAll(dir)
		return Executor{}, fmt.Errorf("%w (the cache entry %s was deleted)", err, dir)
	}
	if err != nil {
		return Executor{}, err
	}
	return Executor{Name: name, Dir: dir, Entry: filepath.Join(dir, filepath.FromSlash(m.Code.Files[0])), Manifest: m}, nil
}
