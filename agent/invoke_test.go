package agent

import (
	"cmp"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/wire"
)

// TestArgStringsStandForArgs: the request's grants are derived from the
// strings of the arguments, walked once by readArgs, in place of the
// arguments themselves: the policy is the same either way.
func TestArgStringsStandForArgs(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	host := policy.Host{Home: home, UID: os.Getuid()}
	// Each string names a folder of its own, so that the grants do not
	// depend on the order a map is walked in.
	photos, docs, videos := filepath.Join(home, "Photos", "2024"), filepath.Join(home, "Docs"), filepath.Join(home, "Videos")
	for _, d := range []string{photos, docs, videos, filepath.Join(home, "Music")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	args := map[string]any{
		"moves":   []any{map[string]any{"src": filepath.Join(photos, "a.jpg"), "dst": docs, "copy": true}},
		"root":    "~/Music",
		"pattern": "*.jpg",
		"deep":    map[string]any{"x": []any{[]any{videos}}},
	}
	m, err := policy.ParseManifest([]policy.Capability{{Name: "fs:write", Hints: []string{"~/Docs/**"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	inv := &invocation{Invocation: wire.Invocation{Args: args}}
	if err := inv.readArgs(); err != nil {
		t.Fatal(err)
	}
	if len(inv.strs) != 5 {
		t.Fatalf("strings %q, want the 5 of the arguments", inv.strs)
	}
	if want, _ := wire.Canonical(args); string(inv.stdin) != string(want) {
		t.Errorf("stdin %s, want %s", inv.stdin, want)
	}
	whole, err := policy.Derive(policy.DeriveInput{Manifest: m, Args: args, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	strs, err := policy.Derive(policy.DeriveInput{Manifest: m, Args: inv.strs, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	byPath := func(a, b policy.Grant) int { return cmp.Compare(a.Path+a.Why, b.Path+b.Why) }
	slices.SortFunc(whole.Grants, byPath)
	slices.SortFunc(strs.Grants, byPath)
	if len(whole.Grants) != 4 {
		t.Fatalf("grants %+v, want the 4 folders the arguments name", whole.Grants)
	}
	if !reflect.DeepEqual(whole, strs) {
		t.Errorf("from the arguments:\n%+v\nfrom their strings:\n%+v", whole, strs)
	}
}
