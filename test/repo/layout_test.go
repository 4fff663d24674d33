package repo

import (
	"go/token"
	"strings"
	"testing"
)

// layoutNames are names of files and folders of the agent's layout that
// no other package has a reason to spell: the ones package layout names
// and that mean nothing else in this repository. Names that also mean
// something else ("spool", as in /var/spool; "executors" and "runtime",
// command and flag names too; "results", a JSON key; "history" and
// "audit", commands) are left out: the review catches those.
var layoutNames = map[string]bool{
	"dead-results":            true,
	"executed.log":            true,
	"shimdata":                true,
	"_history":                true,
	"client.lock":             true,
	"client.log":              true,
	"state.json":              true,
	"tailnet.json":            true,
	"current.json":            true,
	"runtime-descriptor.json": true,
	"sandbox-grants":          true,
	"limits-seen.toml":        true,
}

// TestLayoutNamesOnlyInLayout: internal/layout is the one place the
// agent spells its paths. No string literal of a non-test file elsewhere
// is one of layoutNames, or a path with one of them as an element: take
// the path from a layout.Layout. A literal with a space in it is a
// message, which may mention a file by name.
func TestLayoutNamesOnlyInLayout(t *testing.T) {
	walkStrings(t, func(rel string) bool { return rel != "internal/layout" }, func(pos token.Position, lit, v string) {
		if name, ok := layoutName(v); ok {
			t.Errorf("%s: %s spells the layout's %q: take the path from internal/layout", pos, lit, name)
		}
	})
}

// layoutName returns the element of v, split at / and \, that is one of
// layoutNames; a v with a space in it is a message, not a path.
func layoutName(v string) (string, bool) {
	if strings.ContainsAny(v, " \t\n") {
		return "", false
	}
	for _, e := range strings.FieldsFunc(v, func(r rune) bool { return r == '/' || r == '\\' }) {
		if layoutNames[e] {
			return e, true
		}
	}
	return "", false
}

// TestLayoutName: paths are caught, messages and other names are not.
func TestLayoutName(t *testing.T) {
	for v, want := range map[string]bool{
		"client.lock":                      true,
		"spool/dead-results":               true,
		`shimdata\_history`:                true,
		"/x/metnos/tailnet.json":           true,
		"state.json records it":            false,
		"Forget the pairing (state.json).": false,
		"results":                          false,
		"":                                 false,
	} {
		if _, got := layoutName(v); got != want {
			t.Errorf("layoutName(%q) = %v, want %v", v, got, want)
		}
	}
}
