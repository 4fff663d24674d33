package wire

import (
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// RuntimeDescriptor is the server's signed description of a Python
// runtime archive (docs/protocol.md §11).
type RuntimeDescriptor struct {
	Version       int64  `json:"version"`
	Filename      string `json:"filename"`
	ArchiveSHA256 string `json:"archive_sha256"`
	ArchiveSize   int64  `json:"archive_size"`
}

var runtimeNameRule = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._+-]+$`) })

// ValidRuntimeName reports whether name is a runtime archive name a
// device may ask for (docs/protocol.md §11): non-empty, at most 240 characters of
// [A-Za-z0-9._+-], no "..", ending in .tar.gz.
func ValidRuntimeName(name string) bool {
	return len(name) <= 240 && runtimeNameRule().MatchString(name) &&
		!strings.Contains(name, "..") && strings.HasSuffix(name, ".tar.gz")
}

// SignRuntimeDescriptor returns the signed descriptor envelope of a
// runtime archive, {"descriptor": {...}, "sig": "<b64url>"}, the
// signature being over the canonical descriptor {archive_sha256,
// archive_size, filename, version: 1}.
func SignRuntimeDescriptor(key ed25519.PrivateKey, filename, sha256Hex string, size int64) (map[string]any, error) {
	d := map[string]any{"version": 1, "filename": filename, "archive_sha256": sha256Hex, "archive_size": size}
	sig, err := SignCanonical(key, d)
	if err != nil {
		return nil, fmt.Errorf("wire: signing the descriptor of %s: %w", filename, err)
	}
	return map[string]any{"descriptor": d, "sig": sig}, nil
}

// VerifyRuntimeDescriptor checks a descriptor envelope (the body of GET
// /agent/runtime/descriptor/{filename}) against the pinned server key
// and the archive name asked for, and returns the descriptor.
func VerifyRuntimeDescriptor(body []byte, key ed25519.PublicKey, filename string) (RuntimeDescriptor, error) {
	v, err := Decode(body)
	env, _ := v.(map[string]any)
	if err != nil || env == nil {
		return RuntimeDescriptor{}, fmt.Errorf("runtime descriptor: not a JSON object: %v", err)
	}
	desc, _ := env["descriptor"].(map[string]any)
	sig, _ := env["sig"].(string)
	if desc == nil {
		return RuntimeDescriptor{}, errors.New("runtime descriptor: no descriptor")
	}
	if err := VerifyCanonical(key, desc, sig); err != nil {
		return RuntimeDescriptor{}, fmt.Errorf("runtime descriptor for %s: %w (not signed by the paired server)", filename, err)
	}
	b, _ := json.Marshal(desc)
	var d RuntimeDescriptor
	if err := json.Unmarshal(b, &d); err != nil {
		return RuntimeDescriptor{}, fmt.Errorf("runtime descriptor: %w", err)
	}
	if _, herr := hex.DecodeString(d.ArchiveSHA256); d.Version != 1 || d.ArchiveSize <= 0 || len(d.ArchiveSHA256) != 64 || herr != nil || d.Filename != filename {
		return RuntimeDescriptor{}, fmt.Errorf("runtime descriptor for %s: version %d, size %d, sha256 %q, filename %q: not a valid descriptor of that archive", filename, d.Version, d.ArchiveSize, d.ArchiveSHA256, d.Filename)
	}
	return d, nil
}
