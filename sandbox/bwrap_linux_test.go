package sandbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/testkit/golden"
)

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
	golden.Compare(t, filepath.Join("testdata", "plan", name+".golden"), []byte(text))
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
