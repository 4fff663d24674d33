package wire_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"testing"

	"github.com/metnos/agent/wire"
)

// FuzzCanonical feeds arbitrary bytes to [wire.Decode] and whatever
// decodes to [wire.Canonical], and checks the round trip the signatures
// rely on: the canonical bytes are valid JSON, decode to a value equal
// to the first (integers compared by value, since "-0" and "0" are the
// same number), and re-encode to the very same bytes. Input that is not
// JSON, or has no canonical form, must be refused with an error (the
// latter wrapping [wire.ErrNotCanonical]), never a panic.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`[]`,
		`null`,
		`true`,
		`"plain"`,
		`0`,
		`-0`,
		`18446744073709551615`, // max uint64
		`18446744073709551616`, // one more: refused
		`-9223372036854775808`, // min int64
		`-9223372036854775809`, // one less: refused
		`1.5`,                  // floats are refused
		`1e3`,                  // and exponents
		`{"b":1,"a":[true,false,null],"é":"x","A":{}}`,
		`{"a":1,"a":2}`, // duplicate key: the last wins
		`{"esc":"\"\\\/\b\f\n\r\t\u0000\u001f\u007f\u2028<>&"}`,
		`{"surrogate":"\ud83d\ude00","lone":"\ud800"}`,
		"{\"raw\":\"caf\xc3\xa9 \xff\"}", // invalid UTF-8 becomes U+FFFD
		`{"type":"invocation","id":"inv-1","args":{"path":"/tmp/a b","n":3},"sig":"AAAA"}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
		` {"a" : [ 1 , 2 ] } `,
		`{"a":1} {"b":2}`, // trailing data
		`{"a":1}x`,
		`{"a":`,
		`[1,]`,
		`"\u00"`,
		"\xef\xbb\xbf{}", // a byte order mark
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := wire.Decode(b)
		if err != nil {
			return
		}
		c, err := wire.Canonical(v)
		if err != nil {
			if !errors.Is(err, wire.ErrNotCanonical) {
				t.Fatalf("Canonical(%q): %v, which does not wrap ErrNotCanonical", b, err)
			}
			return
		}
		if !json.Valid(c) {
			t.Fatalf("Canonical(%q) = %q, not valid JSON", b, c)
		}
		again, err := wire.Canonical(v)
		if err != nil || !bytes.Equal(again, c) {
			t.Fatalf("Canonical(%q) is not deterministic: %q then %q (%v)", b, c, again, err)
		}
		v2, err := wire.Decode(c)
		if err != nil {
			t.Fatalf("the canonical form %q of %q does not decode: %v", c, b, err)
		}
		if !sameValue(v, v2) {
			t.Fatalf("the canonical form %q of %q decodes to %#v, not %#v", c, b, v2, v)
		}
		c2, err := wire.Canonical(v2)
		if err != nil || !bytes.Equal(c2, c) {
			t.Fatalf("canonical(decode(%q)) = %q (%v), not the same bytes", c, c2, err)
		}
	})
}

// sameValue compares two values as [wire.Decode] returns them, numbers
// by their integer value.
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool, string:
		return a == b
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		m, okm := new(big.Int).SetString(string(x), 10)
		n, okn := new(big.Int).SetString(string(y), 10)
		return okm && okn && m.Cmp(n) == 0
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, e := range x {
			f, ok := y[k]
			if !ok || !sameValue(e, f) {
				return false
			}
		}
		return true
	}
	return false
}
