// Package term makes text from elsewhere safe to print on a terminal.
//
// A device name the user typed, a name or message the server sent, an
// executor's name: printed raw, any of them could carry terminal escape
// sequences (recolour, retitle the window, move the cursor, rewrite what
// was printed before), bidirectional overrides that show text in
// another order than it is stored, or bytes that are not UTF-8.
// [Sanitize] shows each such character escaped, as Go would write it in
// a string literal, so what is printed is what is there.
package term

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Sanitize returns s with every character [Unsafe] reports shown
// escaped: \t, \n and \r as such, other bytes below U+0080 and invalid
// UTF-8 as \xHH, other runes as \uHHHH. A backslash is left as it is.
// Text without such characters is returned unchanged.
func Sanitize(s string) string {
	if _, _, bad := FirstUnsafe(s); !bad {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case Unsafe(r) && r < utf8.RuneSelf:
			fmt.Fprintf(&b, `\x%02x`, r)
		case Unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Unsafe reports whether r must not reach a terminal as it is: a
// control character (C0, DEL, C1: ESC among them, which starts every
// escape sequence), a bidirectional mark, embedding, override or
// isolate (U+200E, U+200F, U+061C, U+202A to U+202E, U+2066 to U+2069),
// a line or paragraph separator (U+2028, U+2029), or
// utf8.RuneError (the replacement of a byte that is not UTF-8).
func Unsafe(r rune) bool {
	switch {
	case unicode.IsControl(r), r == utf8.RuneError:
		return true
	case r == 0x200E, r == 0x200F, r == 0x061C,
		0x202A <= r && r <= 0x202E,
		0x2066 <= r && r <= 0x2069,
		r == 0x2028, r == 0x2029:
		return true
	}
	return false
}

// FirstUnsafe returns the first character of s that [Sanitize] would
// escape, with its byte offset: the rune, or utf8.RuneError for a byte
// that is not UTF-8. ok is false when there is none.
func FirstUnsafe(s string) (r rune, offset int, ok bool) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if Unsafe(r) {
			return r, i, true
		}
		i += n
	}
	return 0, 0, false
}

// Describe names the character r for an error message: "U+001B (ESC)",
// "U+202E (right-to-left override)", "U+0007".
func Describe(r rune) string {
	name := map[rune]string{
		0x00: "NUL", 0x07: "BEL", 0x08: "backspace", 0x09: "tab", 0x0A: "newline",
		0x0D: "carriage return", 0x1B: "ESC", 0x7F: "DEL", 0x9B: "CSI",
		0x200E: "left-to-right mark", 0x200F: "right-to-left mark", 0x061C: "Arabic letter mark",
		0x202A: "left-to-right embedding", 0x202B: "right-to-left embedding",
		0x202C: "pop directional formatting", 0x202D: "left-to-right override",
		0x202E: "right-to-left override", 0x2066: "left-to-right isolate",
		0x2067: "right-to-left isolate", 0x2068: "first strong isolate",
		0x2069: "pop directional isolate", 0x2028: "line separator", 0x2029: "paragraph separator",
		utf8.RuneError: "not UTF-8",
	}[r]
	if r == utf8.RuneError {
		return "a byte that is not UTF-8"
	}
	if name == "" {
		return fmt.Sprintf("U+%04X", r)
	}
	return fmt.Sprintf("U+%04X (%s)", r, name)
}

// SanitizeLines is [Sanitize] for text of several lines, such as an
// error that joins several: it keeps newlines and tabs, and escapes
// everything else Sanitize escapes (a carriage return included, which
// could overwrite the line).
func SanitizeLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		parts := strings.Split(l, "\t")
		for j, p := range parts {
			parts[j] = Sanitize(p)
		}
		lines[i] = strings.Join(parts, "\t")
	}
	return strings.Join(lines, "\n")
}
