package refserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/metnos/agent/wire"
)

// TokenPrefix starts every device pairing token (docs/protocol.md §4.1).
const TokenPrefix = "DEV."

// TokenOwner is the owner user id written into the tokens this server
// issues (Metnos's default actor).
const TokenOwner = "host"

// deviceNameRule is the device name rule of docs/protocol.md §4.1.
// deviceNameRule is unbounded; validName checks the length (40): a
// bounded repeat compiles to a program that long, at every start of an
// agent that links the reference server (demo).
var deviceNameRule = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._-]+$`) })

// validName reports whether name is a device name Metnos accepts:
// ^[A-Za-z0-9._-]{1,40}$.
func validName(name string) bool { return len(name) <= 40 && deviceNameRule().MatchString(name) }

// tokenUse is what the server remembers of an issued token.
type tokenUse struct {
	consumedBy string // fingerprint of the key that registered with it, "" = unused
	deviceID   string
}

// tokenPayload is the signed payload of a token.
type tokenPayload struct {
	Exp   int64
	Name  string
	Owner string
	TID   string
}

// IssueToken issues a one-time pairing token for a device called name,
// valid for ttl: DEV.<b64url payload>.<b64url sig>, the payload being the
// canonical {"exp","name","owner","tid","v":1} signed by the server key.
// Only tokens issued by this Server (since it was created) register.
func (s *Server) IssueToken(name string, ttl time.Duration) (string, error) {
	if !validName(name) {
		return "", fmt.Errorf("refserver: device name %q is not valid: use 1 to 40 of A-Z a-z 0-9 . _ -", name)
	}
	if ttl <= 0 {
		return "", fmt.Errorf("refserver: token for %s: ttl %s must be positive", name, ttl)
	}
	tid := make([]byte, 16)
	if _, err := rand.Read(tid); err != nil {
		return "", fmt.Errorf("refserver: token for %s: %w", name, err)
	}
	payload := map[string]any{
		"exp":   s.now().Add(ttl).Unix(),
		"name":  name,
		"owner": TokenOwner,
		"tid":   hex.EncodeToString(tid),
		"v":     1,
	}
	b, err := wire.Canonical(payload)
	if err != nil {
		return "", fmt.Errorf("refserver: token for %s: %w", name, err)
	}
	s.mu.Lock()
	s.tokens[payload["tid"].(string)] = &tokenUse{}
	s.mu.Unlock()
	enc := base64.RawURLEncoding
	return TokenPrefix + enc.EncodeToString(b) + "." + enc.EncodeToString(ed25519.Sign(s.key, b)), nil
}

// parseToken checks a token's format, signature, version, expiry and
// name. Whether it was issued here is the caller's business.
func parseToken(tok string, pub ed25519.PublicKey, now time.Time) (tokenPayload, error) {
	if !strings.HasPrefix(tok, TokenPrefix) {
		return tokenPayload{}, errors.New("token does not start with DEV.")
	}
	parts := strings.Split(strings.TrimPrefix(tok, TokenPrefix), ".")
	if len(parts) != 2 {
		return tokenPayload{}, errors.New("token is not DEV.<payload>.<signature>")
	}
	dec := func(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "=")) }
	payload, err := dec(parts[0])
	if err != nil {
		return tokenPayload{}, fmt.Errorf("token payload is not base64url: %w", err)
	}
	sig, err := dec(parts[1])
	if err != nil {
		return tokenPayload{}, fmt.Errorf("token signature is not base64url: %w", err)
	}
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(pub, payload, sig) {
		return tokenPayload{}, errors.New("token signature is not trusted")
	}
	m, ok := decodeObject(payload)
	if !ok {
		return tokenPayload{}, errors.New("token payload is not a JSON object")
	}
	if v, _ := m["v"].(json.Number); v != "1" {
		return tokenPayload{}, errors.New("token version is not 1")
	}
	var p tokenPayload
	expN, _ := m["exp"].(json.Number)
	p.Exp, err = strconv.ParseInt(string(expN), 10, 64)
	if err != nil {
		return tokenPayload{}, errors.New("token has no integer exp")
	}
	p.Name, _ = m["name"].(string)
	p.Owner, _ = m["owner"].(string)
	p.TID, _ = m["tid"].(string)
	if p.TID == "" || !validName(p.Name) {
		return tokenPayload{}, errors.New("token payload lacks a tid or a valid name")
	}
	if now.Unix() >= p.Exp {
		return tokenPayload{}, fmt.Errorf("token expired at %s: issue a new one", time.Unix(p.Exp, 0).UTC().Format(time.RFC3339))
	}
	return p, nil
}
