package wire

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// Paths of the device endpoints (docs/protocol.md §5.1). The ones ending in '/' take the
// executor name or the runtime archive name after them.
const (
	PathRegister          = "/agent/register"
	PathPoll              = "/agent/poll"
	PathHeartbeat         = "/agent/heartbeat"
	PathResult            = "/agent/result"
	PathExecutor          = "/agent/executor/"
	PathShim              = "/agent/shim"
	PathRuntimeDescriptor = "/agent/runtime/descriptor/"
	PathRuntime           = "/agent/runtime/"
	PathHealth            = "/agent/health"
)

// SigHeader carries the device's signature over the exact bytes of a
// signed request body (poll, heartbeat, result).
const SigHeader = "X-Metnos-Device-Sig"

// DefaultDeadlineMS is the deadline_ms of an invocation that has none
// (docs/protocol.md §16).
const DefaultDeadlineMS = 60000

// MaxBodyBytes is the server's limit on a request body (docs/protocol.md §16):
// larger bodies are refused with 413.
const MaxBodyBytes = 4 << 20

// Error codes of the server's {"error": code, "message": text} bodies
// (docs/protocol.md §4.2, §5).
const (
	CodeInvalidJSON        = "invalid_json"
	CodeMissingField       = "missing_field"
	CodeInvalidToken       = "invalid_token"
	CodeTokenAlreadyUsed   = "token_already_used"
	CodeMissingSignature   = "missing_signature"
	CodeUnknownDevice      = "unknown_device"
	CodeBadSignature       = "bad_signature"
	CodeInvalidResult      = "invalid_result"
	CodeInvalidName        = "invalid_name"
	CodeUnknownExecutor    = "unknown_executor"
	CodeUnverifiedExecutor = "unverified_executor"
	CodeInternal           = "internal_error"
)

// Error classes a result's error_class carries when the device, not the
// executor, sets it (docs/protocol.md §9.2).
const (
	ClassTimeout                 = "timeout"
	ClassDeviceError             = "device_error"
	ClassExecutionOutcomeUnknown = "execution_outcome_unknown"
	ClassInvocationRefused       = "invocation_refused"
	ClassResultTooLarge          = "result_too_large"
	// ClassInterrupted is the class of a run of an executor that writes
	// nothing, cut short because the agent was asked to stop and its
	// stop budget ran low (one that writes is
	// ClassExecutionOutcomeUnknown).
	ClassInterrupted = "interrupted"
)

// Registration is the server's answer to POST /agent/register (docs/protocol.md §4.2).
type Registration struct {
	DeviceID        string  `json:"device_id"`
	Name            string  `json:"name"`
	OwnerUserID     string  `json:"owner_user_id"`
	Fingerprint     string  `json:"fingerprint"`
	PairedAt        string  `json:"paired_at"`
	ServerPublicKey *string `json:"server_public_key"`
}

// PollResponse is the answer to POST /agent/poll (docs/protocol.md §5.3). Invocation is
// the invocation object as [Decode] returns it (nil when none); see
// [ParseInvocation].
type PollResponse struct {
	Invocation          any
	ShimSHA256          string
	ServerClientVersion string
}

// ExecutorBundle is the body of GET /agent/executor/{name} (docs/protocol.md §5.6).
type ExecutorBundle struct {
	Name         string            `json:"name"`
	ManifestTOML string            `json:"manifest_toml"` // standard base64
	ManifestSig  string            `json:"manifest_sig"`  // standard base64 of 64 raw bytes
	Files        map[string]string `json:"files"`         // path -> standard base64
}

// ShimBundle is the body of GET /agent/shim (docs/protocol.md §5.7): the Python helpers
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

// SafePath reports whether a bundle path is safe to write beneath a
// directory: relative, '/'-separated, no empty, '.' or '..' segment, no
// '\' or ':'.
func SafePath(p string) bool {
	if p == "" || strings.ContainsAny(p, `\:`) || strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// ExecutorNamePattern is the rule of executor names, in GET
// /agent/executor/{name} and in the invocation's executor (docs/protocol.md §5.6).
const ExecutorNamePattern = `^[a-z][a-z0-9_-]{1,64}$`

// executorName is ExecutorNamePattern without its bound, which
// ValidExecutorName checks on the length: a bounded repeat compiles to a
// program that long, at every start of the agent.
var executorName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9_-]+$`) })

// ValidExecutorName reports whether name matches [ExecutorNamePattern].
func ValidExecutorName(name string) bool { return len(name) <= 65 && executorName().MatchString(name) }

// ServerFingerprint is the server's fingerprint of a device: SHA-256 of
// the raw public key, lower-case hex (docs/protocol.md §2.3), the value state.json keeps.
func ServerFingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:])
}

// PublicKeyWire is a public key as the protocol sends it (the device's
// in /agent/register, the server's in the registration): base64url, no
// padding.
func PublicKeyWire(pub ed25519.PublicKey) string { return base64.RawURLEncoding.EncodeToString(pub) }
