package wire

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

// protocolDoc is the project's protocol document, whose test vectors
// this file checks.
const protocolDoc = "../docs/protocol.md"

// docVector is one ```vector block of the protocol document: its fields
// in order ("input" may repeat), and the line the block starts on.
type docVector struct {
	line   int
	fields map[string][]string
}

func (v docVector) get(t *testing.T, k string) string {
	t.Helper()
	vs := v.fields[k]
	if len(vs) != 1 {
		t.Fatalf("%s:%d: vector %q has %d %q fields, want 1", protocolDoc, v.line, v.name(), len(vs), k)
	}
	return vs[0]
}

func (v docVector) has(k string) bool { return len(v.fields[k]) > 0 }

func (v docVector) name() string {
	if n := v.fields["name"]; len(n) > 0 {
		return n[0]
	}
	return "?"
}

// vectorFields are the fields a vector block may have.
var vectorFields = []string{"name", "kind", "input", "canonical", "canonical-hex", "key-seed", "public-key", "public-key-hex", "server-fingerprint", "signature"}

// readVectors extracts every ```vector block of the document.
func readVectors(t *testing.T) []docVector {
	t.Helper()
	b, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	var out []docVector
	var cur *docVector
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && line == "```vector":
			cur = &docVector{line: n, fields: map[string][]string{}}
		case cur == nil:
		case line == "```":
			out = append(out, *cur)
			cur = nil
		default:
			k, v, ok := strings.Cut(line, ": ")
			if !ok || !slices.Contains(vectorFields, k) {
				t.Fatalf("%s:%d: %q is not a vector field line (field: value, fields %v)", protocolDoc, n, line, vectorFields)
			}
			cur.fields[k] = append(cur.fields[k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: vector block not closed", protocolDoc, cur.line)
	}
	return out
}

// TestProtocolDocVectors checks every test vector of docs/protocol.md
// §3.5 against this package: a wrong canonical form, key or signature
// in the document fails here.
func TestProtocolDocVectors(t *testing.T) {
	vectors := readVectors(t)
	var names []string
	for _, v := range vectors {
		names = append(names, v.name())
	}
	// The document must keep every vector: one dropped would no longer
	// be checked.
	for _, want := range []string{"K1", "V1", "V2", "V3", "V4", "V5", "V6", "V7", "R1", "L1", "D1"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s has no vector %s (it has %v)", protocolDoc, want, names)
		}
	}
	for _, v := range vectors {
		t.Run(v.name(), func(t *testing.T) {
			switch kind := v.get(t, "kind"); kind {
			case "key":
				checkKeyVector(t, v)
			case "canonical", "invocation":
				checkCanonicalVector(t, v, kind == "invocation")
			case "body":
				checkBodyVector(t, v)
			case "unsignable":
				checkUnsignableVector(t, v)
			default:
				t.Fatalf("%s:%d: unknown kind %q", protocolDoc, v.line, kind)
			}
		})
	}
}

// vectorKey returns the vector's signing key (nil when it gives only a
// public key) and its public key, checking that the two agree.
func vectorKey(t *testing.T, v docVector) (ed25519.PrivateKey, ed25519.PublicKey) {
	t.Helper()
	var priv ed25519.PrivateKey
	var pub ed25519.PublicKey
	if v.has("key-seed") {
		seed, err := hex.DecodeString(v.get(t, "key-seed"))
		if err != nil || len(seed) != ed25519.SeedSize {
			t.Fatalf("key-seed is not %d hex bytes: %v", ed25519.SeedSize, err)
		}
		priv = ed25519.NewKeyFromSeed(seed)
		pub = priv.Public().(ed25519.PublicKey)
	}
	if v.has("public-key") {
		b, err := base64.RawURLEncoding.DecodeString(v.get(t, "public-key"))
		if err != nil || len(b) != ed25519.PublicKeySize {
			t.Fatalf("public-key is not %d b64url bytes: %v", ed25519.PublicKeySize, err)
		}
		if pub != nil && !pub.Equal(ed25519.PublicKey(b)) {
			t.Fatalf("public-key %s is not the key-seed's (%s)", v.get(t, "public-key"), base64.RawURLEncoding.EncodeToString(pub))
		}
		pub = b
	}
	if pub == nil {
		t.Fatal("the vector has neither key-seed nor public-key")
	}
	return priv, pub
}

func checkKeyVector(t *testing.T, v docVector) {
	priv, pub := vectorKey(t, v)
	if priv == nil || !v.has("public-key") {
		t.Fatal("a key vector needs key-seed and public-key")
	}
	if got := hex.EncodeToString(pub); got != v.get(t, "public-key-hex") {
		t.Errorf("public key in hex is %s, the document says %s", got, v.get(t, "public-key-hex"))
	}
	sum := sha256.Sum256(pub)
	if got := hex.EncodeToString(sum[:]); got != v.get(t, "server-fingerprint") {
		t.Errorf("SHA-256 of the public key is %s, the document says %s", got, v.get(t, "server-fingerprint"))
	}
}

// wantCanonical returns the vector's canonical bytes: canonical and
// canonical-hex, which must agree when both are given.
func wantCanonical(t *testing.T, v docVector) []byte {
	t.Helper()
	var want []byte
	if v.has("canonical") {
		want = []byte(v.get(t, "canonical"))
	}
	if v.has("canonical-hex") {
		b, err := hex.DecodeString(v.get(t, "canonical-hex"))
		if err != nil {
			t.Fatalf("canonical-hex: %v", err)
		}
		if want != nil && !bytes.Equal(want, b) {
			t.Fatalf("canonical and canonical-hex differ:\n%s\n%s", want, b)
		}
		want = b
	}
	if want == nil {
		t.Fatal("the vector has neither canonical nor canonical-hex")
	}
	return want
}

func checkCanonicalVector(t *testing.T, v docVector, invocation bool) {
	in, err := Decode([]byte(v.get(t, "input")))
	if err != nil {
		t.Fatalf("input: %v", err)
	}
	signed := in
	if invocation {
		m, ok := in.(map[string]any)
		if !ok {
			t.Fatal("an invocation vector's input must be an object")
		}
		signed = InvocationSigned(m)
		// What travels in the invocation is the signature given.
		if sig, ok := m["server_sig"]; ok && sig != v.get(t, "signature") {
			t.Errorf("the input's server_sig %v is not the vector's signature", sig)
		}
	}
	got, err := Canonical(signed)
	if err != nil {
		t.Fatal(err)
	}
	want := wantCanonical(t, v)
	if !bytes.Equal(got, want) {
		t.Fatalf("canonical bytes:\n got %s\nwant %s (the document)", got, want)
	}
	priv, pub := vectorKey(t, v)
	sig := v.get(t, "signature")
	if priv != nil {
		mine, err := SignCanonical(priv, signed)
		if err != nil {
			t.Fatal(err)
		}
		if mine != sig {
			t.Errorf("signature with key-seed is %s, the document says %s", mine, sig)
		}
	}
	if err := VerifyCanonical(pub, signed, sig); err != nil {
		t.Errorf("the document's signature does not verify: %v", err)
	}
	if err := VerifyBytes(pub, append(got, ' '), sig); !errors.Is(err, ErrBadSignature) {
		t.Errorf("the signature verified over other bytes: %v", err)
	}
}

func checkBodyVector(t *testing.T, v docVector) {
	body := []byte(v.get(t, "input"))
	priv, pub := vectorKey(t, v)
	sig := v.get(t, "signature")
	if priv != nil {
		if mine := SignBytes(priv, body); mine != sig {
			t.Errorf("signature with key-seed is %s, the document says %s", mine, sig)
		}
	}
	if err := VerifyBytes(pub, body, sig); err != nil {
		t.Errorf("the document's signature does not verify: %v", err)
	}
	// The body is signed as bytes: the same JSON with one byte more is
	// another message.
	if err := VerifyBytes(pub, append(body, ' '), sig); !errors.Is(err, ErrBadSignature) {
		t.Errorf("the signature verified over other bytes: %v", err)
	}
}

func checkUnsignableVector(t *testing.T, v docVector) {
	inputs := v.fields["input"]
	if len(inputs) == 0 {
		t.Fatal("an unsignable vector needs input lines")
	}
	for _, s := range inputs {
		x, err := Decode([]byte(s))
		if err != nil {
			t.Errorf("input %s: %v", s, err)
			continue
		}
		if b, err := Canonical(x); !errors.Is(err, ErrNotCanonical) {
			t.Errorf("Canonical(%s) = %q, %v; want an error wrapping ErrNotCanonical", s, b, err)
		}
	}
}
