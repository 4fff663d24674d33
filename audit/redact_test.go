package audit

import (
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/zeebo/blake3"

	"github.com/metnos/agent/wire"
)

// want is the placeholder of a value whose canonical JSON is js.
func want(js string) string {
	sum := blake3.Sum256([]byte(js))
	return "redacted:blake3:" + hex.EncodeToString(sum[:8])
}

func TestRedactStrings(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		secret bool
	}{
		// Secrets, as whole strings.
		{"bearer", "Bearer abcdef0123456789", true},
		{"bearer any case", "bearer eyJhbGciOiJIUzI1NiJ9", true},
		{"basic", "Basic dXNlcjpwYXNzd29yZA==", true},
		{"jwt", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", true},
		{"jwt unsigned", "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0.", true},
		{"openai", "sk-proj-abc123DEF456ghi789JKL012mno", true},
		{"anthropic", "sk-ant-api03-AbCdEf0123456789xyzXYZ", true},
		{"stripe", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", true},
		{"github classic", "ghp_1A2b3C4d5E6f7G8h9I0jK1l2M3n4O5p6Q7r8", true},
		{"github oauth", "gho_16C7e42F292c6912E7710c838347Ae178B4a", true},
		{"github fine-grained", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", true},
		{"slack bot", "xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", true},
		{"slack user", "xoxp-1234567890-1234567890123-AbCdEfGhIjKl", true},
		{"gitlab", "glpat-AbCdEf0123456789xyz1", true},
		{"aws key id", "AKIAIOSFODNN7EXAMPLE", true},
		{"aws secret", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", true},
		{"base64url token", "Zx8QmV3pL0aT7rN2cK9wY4hB6eD1fG5jS_uI-oP3qRt", true},
		{"bare hex key", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", true},
		{"padded", "  sk-proj-abc123DEF456ghi789JKL012mno\n", true},
		{"pem", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n", true},
		{"pem rsa in text", "here it is: -----BEGIN RSA PRIVATE KEY-----\nMIIE...", true},
		// Secrets among words.
		{"curl header", "curl -H 'Authorization: Bearer abcdef0123456789abcdef' https://api.example.com", true},
		{"bearer in text", "send it with Bearer abcdef0123456789abcdef please", true},
		{"query param", "https://api.example.com/v1/items?api_key=abc123&limit=5", true},
		{"url password", "https://user:hunter2@example.com/repo.git", true},
		{"flag=value", "mysql --password=hunter2 -u root", true},
		{"flag value", "login --token abc123", true},
		{"env assignment", "export GITHUB_TOKEN=ghp_1A2b3C4d5E6f7G8h9I0jK1l2M3n4O5p6Q7r8", true},
		{"json in a string", `{"user": "ann", "password": "hunter2"}`, true},
		{"name: value", "password: hunter2", true},
		{"prefixed in a sentence", "my key is sk-proj-abc123DEF456ghi789JKL012mno.", true},
		{"jwt in a sentence", "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc_DEF-123 expired", true},

		// Not secrets.
		{"abs path", "/home/u/Photos/IMG_20240101_123456.jpg", false},
		{"abs path without dots", "/home/roberto/Documents/Projects2024/metnosAgentBuild", false},
		{"home path", "~/Documents/tax-2024/return.pdf", false},
		{"windows path", `C:\Users\x\file.txt`, false},
		{"unc path", `\\nas\photos\2024\IMG_20240101_123456.jpg`, false},
		{"relative path", "Photos/2024/summer_holiday_in_tuscany", false},
		{"file name", "IMG_20240101_123456.jpg", false},
		{"slug", "summer_holiday_2024_in_tuscany_photos_final", false},
		{"sentence", "Please organise my photos from last summer by month.", false},
		{"sentence about passwords", "change the password policy for 2024", false},
		{"uuid", "123e4567-e89b-12d3-a456-426614174000", false},
		{"sha256 digest", "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", false},
		{"blake3 digest", "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262", false},
		{"invocation id", "inv-1733150000000-abcdef", false},
		{"invocation id hex", "inv-18ed65bd51bdc701fcd26b58", false},
		{"durable invocation id", "inv-durable-3f9a0c1b7e2d4a6f8b5c9d0e1f2a3b4c", false},
		{"turn id", "turn-01HX3F9A0C1B7E2D4A6F8B5C9D0E", false},
		{"ulid", "01HX3F9A0C1B7E2D4A6F8B5C9D", false},
		{"bearer of news", "Bearer of bad news", false},
		{"basic idea", "Basic idea of the plan", false},
		{"sk- word", "sk-learn", false},
		{"ask-me", "ask-me-anything-about-2024", false},
		{"eyJ word", "eyJustKidding", false},
		{"akia short", "AKIA1234", false},
		{"plain url", "https://example.com/search?q=photos&page=2", false},
		{"url with user", "ssh://git@example.com/repo.git", false},
		{"time", "2024-01-01T12:00:00.000Z", false},
		{"camel case without digits", "MyFunctionNameThatIsQuiteLongIndeed", false},
		{"flags", "--verbose --max-depth 3", false},
		{"empty", "", false},
		{"short", "hunter2", false},
		{"italian", "Sposta le foto di città nella cartella 2024", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Redact(tt.in)
			if !tt.secret {
				if got != tt.in {
					t.Fatalf("Redact(%q) = %q, want it kept", tt.in, got)
				}
				return
			}
			b, _ := wire.Canonical(tt.in)
			if got != want(string(b)) {
				t.Fatalf("Redact(%q) = %q, want %q", tt.in, got, want(string(b)))
			}
		})
	}
}

func TestRedactKeys(t *testing.T) {
	tests := []struct {
		key    string
		secret bool
	}{
		{"token", true},
		{"access_token", true},
		{"refreshToken", true},
		{"password", true},
		{"db-passwd", true},
		{"passphrase", true},
		{"client_secret", true},
		{"AWS_SECRET_ACCESS_KEY", true},
		{"Authorization", true},
		{"authorisation", true},
		{"auth", true},
		{"oauth_code", true},
		{"api_key", true},
		{"apiKey", true},
		{"X-Api-Key", true},
		{"access-key", true},
		{"private_key", true},
		{"credentials", true},
		{"Cookie", true},
		{"set-cookie", true},
		{"session_id", true},

		{"path", false},
		{"author", false},
		{"authors", false},
		{"authority", false},
		{"key", false},
		{"monkey", false},
		{"name", false},
		{"pass", false},
		{"dest", false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			in := map[string]any{tt.key: "plain"}
			got := Redact(in).(map[string]any)[tt.key]
			if tt.secret && got != want(`"plain"`) {
				t.Fatalf("under %q: %v, want it redacted", tt.key, got)
			}
			if !tt.secret && got != "plain" {
				t.Fatalf("under %q: %v, want it kept", tt.key, got)
			}
		})
	}
}

func TestRedactValuesOfEveryType(t *testing.T) {
	in := map[string]any{
		"password": json.Number("123456"),
		"token":    map[string]any{"a": "b", "n": json.Number("1")},
		"secrets":  []any{"x", "y"},
		"session":  nil,
		"cookie":   true,
		"count":    json.Number("12345678901234567890"),
		"ok":       false,
		"none":     nil,
		"argv":     []any{"--token", "abc", "--path", "/x", "-p", "8080", "--api-key", json.Number("42")},
		"nested": map[string]any{
			"list": []any{map[string]any{"Authorization": "Bearer abcdef0123456789"}, "sk-proj-abc123DEF456ghi789JKL012mno", "ok"},
		},
		"ghp_1A2b3C4d5E6f7G8h9I0jK1l2M3n4O5p6Q7r8": "a secret as a key",
	}
	wantOut := map[string]any{
		"password": want(`123456`),
		"token":    want(`{"a":"b","n":1}`),
		"secrets":  want(`["x","y"]`),
		"session":  want(`null`),
		"cookie":   want(`true`),
		"count":    json.Number("12345678901234567890"),
		"ok":       false,
		"none":     nil,
		"argv":     []any{"--token", want(`"abc"`), "--path", "/x", "-p", "8080", "--api-key", want(`42`)},
		"nested": map[string]any{
			"list": []any{map[string]any{"Authorization": want(`"Bearer abcdef0123456789"`)}, want(`"sk-proj-abc123DEF456ghi789JKL012mno"`), "ok"},
		},
		want(`"ghp_1A2b3C4d5E6f7G8h9I0jK1l2M3n4O5p6Q7r8"`): "a secret as a key",
	}
	before, _ := json.Marshal(in)
	got := Redact(in)
	if !reflect.DeepEqual(got, wantOut) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(wantOut, "", "  ")
		t.Fatalf("got\n%s\nwant\n%s", g, w)
	}
	if after, _ := json.Marshal(in); string(after) != string(before) {
		t.Fatalf("Redact changed its argument:\n%s\nwas\n%s", after, before)
	}
}

func TestRedactOtherTypes(t *testing.T) {
	type login struct {
		User     string `json:"user"`
		Password string `json:"password"`
		Port     int    `json:"port"`
	}
	got := Redact(login{"ann", "hunter2", 22})
	wantOut := map[string]any{"user": "ann", "password": want(`"hunter2"`), "port": json.Number("22")}
	if !reflect.DeepEqual(got, wantOut) {
		t.Fatalf("a struct: %#v, want %#v", got, wantOut)
	}
	if got := Redact(map[string]string{"api_key": "k", "q": "x"}); !reflect.DeepEqual(got, map[string]any{"api_key": want(`"k"`), "q": "x"}) {
		t.Fatalf("a map[string]string: %#v", got)
	}
	if got := Redact(func() {}); got != "redacted:unencodable" {
		t.Fatalf("a func: %#v", got)
	}
	if got := Redact([]string{"Bearer abcdef0123456789", "x"}); !reflect.DeepEqual(got, []any{want(`"Bearer abcdef0123456789"`), "x"}) {
		t.Fatalf("a []string: %#v", got)
	}
}

func TestPlaceholderIsStable(t *testing.T) {
	a := Redact(map[string]any{"token": "same"}).(map[string]any)["token"].(string)
	b := Redact(map[string]any{"api_key": "same"}).(map[string]any)["api_key"].(string)
	c := Redact(map[string]any{"token": "other"}).(map[string]any)["token"].(string)
	if a != b || a == c || !strings.HasPrefix(a, "redacted:blake3:") || len(a) != len("redacted:blake3:")+16 {
		t.Fatalf("placeholders %q %q %q", a, b, c)
	}
}
