package sandbox

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/metnos/agent/policy"
)

// planFixture lays out a small host tree under a temp dir: a home with
// a present and an absent nucleus entry, a grant, a read-only grant
// beneath it and a system dir. It returns the root and a Policy over it.
var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func planFixture(t *testing.T) (string, policy.Policy) {
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
	p := policy.Policy{
		Profile: policy.ProfileSupervised,
		System:  []string{r("bin"), r("usr"), r("etc")},
		Grants: []policy.Grant{
			{Path: r("home/u"), Access: policy.Write},
			{Path: r("home/u/work/ro"), Access: policy.Read},
			{Path: r("home/u/docs"), Access: policy.Read, Via: r("docs-link")},
		},
		Masks: []policy.Mask{
			{Path: r("etc/shadow"), Kind: policy.MaskFile},
			{Path: r("home/u/.ssh"), Kind: policy.MaskDir},
			{Path: r("home/u/.netrc"), Kind: policy.MaskFile},
			{Path: r("home/u/.kube"), Kind: policy.MaskDir},
			{Path: r("home/u/.config/gh"), Kind: policy.MaskDir},
			{Path: r("run/user/1000"), Kind: policy.MaskDir},
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
	args, phs, _ := bwrapArgs(layout{Policy: p}, "/opt/metnos/metnos-shim", filepath.Join(root, "home/u/work"), map[string]int{filepath.Join(root, "home/u/work/ro"): 7})
	checkPlanGolden(t, "bwrap_supervised", root, map[string]any{"args": args, "placeholders": phs})

	p.Network = true
	p.RootWritable, p.RealDev, p.SharePID = true, true, true
	args, _, _ = bwrapArgs(layout{Policy: p}, "/opt/metnos/metnos-shim", "/", nil)
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
	checkPlanGolden(t, "landlock_bwrap", root, landlockRules(layout{Policy: p}, true, ""))
	// Without bwrap the home grant is split around .ssh, .netrc, the
	// absent .kube and .config/gh, and the read-only work/ro.
	checkPlanGolden(t, "landlock_only", root, landlockRules(layout{Policy: p}, false, filepath.Join(root, "tmp")))
}

func TestLandlockOnlyNeverGrantsMasked(t *testing.T) {
	_, p := planFixture(t)
	for _, r := range landlockRules(layout{Policy: p}, false, "") {
		for _, m := range p.Masks {
			if within(m.Path, r.Path) {
				t.Errorf("rule %+v covers masked %s", r, m.Path)
			}
		}
		for _, g := range p.Grants {
			if g.Access == policy.Read && r.Write && within(g.Path, r.Path) {
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
	p := policy.Policy{
		System: []string{"/usr"},
		Grants: []policy.Grant{{Path: "/data/x", Access: policy.Read, Via: "/home/u/x"}},
		Masks:  []policy.Mask{{Path: "/data/x/.ssh"}},
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
	p.Grants = append(p.Grants, policy.Grant{Path: "/tmp/w", Access: policy.Write})
	if !Visible(p, "/tmp/w/a") || Visible(p, "/tmp/v") {
		t.Errorf("readonly profile: want a /tmp grant visible, and only it")
	}
	p.RootReadable, p.RootWritable, p.RealDev = false, true, true
	if Visible(p, "/tmp/v") {
		t.Errorf("full-fs-no-net: want the host's /tmp hidden too")
	}
}

// TestVisibleOwnGrantThroughMask: the agent's own folder shows through
// the mask of its data directory, and nothing else of that directory
// does (the Policy is what policy.Derive makes of such an Own grant).
func TestVisibleOwnGrantThroughMask(t *testing.T) {
	home := "/home/u"
	p := policy.Policy{
		Grants: []policy.Grant{{Path: home + "/.config/metnos/shimdata", Access: policy.Write, Why: "user data", Own: true}},
		Masks:  []policy.Mask{{Path: home + "/.config/metnos", Kind: policy.MaskDir}},
	}
	if !Visible(p, home+"/.config/metnos/shimdata/x") || Visible(p, home+"/.config/metnos/key") {
		t.Errorf("Visible: the own folder must show through the mask, and nothing else of it")
	}
}

// TestRemovableParents: which removable grants get their parent mounted
// in their stead, and which writable grants are left to the grant
// around them.
func TestRemovableParents(t *testing.T) {
	w := func(p string, removable bool) policy.Grant {
		return policy.Grant{Path: p, Access: policy.Write, Removable: removable}
	}
	r := func(p string) policy.Grant { return policy.Grant{Path: p, Access: policy.Read} }
	type want struct{ parents, folded []string }
	for _, tc := range []struct {
		name    string
		grants  []policy.Grant
		masks   []string
		inBwrap bool
		want    want
	}{
		{"plain", []policy.Grant{w("/data/album/2023", true)}, nil, true, want{parents: []string{"/data/album"}, folded: []string{"/data/album/2023"}}},
		{"system or shared parent", []policy.Grant{w("/home/bob", true), w("/srv/x", true), w("/usr/local/x", true), w("/var/lib/x", true)}, nil, true, want{}},
		{"private tmp in bwrap", []policy.Grant{w("/tmp/x/y", true)}, nil, true, want{}},
		{"private tmp without bwrap", []policy.Grant{w("/tmp/x/y", true)}, nil, false, want{parents: []string{"/tmp/x"}, folded: []string{"/tmp/x/y"}}},
		{"mask directly in the parent", []policy.Grant{w("/h/u/Old", true)}, []string{"/h/u/.ssh"}, true, want{}},
		{"mask deeper, bwrap", []policy.Grant{w("/h/u/Old", true)}, []string{"/h/u/x/.ssh"}, true, want{parents: []string{"/h/u"}, folded: []string{"/h/u/Old"}}},
		{"mask deeper, no bwrap", []policy.Grant{w("/h/u/Old", true)}, []string{"/h/u/x/.ssh"}, false, want{}},
		{"sibling grant", []policy.Grant{w("/d/a", true), r("/d/b")}, nil, true, want{}},
		{"nested removables", []policy.Grant{w("/d/p/2023", true), w("/d/p/2023/05", true)}, nil, true, want{parents: []string{"/d/p"}, folded: []string{"/d/p/2023", "/d/p/2023/05"}}},
		{"write in read in write", []policy.Grant{w("/p", false), r("/p/ro"), w("/p/ro/w", false)}, nil, true, want{}},
		{"write in write", []policy.Grant{w("/p", false), w("/p/a/b", false)}, nil, true, want{folded: []string{"/p/a/b"}}},
		{"read-only grant beneath, bwrap", []policy.Grant{w("/d/p/x", true), r("/d/p/y/z")}, nil, true, want{parents: []string{"/d/p"}, folded: []string{"/d/p/x"}}},
		{"read-only grant beneath, no bwrap", []policy.Grant{w("/d/p/x", true), r("/d/p/y/z")}, nil, false, want{}},
		{"sticky world-writable parent", []policy.Grant{w("/var/tmp/x", true)}, nil, false, want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policy.Policy{Grants: tc.grants}
			for _, m := range tc.masks {
				p.Masks = append(p.Masks, policy.Mask{Path: m, Kind: policy.MaskDir})
			}
			q := withRemovableParents(p, tc.inBwrap)
			var got want
			for _, g := range q.Grants {
				if q.parentOf[g.Path] {
					got.parents = append(got.parents, g.Path)
				}
				if q.inParent[g.Path] {
					got.folded = append(got.folded, g.Path)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got parents %v folded %v, want %v %v", got.parents, got.folded, tc.want.parents, tc.want.folded)
			}
		})
	}
}
