package wire

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"
)

// testKey is the protocol's throwaway test key (docs/protocol.md §3.5).
func testKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	seed, _ := hex.DecodeString("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	k := ed25519.NewKeyFromSeed(seed)
	if got := base64.RawURLEncoding.EncodeToString(k.Public().(ed25519.PublicKey)); got != "A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg" {
		t.Fatalf("test key's public key is %s, not the spec's", got)
	}
	return k
}

func decode(t *testing.T, s string) any {
	t.Helper()
	v, err := Decode([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkVector checks canonical(v) against the protocol's bytes and the
// test key's signature over them.
func checkVector(t *testing.T, v any, wantCanon []byte, wantSig string) {
	t.Helper()
	got, err := Canonical(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(wantCanon) {
		t.Fatalf("canonical bytes:\n got %s\nwant %s", got, wantCanon)
	}
	k := testKey(t)
	if sig := SignBytes(k, got); sig != wantSig {
		t.Errorf("signature %s, want %s", sig, wantSig)
	}
	if err := VerifyCanonical(k.Public().(ed25519.PublicKey), v, wantSig); err != nil {
		t.Errorf("the spec's signature does not verify: %v", err)
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestVectorV1KeyOrder(t *testing.T) {
	checkVector(t, decode(t, `{"b": 1, "a": {"z": true, "e": ["x", 2]}}`),
		mustHex(t, "7b2261223a7b2265223a5b2278222c325d2c227a223a747275657d2c2262223a317d"),
		"IESPivPEospdQOfwbal53WnPZhKQ4KcyJ6fyXWAr74IDy8-laA1nucm6XmQfBDE639ILXBlcbzJ1xkiO8KHTAQ")
}

func TestVectorV2Escaping(t *testing.T) {
	v := decode(t, `{"u": "\u2028<&>\ud83d\ude00", "s": "a\"b\\c\n\t\u0001\u007f/", "k": "citt\u00e0"}`)
	checkVector(t, v,
		mustHex(t, "7b226b223a2263697474c3a0222c2273223a22615c22625c5c635c6e5c745c75303030317f2f222c2275223a22e280a83c263ef09f9880227d"),
		"pBCd7pzJrmON96pLiSNl90B_6yfRVKFghtOShRtiGX-n1aKxBQEjXVlpKgTyjvi4XPgH2tRz0obfEc9m7XvSCw")
	// encoding/json is not canonical: it escapes <, >, & and U+2028.
	if b, _ := json.Marshal(v); string(b) == string(mustHex(t, "7b226b223a2263697474c3a0222c2273223a22615c22625c5c635c6e5c745c75303030317f2f222c2275223a22e280a83c263ef09f9880227d")) {
		t.Error("json.Marshal matched the canonical bytes; the vector would not catch a lazy encoder")
	}
}

const (
	v3Manifest = "8e9fcf0b4f9fdfe0863a8e9fbf3419e956983dc26c322fb23a28cd62e8152fdb"
	v3Code     = "0dbab07bde0efb98b33baaeed94f10fe2569803aa7ddf168410cd15c3bc9ce98"
)

func TestVectorV3Invocation(t *testing.T) {
	inv := decode(t, `{"invocation_id":"inv-18ed65bd51bdc701fcd26b58","turn_id":"turn-1","executor":"echo_args",
		"manifest_sha256":"`+v3Manifest+`","code_sha256":"`+v3Code+`",
		"args":{"q":"citt\u00e0","n":3,"paths":["C:\\Users\\x\\Documents"]},"scope":"device","reversibility":"read_only",
		"env_injections":{"METNOS_TURN_ID":"turn-1","METNOS_LANG":"it"},"deadline_ms":30000,
		"server_sig":"ignored","shim_sha256":"transport metadata, not signed"}`).(map[string]any)
	checkVector(t, InvocationSigned(inv),
		[]byte(`{"args":{"n":3,"paths":["C:\\Users\\x\\Documents"],"q":"città"},"code_sha256":"`+v3Code+`","deadline_ms":30000,"env_injections":{"METNOS_LANG":"it","METNOS_TURN_ID":"turn-1"},"executor":"echo_args","invocation_id":"inv-18ed65bd51bdc701fcd26b58","manifest_sha256":"`+v3Manifest+`","reversibility":"read_only","scope":"device","turn_id":"turn-1"}`),
		"LRpJ9kJt-JzmV1Ms2feZQBRYROSag4aZgO5bJhxlwLkw1qe_9wqq9cjFFyLNmkwX7hjpKAWt0L0x6UbcpQeICg")
}

func TestVectorsV4V5Descriptors(t *testing.T) {
	for _, c := range []struct{ canon, sig string }{
		{`{"archive_sha256":"22c27b021752596140145a93194d9cdf33b0b1b454f50fd1b430491eb3eb3cb9","archive_size":25600,"filename":"cpython-3.12.13+20260623-x86_64-pc-windows-msvc-install_only.tar.gz","version":1}`,
			"bGnriNvpflq6k6vr28uxDE8dDfHsw_8EzD9d8LDcRern3i6uLWyoWfzLWRMXQNPEBo55ySVeA0AnHeDWOUAxAg"},
		{`{"sha256":"c73f954a0dcd410afe8d2117ec8a4bef49cf677c60045a5f21acfa2a756ff7d5","target":"x86_64-pc-windows-gnu","version":"0.2.56"}`,
			"KUEBKUhtDBRp7YLQA-Z9cTrfutbLVSjCrKBLYl7UTThWx6g0sfbHhnlDtVr5GnJdJdGm7hhckbdhFl6-ZCQ8CQ"},
	} {
		checkVector(t, decode(t, c.canon), []byte(c.canon), c.sig)
	}
}

func TestVectorV6FloatsRefused(t *testing.T) {
	for _, s := range []string{`{"x":1.5}`, `{"x":1e3}`, `[1.0]`, `{"big":18446744073709551616}`, `{"neg":-9223372036854775809}`} {
		if _, err := Canonical(decode(t, s)); !errors.Is(err, ErrNotCanonical) {
			t.Errorf("Canonical(%s) = %v, want ErrNotCanonical", s, err)
		}
	}
	if _, err := Canonical(map[string]any{"x": 0.5}); !errors.Is(err, ErrNotCanonical) {
		t.Errorf("a float64 was canonicalised: %v", err)
	}
	if _, err := Canonical("\xff"); !errors.Is(err, ErrNotCanonical) {
		t.Errorf("invalid UTF-8 was canonicalised: %v", err)
	}
}

func TestVectorV7DeviceBody(t *testing.T) {
	body := []byte(`{"block_ms":25000,"capabilities":["fs","net","pkg"],"cursor":null,"device_id":"7d2397b0895e48a190a155fb289168d5"}`)
	const want = "6WARWSSAuTYqnKNkW1n9cpVUX9HSGGY-12muRvowZwRjySb_nj6UsO3UxuZiseYbJUPeapvSaT0cAMOjXtI7Cw"
	k := testKey(t)
	if got := SignBytes(k, body); got != want {
		t.Errorf("X-Metnos-Device-Sig %s, want %s", got, want)
	}
	// One byte more (a space) and the same signature fails: the body is
	// signed as sent, never re-serialised.
	if err := VerifyBytes(k.Public().(ed25519.PublicKey), append(body, ' '), want); !errors.Is(err, ErrBadSignature) {
		t.Errorf("a changed body verified: %v", err)
	}
}

// L1 was signed by the real Metnos server code.
func TestVectorL1LiveServer(t *testing.T) {
	pubRaw, _ := base64.RawURLEncoding.DecodeString("uw1qxYcj8vFOBS79x-pCuqNZcZj1WcnGFQ94-Y8Mz5M")
	inv := decode(t, `{"invocation_id":"inv-18ed65c1b62bb720c5a98390","turn_id":"","executor":"echo_args",
		"manifest_sha256":"`+v3Manifest+`","code_sha256":"`+v3Code+`",
		"args":{"s":"a\"b\\c\n\t\u0001\u007f/é","u":"\u2028\u2029<&>😀","big":9007199254740993,"neg":-5,"list":[{"z":1,"a":[]},{}],"t":true,"f":false,"nul":null,"ключ":"значение","Z":"upper-before-lower"},
		"scope":"device","reversibility":"revertible","env_injections":{},"deadline_ms":5000,
		"server_sig":"KTUKkS7-fGoh5w_qZuZGq3Ll4aIvqS2x3PcSGNNQEP0iKQZZaMQQbxdaD_JQfVsqFv_1N41wjIMx1Pi8FP1qAQ"}`).(map[string]any)
	want := mustHex(t, "7b2261726773223a7b225a223a2275707065722d6265666f72652d6c6f776572222c22626967223a393030373139393235343734303939332c2266223a66616c73652c226c697374223a5b7b2261223a5b5d2c227a223a317d2c7b7d5d2c226e6567223a2d352c226e756c223a6e756c6c2c2273223a22615c22625c5c635c6e5c745c75303030317f2fc3a9222c2274223a747275652c2275223a22e280a8e280a93c263ef09f9880222c22d0bad0bbd18ed187223a22d0b7d0bdd0b0d187d0b5d0bdd0b8d0b5227d2c22636f64655f736861323536223a2230646261623037626465306566623938623333626161656564393466313066653235363938303361613764646631363834313063643135633362633963653938222c22646561646c696e655f6d73223a353030302c22656e765f696e6a656374696f6e73223a7b7d2c226578656375746f72223a226563686f5f61726773222c22696e766f636174696f6e5f6964223a22696e762d313865643635633162363262623732306335613938333930222c226d616e69666573745f736861323536223a2238653966636630623466396664666530383633613865396662663334313965393536393833646332366333323266623233613238636436326538313532666462222c227265766572736962696c697479223a2272657665727469626c65222c2273636f7065223a22646576696365222c227475726e5f6964223a22227d")
	signed := InvocationSigned(inv)
	got, err := Canonical(signed)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 536 || string(got) != string(want) {
		t.Fatalf("canonical bytes (%d):\n got %s\nwant %s", len(got), got, want)
	}
	if err := VerifyCanonical(ed25519.PublicKey(pubRaw), signed, inv["server_sig"].(string)); err != nil {
		t.Errorf("the real server's signature does not verify: %v", err)
	}
	// Tampering with any argument breaks it.
	inv["args"].(map[string]any)["neg"] = json.Number("-6")
	if err := VerifyCanonical(ed25519.PublicKey(pubRaw), InvocationSigned(inv), inv["server_sig"].(string)); !errors.Is(err, ErrBadSignature) {
		t.Errorf("a tampered invocation verified: %v", err)
	}
}

func TestInvocationDefaults(t *testing.T) {
	s := InvocationSigned(map[string]any{"invocation_id": "inv-x", "managed_provider_grants": []any{}, "execution_context": nil})
	b, err := Canonical(s)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"args":null,"code_sha256":null,"deadline_ms":60000,"env_injections":{},"executor":null,"invocation_id":"inv-x","manifest_sha256":null,"reversibility":"","scope":"","turn_id":""}`
	if string(b) != want {
		t.Errorf("defaults:\n got %s\nwant %s", b, want)
	}
}
