package refserver

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

func TestRegisterSuccessAndIdempotency(t *testing.T) {
	h := newHarness(t)
	tok, err := h.srv.IssueToken("conf-pc", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	k := newKey(t)
	st, m := h.register(tok, k)
	if st != 200 {
		t.Fatalf("register: %d %v", st, m)
	}
	id, _ := m["device_id"].(string)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) {
		t.Errorf("device_id %q is not 32 lowercase hex", id)
	}
	if m["name"] != "conf-pc" || m["owner_user_id"] != TokenOwner {
		t.Errorf("name/owner: %v", m)
	}
	if m["fingerprint"] != wire.ServerFingerprint(k.Public().(ed25519.PublicKey)) {
		t.Errorf("fingerprint %v", m["fingerprint"])
	}
	if m["server_public_key"] != wire.PublicKeyWire(h.srv.PublicKey()) {
		t.Errorf("server_public_key %v", m["server_public_key"])
	}
	pa, _ := m["paired_at"].(string)
	if _, err := time.Parse("2006-01-02T15:04:05Z", pa); err != nil || !strings.HasSuffix(pa, "Z") {
		t.Errorf("paired_at %q: %v", pa, err)
	}

	// Same token, same key: same device.
	if st, m2 := h.register(tok, k); st != 200 || m2["device_id"] != id {
		t.Errorf("idempotent register: %d %v", st, m2)
	}
	// Same token, another key: 409.
	if st, m2 := h.register(tok, newKey(t)); st != 409 || m2["error"] != wire.CodeTokenAlreadyUsed {
		t.Errorf("token reuse: %d %v", st, m2)
	}
	// Fresh token, known key: same device, renamed, revocation cleared.
	if err := h.srv.Revoke(id); err != nil {
		t.Fatal(err)
	}
	tok2, _ := h.srv.IssueToken("renamed", time.Minute)
	if st, m2 := h.register(tok2, k); st != 200 || m2["device_id"] != id || m2["name"] != "renamed" {
		t.Errorf("re-pair: %d %v", st, m2)
	}
	d, _ := h.srv.Device(id)
	if d.Revoked || d.Name != "renamed" || d.OSFamily != "linux" || len(h.srv.Devices()) != 1 {
		t.Errorf("device after re-pair: %+v", d)
	}
}

// forgeToken signs an arbitrary payload as a token.
func forgeToken(key ed25519.PrivateKey, payload string) string {
	enc := base64.RawURLEncoding
	return TokenPrefix + enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(ed25519.Sign(key, []byte(payload)))
}

func TestRegisterErrors(t *testing.T) {
	h := newHarness(t)
	key := h.srv.key
	good, _ := h.srv.IssueToken("pc", time.Minute)
	exp := h.clock.Now().Add(time.Hour).Unix()
	pub := pubWire(newKey(t))
	reg := func(tok string) string {
		b, _ := json.Marshal(map[string]string{"token": tok, "public_key": pub})
		return string(b)
	}
	cases := []struct {
		name, body string
		status     int
		code       string
	}{
		{"not JSON", `{"token":`, 400, wire.CodeInvalidJSON},
		{"not an object", `["DEV.x.y"]`, 400, wire.CodeInvalidJSON},
		{"no token", `{"public_key":"` + pub + `"}`, 400, wire.CodeMissingField},
		{"public_key not a string", `{"token":"` + good + `","public_key":5}`, 400, wire.CodeMissingField},
		{"bad prefix", reg("XYZ." + strings.TrimPrefix(good, TokenPrefix)), 400, wire.CodeInvalidToken},
		{"garbage", reg("DEV.!!!.???"), 400, wire.CodeInvalidToken},
		{"two parts", reg("DEV.abc"), 400, wire.CodeInvalidToken},
		{"other key", reg(forgeToken(newKey(t), `{"exp":9999999999,"name":"pc","owner":"host","tid":"aa","v":1}`)), 400, wire.CodeInvalidToken},
		{"never issued", reg(forgeToken(key, `{"exp":9999999999,"name":"pc","owner":"host","tid":"00ff","v":1}`)), 400, wire.CodeInvalidToken},
		{"wrong version", reg(forgeToken(key, `{"exp":9999999999,"name":"pc","owner":"host","tid":"00ff","v":2}`)), 400, wire.CodeInvalidToken},
		{"expired", reg(forgeToken(key, `{"exp":1000,"name":"pc","owner":"host","tid":"00ff","v":1}`)), 400, wire.CodeInvalidToken},
		{"bad name", reg(forgeToken(key, `{"exp":`+jsonInt(exp)+`,"name":"a b","owner":"host","tid":"00ff","v":1}`)), 400, wire.CodeInvalidToken},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, b, _ := h.do("POST", "/agent/register", []byte(c.body), nil)
			m := h.object(b)
			if st != c.status || m["error"] != c.code || m["message"] == "" {
				t.Errorf("got %d %v, want %d %s", st, m, c.status, c.code)
			}
		})
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestTokenFormatAndExpiry(t *testing.T) {
	h := newHarness(t)
	tok, err := h.srv.IssueToken("conf-pc", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != "DEV" {
		t.Fatalf("token %q is not DEV.<payload>.<sig>", tok)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.VerifyBytes(h.srv.PublicKey(), payload, parts[2]); err != nil {
		t.Errorf("token signature: %v", err)
	}
	v, err := wire.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	if canon, _ := wire.Canonical(v); string(canon) != string(payload) {
		t.Errorf("payload is not canonical: %s", payload)
	}
	m := v.(map[string]any)
	if len(m) != 5 || m["name"] != "conf-pc" || m["v"] != json.Number("1") || m["owner"] != TokenOwner {
		t.Errorf("payload %s", payload)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(m["tid"].(string)) {
		t.Errorf("tid %v", m["tid"])
	}
	exp, _ := m["exp"].(json.Number).Int64()
	if d := exp - h.clock.Now().Unix(); d < 590 || d > 600 {
		t.Errorf("exp is %ds ahead, want 600", d)
	}

	for _, bad := range []string{"", "a b", strings.Repeat("x", 41), "é"} {
		if _, err := h.srv.IssueToken(bad, time.Minute); err == nil {
			t.Errorf("IssueToken(%q) accepted", bad)
		}
	}
	h.clock.Advance(11 * time.Minute)
	if st, m := h.register(tok, newKey(t)); st != 400 || m["error"] != wire.CodeInvalidToken || !strings.Contains(m["message"].(string), "expired") {
		t.Errorf("expired token: %d %v", st, m)
	}
}
