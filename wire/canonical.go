// Package wire holds what metnos-agent and the Metnos server exchange:
// canonical JSON, Ed25519 signatures and the messages of the device
// protocol (docs/protocol.md).
//
// # Canonical JSON
//
// The server signs canonical(payload) and the device rebuilds the same
// bytes from the JSON it parsed (docs/protocol.md §3.1–§3.2): keys sorted by code point,
// no whitespace, strings in raw UTF-8 with only '"', '\\' and the C0
// controls escaped (lower-case \u00xx), integers only. encoding/json is
// not canonical (it escapes <, >, & and U+2028/U+2029, and floats would
// corrupt large integers), so [Canonical] is written by hand, and JSON is
// decoded with [Decode], which keeps numbers as [json.Number].
//
// # Signatures
//
// Server-to-device objects carry a signature over their canonical bytes;
// device-to-server bodies are signed as the exact bytes sent, and a
// re-delivered body is sent byte for byte again (docs/protocol.md §3.1). Signatures travel
// as unpadded base64url.
//
// # Messages
//
// Every message, path, header, error code and constant of the device
// protocol is declared here, once: the device (packages client and
// agent) and the reference server (package refserver) both import this
// package, and neither imports the other. The verification rules that
// need no device state are here too: [ParseInvocation],
// [Invocation.Verify], [CheckID], [VerifyRuntimeDescriptor],
// [SafePath], [ValidExecutorName], [ShimDigest].
//
// # What it does not do
//
// Package wire does no I/O and keeps no state: it neither sends nor
// receives (package client does, for the device), it does not check an
// executor bundle against the invocation that asked for it nor write it
// anywhere (package agent does), and it imports no device code.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"unicode/utf8"
)

// ErrNotCanonical is wrapped by every error of [Canonical]: the value
// holds something the protocol cannot sign (a float, a NaN, an unknown
// type, invalid UTF-8).
var ErrNotCanonical = errors.New("wire: value has no canonical form")

// Decode parses JSON keeping numbers exact ([json.Number]), as
// [Canonical] needs. It rejects trailing data.
func Decode(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("wire: decoding JSON: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("wire: decoding JSON: trailing data after the value")
	}
	return v, nil
}

// Canonical returns the canonical bytes of v, a value as [Decode] returns
// it (map[string]any, []any, string, json.Number, bool, nil), also with
// Go integers for values built in code.
func Canonical(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(w *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case nil:
		w.WriteString("null")
	case bool:
		if x {
			w.WriteString("true")
		} else {
			w.WriteString("false")
		}
	case string:
		return writeString(w, x)
	case json.Number:
		return writeNumber(w, string(x))
	case int:
		w.WriteString(strconv.FormatInt(int64(x), 10))
	case int64:
		w.WriteString(strconv.FormatInt(x, 10))
	case uint64:
		w.WriteString(strconv.FormatUint(x, 10))
	case float64:
		return fmt.Errorf("%w: float %v (only integers can be signed)", ErrNotCanonical, x)
	case []any:
		w.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				w.WriteByte(',')
			}
			if err := writeCanonical(w, e); err != nil {
				return err
			}
		}
		w.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		// Sorting UTF-8 bytes sorts by code point.
		sort.Strings(keys)
		w.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				w.WriteByte(',')
			}
			if err := writeString(w, k); err != nil {
				return err
			}
			w.WriteByte(':')
			if err := writeCanonical(w, x[k]); err != nil {
				return fmt.Errorf("%q: %w", k, err)
			}
		}
		w.WriteByte('}')
	default:
		return fmt.Errorf("%w: unsupported type %T", ErrNotCanonical, v)
	}
	return nil
}

// writeNumber writes a JSON number literal if it is an integer that
// fits in int64 or uint64 (the Rust client's limit; a larger literal is a
// float to it), in plain decimal.
func writeNumber(w *bytes.Buffer, s string) error {
	n, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return fmt.Errorf("%w: number %s is not an integer (only integers can be signed)", ErrNotCanonical, s)
	}
	if n.Sign() < 0 && !n.IsInt64() || n.Sign() >= 0 && !n.IsUint64() {
		return fmt.Errorf("%w: integer %s does not fit in 64 bits", ErrNotCanonical, s)
	}
	w.WriteString(n.String())
	return nil
}

const hexDigits = "0123456789abcdef"

// writeString writes s as a canonical JSON string.
func writeString(w *bytes.Buffer, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: string is not valid UTF-8", ErrNotCanonical)
	}
	w.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			w.WriteString(`\"`)
		case '\\':
			w.WriteString(`\\`)
		case '\b':
			w.WriteString(`\b`)
		case '\f':
			w.WriteString(`\f`)
		case '\n':
			w.WriteString(`\n`)
		case '\r':
			w.WriteString(`\r`)
		case '\t':
			w.WriteString(`\t`)
		default:
			if c < 0x20 {
				w.WriteString(`\u00`)
				w.WriteByte(hexDigits[c>>4])
				w.WriteByte(hexDigits[c&0xf])
			} else {
				w.WriteByte(c)
			}
		}
	}
	w.WriteByte('"')
	return nil
}
