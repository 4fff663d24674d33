package audit

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"net/url"
	"regexp"
	"strings"
	"sync"

	"github.com/zeebo/blake3"

	"github.com/metnos/agent/wire"
)

// redactedPrefix starts every placeholder [Redact] puts in place of a
// secret.
const redactedPrefix = "redacted:blake3:"

// unencodable replaces a value that has no JSON encoding.
const unencodable = "redacted:unencodable"

// Redact returns a deep copy of v with its secrets replaced by
// placeholders, "redacted:blake3:<16 hex>": the first 64 bits of the
// blake3 hash of the secret's JSON encoding (the protocol's canonical
// JSON, so a known value can be checked against the placeholder, and
// two lines holding the same secret show the same placeholder). v is
// not changed.
//
// v is expected as [wire.Decode] returns it (map[string]any, []any,
// string, json.Number, bool, nil); anything else is first converted to
// that form through encoding/json, so no type escapes redaction. A value
// that does not encode at all becomes "redacted:unencodable".
//
// What is replaced:
//
//   - the whole value, whatever its type, under a map key that names a
//     secret: the key lowercased, without '-' and '_', contains token,
//     password, passwd, passphrase, secret, authorization, auth (but not
//     as the start of "author" or "authority"), apikey, accesskey,
//     privatekey, credential, cookie or session;
//   - in an array, the element after a flag naming a secret, as in
//     ["--token", "X"];
//   - a map key that itself looks like a secret;
//   - a string anywhere that looks like a secret (see below).
//
// A string looks like a secret when it is, as a whole: "Bearer " or
// "Basic " and a credential; a JWT (three base64url parts separated by
// dots, the first starting "eyJ"); a token with a well-known prefix
// (sk-, sk_live_, ghp_, gho_, github_pat_, xoxb-, xoxp-, glpat-, AKIA +
// 16 upper-case letters or digits, and a few more); or a long opaque
// token: at least 32 characters of [A-Za-z0-9_+/=-] and nothing else,
// with letters and digits, and a Shannon entropy of at least 3.5 bits a
// character. It also looks like one when it contains a PEM private key
// block, or, among its words, a JWT, a prefixed token, "Bearer" and a
// credential, a URL with a password, or a secret's name followed by its
// value (token=X, "password": "X", --api-key X).
//
// What is deliberately kept, though it may look opaque: absolute paths
// (starting with '/', unless they hold '+' or '=', or with '~' or a
// drive letter), file names and sentences (they hold characters a token
// does not), UUIDs, "sha256:"-prefixed digests, Metnos invocation and
// turn ids ("inv-…", "turn-…"), and long names made of plain words and
// numbers ("summer_holiday_2024_in_tuscany_photos"). An opaque token
// inside a sentence is not found (only whole strings are measured), nor
// is any secret under an innocent key in an innocent shape.
//
// Where in doubt, it redacts: a bare hex digest of 32 characters or more
// (it may be a hex key; with its "sha256:" prefix it is kept), a value
// under max_tokens or session_title, a long camelCase name with digits.
func Redact(v any) any {
	switch x := v.(type) {
	case nil, bool, json.Number:
		return x
	case string:
		if looksSecret(x) {
			return placeholder(x)
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			rk := k
			if looksSecret(k) {
				rk = placeholder(k)
			}
			if secretKey(k) {
				out[rk] = placeholder(e)
			} else {
				out[rk] = Redact(e)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			if i > 0 && secretFlag(x[i-1]) {
				out[i] = placeholder(e)
			} else {
				out[i] = Redact(e)
			}
		}
		return out
	}
	// Any other type: through JSON into the forms above.
	b, err := json.Marshal(v)
	if err != nil {
		return unencodable
	}
	w, err := wire.Decode(b)
	if err != nil {
		return unencodable
	}
	return Redact(w)
}

// placeholder is what replaces the secret v.
func placeholder(v any) string {
	b, err := wire.Canonical(v)
	if err != nil {
		// Not canonical (a float, invalid UTF-8, a Go type): any stable
		// encoding will do.
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if enc.Encode(v) != nil {
			return unencodable
		}
		b = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	sum := blake3.Sum256(b)
	return redactedPrefix + hex.EncodeToString(sum[:8])
}

// secretNames are the words that make a key name a secret's, matched in
// the key lowercased without '-' and '_'.
var secretNames = []string{
	"token", "password", "passwd", "passphrase", "secret", "authorization",
	"apikey", "accesskey", "privatekey", "credential", "cookie", "session",
}

// secretKey reports whether a value under the key name k is redacted
// whatever it is: k, lowercased and without '-' and '_', contains one of
// the words [Redact] lists.
func secretKey(k string) bool {
	n := strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(k))
	for _, w := range secretNames {
		if strings.Contains(n, w) {
			return true
		}
	}
	// "auth" (oauth, authn, auth_header, authorise), but not the author
	// of a file or a URL's authority.
	for i := 0; i < len(n); i++ {
		rest := n[i:]
		if strings.HasPrefix(rest, "auth") && (!strings.HasPrefix(rest, "author") ||
			strings.HasPrefix(rest, "authoriz") || strings.HasPrefix(rest, "authoris")) {
			return true
		}
	}
	return false
}

// secretFlag reports whether v is a command-line flag naming a secret
// (--token, -password), whose value is the next argument.
func secretFlag(v any) bool {
	s, ok := v.(string)
	return ok && isFlag(s) && secretKey(s)
}

func isFlag(s string) bool {
	return len(s) > 1 && s[0] == '-' && !strings.ContainsAny(s, "= \t")
}

// looksSecret reports whether the string s has the shape of a secret,
// by the rules [Redact] lists.
func looksSecret(s string) bool {
	if pemPrivateKey().MatchString(s) {
		return true
	}
	t := strings.TrimSpace(s)
	return authHeader(t) || secretToken(t) || opaque(t) || hasSecretWord(s)
}

// pemPrivateKey finds the header of a PEM private key block: PRIVATE
// KEY, RSA PRIVATE KEY, OPENSSH PRIVATE KEY, PGP PRIVATE KEY BLOCK...
var pemPrivateKey = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----`) })

// authHeader reports whether s is an HTTP credential: "Bearer" or
// "Basic" (in any case), spaces, and one word of token68 characters.
func authHeader(s string) bool {
	scheme, cred, ok := strings.Cut(s, " ")
	if !ok || (!strings.EqualFold(scheme, "bearer") && !strings.EqualFold(scheme, "basic")) {
		return false
	}
	return credential(strings.TrimLeft(cred, " "), 8)
}

// credential reports whether s is a token68 (RFC 9110) of at least min
// characters.
func credential(s string, min int) bool {
	body := strings.TrimRight(s, "=")
	if len(s) < min || body == "" {
		return false
	}
	for _, c := range []byte(body) {
		if !isAlnum(c) && !strings.ContainsRune("-._~+/", rune(c)) {
			return false
		}
	}
	return true
}

// prefixes are well-known token prefixes, each with the least number of
// characters of [A-Za-z0-9_-] that follow it.
var prefixes = []struct {
	prefix string
	min    int
}{
	{"sk-", 20},         // OpenAI, Anthropic and many more
	{"sk_live_", 16},    // Stripe
	{"sk_test_", 16},    //
	{"rk_live_", 16},    //
	{"ghp_", 30},        // GitHub
	{"gho_", 30},        //
	{"ghu_", 30},        //
	{"ghs_", 30},        //
	{"ghr_", 30},        //
	{"github_pat_", 30}, //
	{"glpat-", 20},      // GitLab
	{"xoxb-", 20},       // Slack
	{"xoxp-", 20},       //
	{"xoxa-", 20},       //
	{"xoxr-", 20},       //
	{"xoxs-", 20},       //
	{"hf_", 30},         // Hugging Face
	{"AIza", 30},        // Google
}

// secretToken reports whether s is, as a whole, a JWT or a token with a
// well-known prefix.
func secretToken(s string) bool {
	if jwt(s) || awsKeyID(s) {
		return true
	}
	for _, p := range prefixes {
		if rest, ok := strings.CutPrefix(s, p.prefix); ok && len(rest) >= p.min && tokenChars(rest, "_-") && hasLetterAndDigit(rest) {
			return true
		}
	}
	return false
}

// jwt reports whether s is a JSON Web Token: a JWS (three parts) or a
// JWE (five), base64url, the first (the header) starting "eyJ" ({").
func jwt(s string) bool {
	if !strings.HasPrefix(s, "eyJ") || len(s) < 20 {
		return false
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 && len(parts) != 5 {
		return false
	}
	for i, p := range parts {
		if (p == "" && i < 2) || !tokenChars(p, "_-") {
			return false
		}
	}
	return true
}

// awsKeyID reports whether s is an AWS access key id: AKIA (or ASIA,
// for temporary ones) and 16 upper-case letters or digits.
func awsKeyID(s string) bool {
	if len(s) != 20 || (!strings.HasPrefix(s, "AKIA") && !strings.HasPrefix(s, "ASIA")) {
		return false
	}
	return all(s[4:], func(c byte) bool { return isUpper(c) || isDigit(c) })
}

// opaque reports whether s is a long opaque token: at least 32
// characters of [A-Za-z0-9_+/=-] and nothing else, with both letters and
// digits, an entropy of at least 3.5 bits a character, and none of the
// shapes kept on purpose.
func opaque(s string) bool {
	if len(s) < 32 || !tokenChars(s, "_+/=-") || !hasLetterAndDigit(s) || entropy(s) < 3.5 {
		return false
	}
	return !uuid().MatchString(s) && !metnosID().MatchString(s) && !absPath(s) && !plainWords(s)
}

var (
	uuid = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	})
	metnosID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(inv|turn)-[A-Za-z0-9._:-]+$`) })
)

// absPath reports whether s, made only of token characters, is an
// absolute path rather than base64 that happens to start with '/'.
func absPath(s string) bool {
	return s[0] == '/' && !strings.ContainsAny(s, "+=")
}

// plainWords reports whether s is made of words and numbers joined by
// '_', '-' or '/' (names, slugs, relative paths), not random characters:
// every part is all digits, all lower-case, all upper-case or a
// capitalised word, of at most 24 characters.
func plainWords(s string) bool {
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == '_' || r == '-' || r == '/' }) {
		if len(part) > 24 || !plainWord(part) {
			return false
		}
	}
	return true
}

func plainWord(w string) bool {
	switch {
	case all(w, isDigit), all(w, isLower), all(w, isUpper):
		return true
	}
	return isUpper(w[0]) && all(w[1:], isLower)
}

func all(s string, f func(byte) bool) bool {
	for _, c := range []byte(s) {
		if !f(c) {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isUpper(c byte) bool { return c >= 'A' && c <= 'Z' }
func isAlnum(c byte) bool { return isDigit(c) || isLower(c) || isUpper(c) }

// entropy is the Shannon entropy of s's bytes, in bits a byte.
func entropy(s string) float64 {
	var n [256]int
	for _, c := range []byte(s) {
		n[c]++
	}
	h := 0.0
	for _, k := range n {
		if k > 0 {
			p := float64(k) / float64(len(s))
			h -= p * math.Log2(p)
		}
	}
	return h
}

// hasSecretWord reports whether a secret is among the words of s: a JWT
// or a prefixed token, "Bearer" and a credential, a URL with a password
// or a secret query parameter, or a secret's name and its value, as
// name=value, "name": value, name: value or --name value.
func hasSecretWord(s string) bool {
	words := strings.FieldsFunc(s, func(r rune) bool {
		return strings.ContainsRune(" \t\r\n\"'`,;()[]{}<>|", r)
	})
	for i, w := range words {
		next := ""
		if i+1 < len(words) {
			next = words[i+1]
		}
		if next == ":" && i+2 < len(words) {
			// "name": value, split by the quotes.
			w, next = w+":", words[i+2]
		}
		if secretToken(w) || secretToken(strings.TrimRight(w, ".:")) {
			return true
		}
		if strings.EqualFold(w, "bearer") && credential(next, 16) {
			return true
		}
		if name, ok := strings.CutSuffix(w, ":"); ok && next != "" && secretKey(name) {
			return true
		}
		if isFlag(w) && next != "" && secretKey(w) {
			return true
		}
		if strings.Contains(w, "=") && secretAssignment(w) {
			return true
		}
		if strings.Contains(w, "://") && urlSecret(w) {
			return true
		}
	}
	return false
}

// secretAssignment reports whether w holds name=value pairs (a flag, an
// environment variable, a query string) where a secret's name has a
// value, or a value is a secret token.
func secretAssignment(w string) bool {
	for _, pair := range strings.FieldsFunc(w, func(r rune) bool { return r == '&' || r == '?' }) {
		name, value, ok := strings.Cut(pair, "=")
		if !ok || value == "" {
			continue
		}
		if secretKey(name) || secretToken(value) {
			return true
		}
	}
	return false
}

// urlSecret reports whether w is a URL with a password in it.
func urlSecret(w string) bool {
	u, err := url.Parse(w)
	if err != nil || u.User == nil {
		return false
	}
	_, ok := u.User.Password()
	return ok
}

// tokenChars reports whether s is made of letters, digits and the bytes
// in extra.
func tokenChars(s, extra string) bool {
	for _, c := range []byte(s) {
		if !isAlnum(c) && strings.IndexByte(extra, c) < 0 {
			return false
		}
	}
	return true
}

func hasLetterAndDigit(s string) bool {
	letter, digit := false, false
	for _, c := range []byte(s) {
		digit = digit || isDigit(c)
		letter = letter || isLower(c) || isUpper(c)
	}
	return letter && digit
}
