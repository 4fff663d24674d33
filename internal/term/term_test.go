package term

import (
	"strings"
	"testing"
)

func TestSanitize(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"laptop", "laptop"},
		{"Cucina è ☕", "Cucina è ☕"},
		{`back\slash`, `back\slash`},
		// An ANSI colour and a window-title sequence are shown, not run.
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
		{"a\nb\tc\rd", `a\nb\tc\rd`},
		{"\u009b2J", `\u009b2J`},
		{"\x9b2J", `\x9b2J`},
		// A bidi override would show "exe.txt" as "txt.exe".
		{"invoice\u202etxt.exe", `invoice\u202etxt.exe`},
		{"x\u2066y\u2069", `x\u2066y\u2069`},
		{"bad\xffutf8", `bad\xffutf8`},
		{"\x7f", `\x7f`},
	} {
		got := Sanitize(c.in)
		if got != c.want {
			t.Errorf("Sanitize(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.ContainsAny(got, "\x1b\x07\x9b\u202e\u2066\n\r\x7f") {
			t.Errorf("Sanitize(%q) = %q still holds a control character", c.in, got)
		}
	}
}

func TestFirstUnsafe(t *testing.T) {
	r, off, ok := FirstUnsafe("abc\x1b[2Jdef")
	if !ok || r != 0x1b || off != 3 {
		t.Errorf("FirstUnsafe: %q at %d, %v", r, off, ok)
	}
	if got := Describe(r); got != "U+001B (ESC)" {
		t.Errorf("Describe(ESC) = %q", got)
	}
	if _, _, ok := FirstUnsafe("plain name – é"); ok {
		t.Error("a plain name has an unsafe character")
	}
	if _, _, ok := FirstUnsafe("x\xfe"); !ok {
		t.Error("invalid UTF-8 is not reported")
	}
}

func TestSanitizeLines(t *testing.T) {
	in := "pairing failed:\n\tserver said \x1b[31mno\r\u202e"
	want := "pairing failed:\n\tserver said \\x1b[31mno\\r\\u202e"
	if got := SanitizeLines(in); got != want {
		t.Errorf("SanitizeLines = %q, want %q", got, want)
	}
}
