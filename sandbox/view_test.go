package sandbox

import (
	"testing"

	"github.com/metnos/agent/policy"
)

// planFixture lays out a small host tree under a temp dir: a home with
// a present and an absent nucleus entry, a grant, a read-only grant
// beneath it and a system dir. It returns the root and a Policy over it.
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
