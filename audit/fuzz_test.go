package audit

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/metnos/agent/wire"
)

// FuzzRedact redacts arbitrary JSON (or, when the bytes are not JSON,
// the bytes as one string) and checks what [Redact] promises: no panic;
// the input is left as it was; the output encodes as JSON, and as
// canonical JSON whenever the input does; no string left in it, key or
// value, has the shape of a secret; every value under a secret's key,
// or after a secret's flag in an array, is a placeholder; and the same
// input gives the same output.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{
		`{"path":"/home/ada/Photos","recursive":true,"depth":3}`,
		`{"api_key":"abc","nested":{"Authorization":"Bearer abcdef0123456789"},"author":"Ada"}`,
		`{"argv":["curl","-H","Authorization: Bearer abcdef0123456789abcdef","--token","hunter2","https://u:p@example.com/"]}`,
		`{"env":{"GITHUB_TOKEN":"ghp_1A2b3C4d5E6f7G8h9I0jK1l2M3n4O5p6Q7r8","HOME":"/home/ada"}}`,
		`{"sk-proj-abc123DEF456ghi789JKL012mno":"a key that is a secret"}`,
		`{"text":"my key is sk-proj-abc123DEF456ghi789JKL012mno.","jwt":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc_DEF-123"}`,
		`["--password",{"nested":"object"},"-session",["x"],"--auth"]`,
		`{"pem":"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"}`,
		`{"q":"https://api.example.com/v1/items?api_key=abc123&limit=5","id":"inv-1733150000000-abcdef"}`,
		`{"aws":"AKIAIOSFODNN7EXAMPLE","secret":"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY","n":18446744073709551615}`,
		`{"already":"redacted:blake3:0123456789abcdef","max_tokens":4096}`,
		`"Bearer abcdef0123456789"`,
		`[1,-0,1.5,1e300,null,false]`,
		"password: hunter2",
		"mysql --password=hunter2 -u root",
		"not json {",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := wire.Decode(b)
		if err != nil {
			in = string(b)
		}
		before, err := json.Marshal(in)
		if err != nil {
			t.Fatalf("the input %q does not encode: %v", b, err)
		}
		out := Redact(in)
		if after, _ := json.Marshal(in); !bytes.Equal(after, before) {
			t.Fatalf("Redact changed its input %s into %s", before, after)
		}
		got, err := json.Marshal(out)
		if err != nil {
			t.Fatalf("Redact(%s) does not encode as JSON: %v", before, err)
		}
		if _, err := wire.Canonical(in); err == nil {
			if _, err := wire.Canonical(out); err != nil {
				t.Fatalf("Redact(%s) = %s has no canonical form: %v", before, got, err)
			}
		}
		if again, _ := json.Marshal(Redact(in)); !bytes.Equal(again, got) {
			t.Fatalf("Redact(%s) gave %s, then %s", before, got, again)
		}
		checkRedacted(t, in, out)
	})
}

// checkRedacted walks in and Redact's out together, failing on a secret
// left in out or a secret's value not replaced.
func checkRedacted(t *testing.T, in, out any) {
	t.Helper()
	switch x := in.(type) {
	case string:
		s, ok := out.(string)
		if !ok || !isPlaceholder(s) && looksSecret(s) {
			t.Fatalf("Redact left %#v for %q", out, x)
		}
	case map[string]any:
		y, ok := out.(map[string]any)
		if !ok || len(y) != len(x) {
			t.Fatalf("Redact made %#v of the object %#v", out, x)
		}
		for k, e := range x {
			rk := k
			if looksSecret(k) {
				rk = placeholder(k)
			}
			got, ok := y[rk]
			if !ok {
				t.Fatalf("Redact lost the key %q (or put %q in its place)", k, rk)
			}
			if secretKey(k) {
				if s, ok := got.(string); !ok || !isPlaceholder(s) {
					t.Fatalf("Redact left %#v under the secret's key %q", got, k)
				}
				continue
			}
			checkRedacted(t, e, got)
		}
	case []any:
		y, ok := out.([]any)
		if !ok || len(y) != len(x) {
			t.Fatalf("Redact made %#v of the array %#v", out, x)
		}
		for i, e := range x {
			if i > 0 && secretFlag(x[i-1]) {
				if s, ok := y[i].(string); !ok || !isPlaceholder(s) {
					t.Fatalf("Redact left %#v after the flag %q", y[i], x[i-1])
				}
				continue
			}
			checkRedacted(t, e, y[i])
		}
	default:
		if out != in {
			t.Fatalf("Redact made %#v of %#v", out, in)
		}
	}
}

// isPlaceholder reports whether s is what Redact puts in a secret's
// place.
func isPlaceholder(s string) bool {
	h, ok := strings.CutPrefix(s, redactedPrefix)
	if !ok {
		return s == unencodable
	}
	_, err := hex.DecodeString(h)
	return len(h) == 16 && err == nil
}
