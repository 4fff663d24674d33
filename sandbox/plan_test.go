package sandbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// planFixture lays out a small host tree under a temp dir: a home with
// a present and an absent nucleus entry, a grant, a read-only grant
// beneath it and a system dir. It returns the root and a Policy over it.
func planFixture(t *testing.T) (string, Policy) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "etc", "home/u/.ssh", "home/u/work/ro", "home/u/docs"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"etc/shadow", "home/u/.ssh/id_rsa", "home/u/.netrc", "home/u/notes.txt", "home/u/work/a"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(root, "home/u/.ssh"), filepath.Join(root, "home/u/link")); err != nil {
		t.Fatal(err)
	}
	// A merged-/usr system directory: bwrap gets a link, not a mount.
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	r := func(p string) string { return filepath.Join(root, p) }
	p := Policy{
		Profile: ProfileSupervised,
		System:  []string{r("bin"), r("usr"), r("etc")},
		Grants: []Grant{
			{Path: r("home/u"), Access: Write},
			{Path: r("home/u/work/ro"), Access: Read},
			{Path: r("home/u/docs"), Access: Read, Via: r("docs-link")},
		},
		Masks: []Mask{
			{Path: r("etc/shadow"), Kind: MaskFile},
			{Path: r("home/u/.ssh"), Kind: MaskDir},
			{Path: r("home/u/.netrc"), Kind: MaskFile},
			{Path: r("home/u/.kube"), Kind: MaskDir},
			{Path: r("home/u/.config/gh"), Kind: MaskDir},
			{Path: r("run/user/1000"), Kind: MaskDir},
		},
	}
	p.Normalize()
	return root, p
}

func checkPlanGolden(t *testing.T, name, root string, got any) {
	t.Helper()
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), root, "$ROOT") + "\n"
	file := filepath.Join("testdata", "plan", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if text != string(want) {
		t.Errorf("%s differs from %s (go test ./sandbox -run %s -update rewrites it):\n%s", name, file, t.Name(), text)
	}
}

func TestBwrapArgsGolden(t *testing.T) {
	root, p := planFixture(t)
	args, phs, _ := bwrapArgs(p, "/opt/metnos/metnos-shim", filepath.Join(root, "home/u/work"), map[string]int{filepath.Join(root, "home/u/work/ro"): 7})
	checkPlanGolden(t, "bwrap_supervised", root, map[string]any{"args": args, "placeholders": phs})

	p.Network = true
	p.RootWritable, p.RealDev, p.SharePID = true, true, true
	args, _, _ = bwrapArgs(p, "/opt/metnos/metnos-shim", "/", nil)
	// With the root writable, the directories above the fixture are
	// pinned too; they depend on where the temporary directory is.
	var kept []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--bind" && i+2 < len(args) && args[i+1] == args[i+2] && args[i+1] != root && within(root, args[i+1]) {
			i += 2
			continue
		}
		kept = append(kept, args[i])
	}
	checkPlanGolden(t, "bwrap_full_fs", root, kept)
}

func TestLandlockRulesGolden(t *testing.T) {
	root, p := planFixture(t)
	checkPlanGolden(t, "landlock_bwrap", root, landlockRules(p, true, ""))
	// Without bwrap the home grant is split around .ssh, .netrc, the
	// absent .kube and .config/gh, and the read-only work/ro.
	checkPlanGolden(t, "landlock_only", root, landlockRules(p, false, filepath.Join(root, "tmp")))
}

func TestLandlockOnlyNeverGrantsMasked(t *testing.T) {
	_, p := planFixture(t)
	for _, r := range landlockRules(p, false, "") {
		for _, m := range p.Masks {
			if within(m.Path, r.Path) {
				t.Errorf("rule %+v covers masked %s", r, m.Path)
			}
		}
		for _, g := range p.Grants {
			if g.Access == Read && r.Write && within(g.Path, r.Path) {
				t.Errorf("writable rule %+v covers read-only grant %s", r, g.Path)
			}
		}
	}
}

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		path, root string
		want       bool
	}{
		{"/a/b", "/a", true}, {"/a", "/a", true}, {"/ab", "/a", false},
		{"/a", "/", true}, {"/", "/", true}, {"/a", "/a/b", false},
	} {
		if got := within(c.path, c.root); got != c.want {
			t.Errorf("within(%q, %q) = %v, want %v", c.path, c.root, got, c.want)
		}
	}
}

func TestVisible(t *testing.T) {
	p := Policy{
		System: []string{"/usr"},
		Grants: []Grant{{Path: "/data/x", Access: Read, Via: "/home/u/x"}},
		Masks:  []Mask{{Path: "/data/x/.ssh"}},
	}
	for path, want := range map[string]bool{
		"/usr":           true,
		"/usr/bin/env":   true,
		"/usrx":          false,
		"/data/x/a":      true,
		"/home/u/x/a":    true,
		"/data/x/.ssh/k": false,
		"/home/u":        false,
		"/":              false,
	} {
		if got := Visible(p, path); got != want {
			t.Errorf("Visible(%q) = %v, want %v", path, got, want)
		}
	}
	p.RootReadable = true
	if !Visible(p, "/home/u") || Visible(p, "/data/x/.ssh") {
		t.Errorf("readonly profile: want everything but the masks visible")
	}
	// Only full-fs-no-net keeps the host's /tmp; grants open it.
	if Visible(p, "/tmp/w") || Visible(p, "/tmp") {
		t.Errorf("readonly profile: want the host's /tmp hidden")
	}
	p.Grants = append(p.Grants, Grant{Path: "/tmp/w", Access: Write})
	if !Visible(p, "/tmp/w/a") || Visible(p, "/tmp/v") {
		t.Errorf("readonly profile: want a /tmp grant visible, and only it")
	}
	p.RootReadable, p.RootWritable, p.RealDev = false, true, true
	if Visible(p, "/tmp/v") {
		t.Errorf("full-fs-no-net: want the host's /tmp hidden too")
	}
}

// TestRemovableParents: which removable grants get their parent mounted
// in their stead, and which writable grants are left to the grant
// around them.
func TestRemovableParents(t *testing.T) {
	w := func(p string, removable bool) Grant { return Grant{Path: p, Access: Write, Removable: removable} }
	r := func(p string) Grant { return Grant{Path: p, Access: Read} }
	type want struct{ parents, folded []string }
	for _, tc := range []struct {
		name    string
		grants  []Grant
		masks   []string
		inBwrap bool
		want    want
	}{
		{"plain", []Grant{w("/data/album/2023", true)}, nil, true, want{parents: []string{"/data/album"}, folded: []string{"/data/album/2023"}}},
		{"system or shared parent", []Grant{w("/home/bob", true), w("/srv/x", true), w("/usr/local/x", true), w("/var/lib/x", true)}, nil, true, want{}},
		{"private tmp in bwrap", []Grant{w("/tmp/x/y", true)}, nil, true, want{}},
		{"private tmp without bwrap", []Grant{w("/tmp/x/y", true)}, nil, false, want{parents: []string{"/tmp/x"}, folded: []string{"/tmp/x/y"}}},
		{"mask directly in the parent", []Grant{w("/h/u/Old", true)}, []string{"/h/u/.ssh"}, true, want{}},
		{"mask deeper, bwrap", []Grant{w("/h/u/Old", true)}, []string{"/h/u/x/.ssh"}, true, want{parents: []string{"/h/u"}, folded: []string{"/h/u/Old"}}},
		{"mask deeper, no bwrap", []Grant{w("/h/u/Old", true)}, []string{"/h/u/x/.ssh"}, false, want{}},
		{"sibling grant", []Grant{w("/d/a", true), r("/d/b")}, nil, true, want{}},
		{"nested removables", []Grant{w("/d/p/2023", true), w("/d/p/2023/05", true)}, nil, true, want{parents: []string{"/d/p"}, folded: []string{"/d/p/2023", "/d/p/2023/05"}}},
		{"write in read in write", []Grant{w("/p", false), r("/p/ro"), w("/p/ro/w", false)}, nil, true, want{}},
		{"write in write", []Grant{w("/p", false), w("/p/a/b", false)}, nil, true, want{folded: []string{"/p/a/b"}}},
		{"read-only grant beneath, bwrap", []Grant{w("/d/p/x", true), r("/d/p/y/z")}, nil, true, want{parents: []string{"/d/p"}, folded: []string{"/d/p/x"}}},
		{"read-only grant beneath, no bwrap", []Grant{w("/d/p/x", true), r("/d/p/y/z")}, nil, false, want{}},
		{"sticky world-writable parent", []Grant{w("/var/tmp/x", true)}, nil, false, want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Policy{Grants: tc.grants}
			for _, m := range tc.masks {
				p.Masks = append(p.Masks, Mask{Path: m, Kind: MaskDir})
			}
			q := withRemovableParents(p, tc.inBwrap)
			var got want
			for _, g := range q.Grants {
				if g.parentOf {
					got.parents = append(got.parents, g.Path)
				}
				if g.inParent {
					got.folded = append(got.folded, g.Path)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got parents %v folded %v, want %v %v", got.parents, got.folded, tc.want.parents, tc.want.folded)
			}
		})
	}
}
