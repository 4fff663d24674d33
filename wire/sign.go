package wire

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// ErrBadSignature is wrapped by every failed verification.
var ErrBadSignature = errors.New("wire: signature does not verify")

// EncodeSig encodes a signature as unpadded base64url, as the protocol
// sends it.
func EncodeSig(sig []byte) string { return base64.RawURLEncoding.EncodeToString(sig) }

// DecodeSig decodes a base64url signature, with or without padding (the
// server tolerates both).
func DecodeSig(s string) ([]byte, error) {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return nil, fmt.Errorf("wire: signature is not base64url: %w", err)
	}
	if len(b) != ed25519.SignatureSize {
		return nil, fmt.Errorf("wire: signature is %d bytes, want %d", len(b), ed25519.SignatureSize)
	}
	return b, nil
}

// SignBytes signs msg and returns the base64url signature: what the
// device puts in X-Metnos-Device-Sig over the exact body it sends.
func SignBytes(key ed25519.PrivateKey, msg []byte) string {
	return EncodeSig(ed25519.Sign(key, msg))
}

// VerifyBytes checks a base64url signature over msg.
func VerifyBytes(pub ed25519.PublicKey, msg []byte, sig string) error {
	b, err := DecodeSig(sig)
	if err != nil {
		return err
	}
	if len(pub) != ed25519.PublicKeySize || !ed25519.Verify(pub, msg, b) {
		return ErrBadSignature
	}
	return nil
}

// SignCanonical signs canonical(v), as the server signs invocations and
// descriptors.
func SignCanonical(key ed25519.PrivateKey, v any) (string, error) {
	b, err := Canonical(v)
	if err != nil {
		return "", err
	}
	return SignBytes(key, b), nil
}

// VerifyCanonical checks a base64url signature over canonical(v).
func VerifyCanonical(pub ed25519.PublicKey, v any, sig string) error {
	b, err := Canonical(v)
	if err != nil {
		return err
	}
	return VerifyBytes(pub, b, sig)
}

// InvocationSigned returns the object the server signs for an
// invocation (docs/protocol.md §3.4): exactly the fixed field list, defaults filled in
// for missing optional fields, managed_provider_grants only when
// non-empty and execution_context only when present and not null. inv is
// the invocation as [Decode] returns it; server_sig and any other field
// are left out.
func InvocationSigned(inv map[string]any) map[string]any {
	out := map[string]any{
		"invocation_id":   inv["invocation_id"],
		"turn_id":         orDefault(inv, "turn_id", ""),
		"executor":        inv["executor"],
		"manifest_sha256": inv["manifest_sha256"],
		"code_sha256":     inv["code_sha256"],
		"args":            inv["args"],
		"scope":           orDefault(inv, "scope", ""),
		"reversibility":   orDefault(inv, "reversibility", ""),
		"env_injections":  orDefault(inv, "env_injections", map[string]any{}),
		"deadline_ms":     orDefault(inv, "deadline_ms", int64(DefaultDeadlineMS)),
	}
	if g, ok := inv["managed_provider_grants"].([]any); ok && len(g) > 0 {
		out["managed_provider_grants"] = g
	}
	if c, ok := inv["execution_context"]; ok && c != nil {
		out["execution_context"] = c
	}
	return out
}

func orDefault(m map[string]any, k string, def any) any {
	if v, ok := m[k]; ok && v != nil {
		return v
	}
	return def
}
