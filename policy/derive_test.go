package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/testkit/golden"
)

func TestDeriveHintRoot(t *testing.T) {
	for _, c := range []struct {
		hint, root string
		ok         bool
	}{
		{"~/notes/**", "~/notes", true},
		{"/tmp/**", "/tmp", true},
		{"/tmp/*", "/tmp", true},
		{"~/Pictures", "~/Pictures", true},
		{"**", "", false},
		{"*", "", false},
		{"relative/x", "", false},
		{"relative/**", "", false},
		{"~", "~", true},
		{"~/", "~/", true},
		{"~/**", "~", true},
		{"/a/b*/c", "/a", true},
		{"/a/b?/c", "/a", true},
		{"/a/[bc]/d", "/a", true},
		{"/a/**/c", "/a", true},
		{"/var/log/*.log", "/var/log", true},
		{"~/.config/metnos/mail/<account>.env", "~/.config/metnos/mail", true},
		{"/**", "/", true},
		{"/", "/", true},
		{"~user/x", "", false},
		{`C:\Users\x\**`, "", false},
		{"", "", false},
	} {
		root, ok := hintRoot(c.hint)
		if root != c.root || ok != c.ok {
			t.Errorf("hintRoot(%q) = %q, %v; want %q, %v", c.hint, root, ok, c.root, c.ok)
		}
	}
}

func TestDeriveHintGrants(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/notes/sub", h.Home+"/Pictures", root+"/a")
	p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{
		{Name: "fs:read", Hints: []string{"~/notes/**", "~/Pictures", "**", "*", "relative/x", root + "/a/b*/c", "~/missing/**"}},
	})})
	if err != nil {
		t.Fatal(err)
	}
	want := []Grant{
		{Path: root + "/a", Access: Read, Why: "fs:read hint " + root + "/a/b*/c"},
		{Path: h.Home + "/Pictures", Access: Read, Why: "fs:read hint ~/Pictures"},
		{Path: h.Home + "/notes", Access: Read, Why: "fs:read hint ~/notes/**"},
	}
	checkGrants(t, p, want)
	if p.Network {
		t.Errorf("fs:read opened the network")
	}
	// "~" grants the whole home.
	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read", Hints: []string{"~"}}})})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: h.Home, Access: Read, Why: "fs:read hint ~"}})
}

func checkGrants(t *testing.T, p Policy, want []Grant) {
	t.Helper()
	got, _ := json.Marshal(p.Grants)
	w, _ := json.Marshal(want)
	if len(want) == 0 {
		w = []byte("null")
	}
	if !bytes.Equal(got, w) {
		t.Errorf("grants:\n got %s\nwant %s", got, w)
	}
}

func TestDeriveFamilyMode(t *testing.T) {
	for _, c := range []struct {
		name, family, mode string
	}{
		{"fs:read", "fs", "read"},
		{"fs:write", "fs", "write"},
		{"fs.write", "fs", ""},
		{"fs", "fs", ""},
		{"network:http", "network", "http"},
		{"net.fetch", "net", ""},
		{"code:exec", "code", "exec"},
		{"fs.x:write", "fs", "write"},
	} {
		f, m := capabilityFamilyMode(c.name)
		if f != c.family || m != c.mode {
			t.Errorf("capabilityFamilyMode(%q) = %q, %q; want %q, %q", c.name, f, m, c.family, c.mode)
		}
	}

	h, _ := testHost(t)
	mkdirs(t, h.Home+"/d")
	for _, c := range []struct {
		name    string
		grant   bool
		access  Access
		network bool
		refused bool
	}{
		{"fs:read", true, Read, false, false},
		{"fs:write", true, Write, false, false},
		{"network:http", false, 0, true, false},
		{"network:sites", false, 0, true, false},
		// A path is prose to code:exec: noted, nothing granted.
		{"code:exec", false, 0, false, false},
		// Names outside the table are refused, not read by family.
		{"fs.write", false, 0, false, true},
		{"fs", false, 0, false, true},
		{"fs:write:more", false, 0, false, true},
		{"net.fetch", false, 0, false, true},
		{"net", false, 0, false, true},
		{"netx:http", false, 0, false, true},
		{"fsx:write", false, 0, false, true},
	} {
		p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: c.name, Hints: []string{"~/d/**"}}})})
		if c.refused {
			if !errors.Is(err, ErrCapabilityRefused) || !strings.Contains(fmt.Sprint(err), c.name) {
				t.Errorf("%s: err %v, want a refusal naming it", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if p.Network || (p.Egress != nil) != c.network {
			t.Errorf("%s: Network = %v, Egress = %v, want the network narrowed: %v", c.name, p.Network, p.Egress, c.network)
		}
		if !c.grant {
			if len(p.Grants) != 0 {
				t.Errorf("%s: grants %v, want none", c.name, p.Grants)
			}
			continue
		}
		if len(p.Grants) != 1 || p.Grants[0].Access != c.access || p.Grants[0].Path != h.Home+"/d" {
			t.Errorf("%s: grants %v, want %s %v", c.name, p.Grants, h.Home+"/d", c.access)
		}
	}
}

func TestDeriveArgs(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/docs/2024", h.Home+"/notes", h.Home+"/keyonly", root+"/data/deep")
	writeFile(t, h.Home+"/docs/2024/report.txt")
	args := map[string]any{
		"file": "~/docs/2024/report.txt",
		"nested": map[string]any{
			"list": []any{
				"not a path",
				3.0,
				true,
				nil,
				map[string]any{"out": root + "/data/deep/new/dir/file.csv"},
			},
		},
		"pattern":            "~/notes/{a,b}.md",
		"url":                "https://example.com/x",
		"relative":           "docs/x",
		"~/keyonly":          "keys are not paths",
		"windows":            `C:\Users\u\x`,
		"unc":                `\\server\share\x`,
		"multiline":          "/etc\n/usr",
		"tildeuser":          "~bob/x",
		root + "/keyonly-ab": 1.0,
	}
	caps := []Capability{{Name: "fs:read"}, {Name: "fs:write", Hints: nil}}
	p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", caps), Args: args})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{
		{Path: root + "/data/deep", Access: Write, Why: "arg " + root + "/data/deep/new/dir/file.csv"},
		{Path: h.Home + "/docs/2024", Access: Write, Why: "arg ~/docs/2024/report.txt"},
		{Path: h.Home + "/notes", Access: Write, Why: "arg ~/notes/{a,b}.md"},
	})

	// Read-only fs capabilities give read-only argument grants.
	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read"}}), Args: []any{"~"}})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: h.Home, Access: Read, Why: "arg ~"}})

	// The cut at '{' comes before the walk up, even when a directory
	// with a brace in its name exists.
	mkdirs(t, h.Home+"/notes/v{1}")
	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read"}}), Args: "~/notes/v{1}/x"})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: h.Home + "/notes", Access: Read, Why: "arg ~/notes/v{1}/x"}})

	// Typed containers are walked too.
	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read"}}),
		Args: map[string][]string{"x": {"~/notes/y"}}})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: h.Home + "/notes", Access: Read, Why: "arg ~/notes/y"}})

	// Without an fs capability the arguments grant nothing.
	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "network:http"}, {Name: "code:exec"}}), Args: args})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, nil)
}

func TestDeriveArgWalkUpToRoot(t *testing.T) {
	h, _ := testHost(t)
	p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read"}}), Args: "/no-such-dir-metnos/x/y"})
	if err != nil {
		t.Fatal(err)
	}
	// A grant of "/" becomes the readonly profile's shape.
	checkGrants(t, p, nil)
	if !p.RootReadable || p.RootWritable {
		t.Errorf("RootReadable=%v RootWritable=%v, want the root readable only", p.RootReadable, p.RootWritable)
	}
}

func TestDeriveAutonomy(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/w", root+"/exec")
	in := DeriveInput{
		Host:     h,
		Manifest: manifestOf("", []Capability{{Name: "fs:write", Hints: []string{"~/w/**"}}}),
		Args:     map[string]any{"p": "~/w/x"},
		Extra:    []Grant{{Path: root + "/exec", Access: Write, Why: "executor dir"}},
	}
	for _, a := range []Autonomy{"", AutonomySupervised} {
		in.Autonomy = a
		p, err := Derive(in)
		if err != nil {
			t.Fatal(err)
		}
		if p.Network {
			t.Errorf("autonomy %q opened the network", a)
		}
		for _, g := range p.Grants {
			if g.Access != Write {
				t.Errorf("autonomy %q: grant %v is not writable", a, g)
			}
		}
	}

	in.Autonomy = AutonomyReadonly
	p, err := Derive(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Grants) != 2 {
		t.Fatalf("readonly grants = %v", p.Grants)
	}
	for _, g := range p.Grants {
		if g.Access != Read {
			t.Errorf("readonly: grant %v is writable", g)
		}
	}

	in.Autonomy = AutonomyFull
	p, err = Derive(in)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Network {
		t.Errorf("full autonomy did not open the network")
	}

	in.Autonomy = "root"
	if _, err := Derive(in); err == nil || !strings.HasPrefix(err.Error(), "sandbox: ") {
		t.Errorf("unknown autonomy: err = %v", err)
	}
}

func TestDeriveSymlink(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, root+"/store/photos")
	symlink(t, root+"/store/photos", h.Home+"/Pictures")
	p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read", Hints: []string{"~/Pictures/**"}}})})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: root + "/store/photos", Access: Read, Via: h.Home + "/Pictures", Why: "fs:read hint ~/Pictures/**"}})

	// An argument through the link.
	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read"}}), Args: "~/Pictures/new.png"})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: root + "/store/photos", Access: Read, Via: h.Home + "/Pictures", Why: "arg ~/Pictures/new.png"}})
}

func TestDeriveNucleusDropped(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/.ssh/keys", h.Home+"/.config/metnos/keys", h.Home+"/ok", root+"/agentdata/x", h.RuntimeDir+"/sub")
	symlink(t, h.Home+"/.ssh/keys", h.Home+"/innocent")
	symlink(t, h.Home+"/.ssh", h.Home+"/ok/ssh-link")
	// A link inside the nucleus pointing out of it: the named path is
	// masked, so it is dropped too.
	mkdirs(t, root+"/outside")
	symlink(t, root+"/outside", h.Home+"/.ssh/out")
	p, err := Derive(DeriveInput{
		Host: h,
		Manifest: manifestOf("", []Capability{{Name: "fs:write", Hints: []string{
			"~/.ssh/**", "~/.ssh", "~/.ssh/out", "~/innocent/**", "~/ok/ssh-link/keys", "~/.config/metnos", h.RuntimeDir + "/**", "~/ok/**",
		}}}),
		Args:  []any{"~/.ssh/id_ed25519", "~/ok/ssh-link/new", root + "/agentdata/x/y", h.RuntimeDir + "/sub/z"},
		Extra: []Grant{{Path: "~/.config/metnos/keys", Access: Read}, {Path: root + "/agentdata", Access: Write}},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: h.Home + "/ok", Access: Write, Why: "fs:write hint ~/ok/**"}})
}

func TestDeriveNucleusDroppedHomeBehindLink(t *testing.T) {
	h, root := testHost(t)
	real := root + "/var/home/u"
	mkdirs(t, real+"/.ssh", real+"/notes")
	symlink(t, real, root+"/linkhome")
	h.Home = root + "/linkhome"
	p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read", Hints: []string{"~/.ssh", real + "/.ssh/**", "~/notes"}}})})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: real + "/notes", Access: Read, Via: h.Home + "/notes", Why: "fs:read hint ~/notes"}})
}

func TestDeriveDuplicatesFolded(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/notes", root+"/exec")
	symlink(t, h.Home+"/notes", h.Home+"/n")
	p, err := Derive(DeriveInput{
		Host: h,
		Manifest: manifestOf("", []Capability{
			{Name: "fs:read", Hints: []string{"~/notes", "~/notes/**", "~/n/*"}},
			{Name: "fs:write", Hints: []string{"~/notes/*.md"}},
		}),
		Args:  []any{"~/notes/a", "~/notes/b"},
		Extra: []Grant{{Path: root + "/exec", Access: Read}, {Path: root + "/exec/", Access: Read}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Grants) != 2 {
		t.Fatalf("grants = %v, want 2", p.Grants)
	}
	if g := p.Grants[1]; g.Path != h.Home+"/notes" || g.Access != Write {
		t.Errorf("folded grant = %v, want %s write", g, h.Home+"/notes")
	}
}

func TestDeriveSystemAndMinSandbox(t *testing.T) {
	h, root := testHost(t)
	p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("job-object", nil)})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(p.System, " ") != root+"/sys/etc "+root+"/sys/usr" {
		t.Errorf("System = %v", p.System)
	}
	if p.MinSandbox != LevelContained || p.Profile != ProfileManifest || p.Network || p.RootReadable || p.RootWritable {
		t.Errorf("policy = %+v", p)
	}
	if !hasMask(p.Masks, h.Home+"/.ssh") || !hasMask(p.Masks, h.RuntimeDir) || !hasMask(p.Masks, root+"/dbus/bus") {
		t.Errorf("masks lack the nucleus or the session IPC: %v", p.Masks)
	}
	if _, err := ParseManifest(nil, "chroot"); err == nil {
		t.Errorf("unknown min_sandbox accepted")
	}
	if _, err := Derive(DeriveInput{Host: Host{Home: ""}}); err == nil {
		t.Errorf("host without a home accepted")
	}
	_, err = Derive(DeriveInput{Host: h, Extra: []Grant{{Path: "rel/dir", Access: Read}}})
	if err == nil || !strings.Contains(err.Error(), "rel/dir") {
		t.Errorf("relative extra grant: err = %v", err)
	}
	// A missing Extra path is skipped.
	p, err = Derive(DeriveInput{Host: h, Extra: []Grant{{Path: root + "/nope", Access: Read}}})
	if err != nil || len(p.Grants) != 0 {
		t.Errorf("missing extra: %v, %v", p.Grants, err)
	}
}

func TestFingerprint(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/a", h.Home+"/b", h.Home+"/c", root+"/exec", root+"/store")
	symlink(t, root+"/store", h.Home+"/s")
	symlink(t, root+"/store", h.Home+"/s2")
	in1 := DeriveInput{
		Host: h,
		Manifest: manifestOf("", []Capability{
			{Name: "fs:read", Hints: []string{"~/a/**", "~/s", "~/b", "~/s2"}},
			{Name: "fs:write", Hints: []string{"~/c/*"}},
			{Name: "network:http"},
		}),
		Args:  map[string]any{"x": []any{"~/a/1", root + "/store/q"}, "y": "~/b/2"},
		Extra: []Grant{{Path: root + "/exec", Access: Read, Why: "executor"}},
	}
	in2 := DeriveInput{
		Host: h,
		Manifest: manifestOf("", []Capability{
			{Name: "network:http"},
			{Name: "fs:write", Hints: []string{"~/c/**"}},
			{Name: "fs:read", Hints: []string{"~/s2/**", "~/b", "~/s/**", "~/a"}},
		}),
		Args:  map[string]any{"y": "~/b/2", "x": []any{root + "/store/q", "~/a/1"}},
		Extra: []Grant{{Path: root + "/exec/", Access: Read, Why: "other words"}},
	}
	p1, err := Derive(in1)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := Derive(in2)
	if err != nil {
		t.Fatal(err)
	}
	f1, f2 := p1.Fingerprint(), p2.Fingerprint()
	if f1 != f2 {
		t.Errorf("fingerprint changes with the order: %s != %s\n%+v\n%+v", f1, f2, p1, p2)
	}
	if !strings.HasPrefix(f1, "pol1:") || len(f1) != len("pol1:")+16 {
		t.Errorf("fingerprint %q", f1)
	}
	for i := 0; i < 5; i++ {
		if p, _ := Derive(in1); p.Fingerprint() != f1 {
			t.Fatalf("fingerprint not stable across runs")
		}
	}

	// A grant more changes it.
	in3 := in1
	in3.Args = nil
	p3, err := Derive(in3)
	if err != nil {
		t.Fatal(err)
	}
	f3 := p3.Fingerprint()
	if f3 == f1 {
		t.Errorf("fingerprint unchanged when the argument grants went away")
	}
	// A grant changing access changes it.
	in4 := in3
	in4.Manifest = manifestOf("", []Capability{
		{Name: "fs:read", Hints: []string{"~/s", "~/b"}},
		{Name: "fs:write", Hints: []string{"~/c/*", "~/a/**"}},
		{Name: "network:http"},
	})
	p4, err := Derive(in4)
	if err != nil {
		t.Fatal(err)
	}
	if len(p4.Grants) != len(p3.Grants) || p4.Fingerprint() == f3 {
		t.Errorf("fingerprint unchanged when ~/a became writable:\n%v\n%v", p3.Grants, p4.Grants)
	}
	// A grant changing path changes it too.
	p5 := p3
	p5.Grants = append([]Grant(nil), p3.Grants...)
	p5.Grants[0].Path += "x"
	if p5.Fingerprint() == f3 {
		t.Errorf("fingerprint unchanged when a grant path changed")
	}
	// Why is for humans only.
	p6 := p3
	p6.Grants = append([]Grant(nil), p3.Grants...)
	p6.Grants[0].Why = "something else"
	if p6.Fingerprint() != f3 {
		t.Errorf("fingerprint changed with Why")
	}
}

func TestProfile(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/proj", h.Home+"/ref", h.Home+"/.ssh", root+"/store")
	symlink(t, root+"/store", h.Home+"/st")
	base := ProfileInput{Host: h, Read: []string{"~/ref"}, Write: []string{"~/proj", "~/st"}}

	in := base
	in.Profile = ProfileSupervised
	p, err := ForProfile(in)
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{
		{Path: h.Home + "/proj", Access: Write, Why: "--write ~/proj"},
		{Path: h.Home + "/ref", Access: Read, Why: "--read ~/ref"},
		{Path: root + "/store", Access: Write, Via: h.Home + "/st", Why: "--write ~/st"},
	})
	if p.Network || p.RootReadable || p.RootWritable || len(p.System) != 2 || !hasMask(p.Masks, h.Home+"/.ssh") {
		t.Errorf("supervised = %+v", p)
	}
	in.Network = true
	if p, _ := ForProfile(in); !p.Network {
		t.Errorf("supervised --net: network closed")
	}

	in = base
	in.Profile = ProfileReadonly
	p, err = ForProfile(in)
	if err != nil {
		t.Fatal(err)
	}
	if !p.RootReadable || p.RootWritable || p.Network {
		t.Errorf("readonly = %+v", p)
	}
	for _, g := range p.Grants {
		if g.Access != Read {
			t.Errorf("readonly grant %v is writable", g)
		}
	}

	in = base
	in.Profile = ProfileFull
	p, err = ForProfile(in)
	if err != nil {
		t.Fatal(err)
	}
	if !p.RootWritable || !p.Network || len(p.Grants) != 3 {
		t.Errorf("full = %+v", p)
	}

	in = base
	in.Profile = ProfileFullFSNoNet
	p, err = ForProfile(in)
	if err != nil {
		t.Fatal(err)
	}
	if !p.RootWritable || !p.RealDev || !p.SharePID || p.Network || !p.NoFallback || !p.UnixSockets || p.MinSandbox != LevelFull || !hasMask(p.Masks, "/run/user/1000") {
		t.Errorf("full-fs-no-net = %+v", p)
	}
	in.Network = true
	_, err = ForProfile(in)
	if err == nil || err.Error() != "sandbox: profile full-fs-no-net cuts the network; --net contradicts it" {
		t.Errorf("full-fs-no-net --net: err = %v", err)
	}

	for _, prof := range []Profile{ProfileManifest, "", "paranoid"} {
		_, err := ForProfile(ProfileInput{Host: h, Profile: prof})
		if err == nil || !strings.Contains(err.Error(), "readonly, supervised, full or full-fs-no-net") {
			t.Errorf("profile %q: err = %v", prof, err)
		}
	}
}

func TestProfileErrors(t *testing.T) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/.ssh", h.Home+"/proj")
	symlink(t, h.Home+"/.ssh", h.Home+"/proj/keys")
	for _, c := range []struct {
		in   ProfileInput
		want string
	}{
		{ProfileInput{Profile: ProfileSupervised, Read: []string{root + "/x"}},
			"sandbox: --read " + root + "/x: no such file or directory"},
		{ProfileInput{Profile: ProfileSupervised, Write: []string{"~/.ssh"}},
			"sandbox: --write ~/.ssh: inside the device nucleus (~/.ssh); no grant can open it"},
		{ProfileInput{Profile: ProfileFull, Read: []string{"~/proj/keys"}},
			"sandbox: --read ~/proj/keys: inside the device nucleus (~/.ssh); no grant can open it"},
		{ProfileInput{Profile: ProfileReadonly, Read: []string{"~/.config/metnos"}},
			"sandbox: --read ~/.config/metnos: no such file or directory"},
		{ProfileInput{Profile: ProfileSupervised, Write: []string{"/"}},
			"sandbox: --write /: the root can only be granted read-only (the full profiles make it writable)"},
		{ProfileInput{Profile: ProfileSupervised, Read: []string{""}},
			"sandbox: --read: empty path"},
	} {
		c.in.Host = h
		_, err := ForProfile(c.in)
		if err == nil || err.Error() != c.want {
			t.Errorf("ForProfile(%+v):\n got %v\nwant %s", c.in, err, c.want)
		}
	}
	// The root is fine read-only, or writable in a full profile.
	for _, in := range []ProfileInput{
		{Profile: ProfileSupervised, Read: []string{"/"}},
		{Profile: ProfileReadonly, Write: []string{"/"}},
		{Profile: ProfileFull, Write: []string{"/"}},
	} {
		in.Host = h
		if _, err := ForProfile(in); err != nil {
			t.Errorf("ForProfile(%v %v %v): %v", in.Profile, in.Read, in.Write, err)
		}
	}
}

func TestProfileRelativePath(t *testing.T) {
	h, _ := testHost(t)
	mkdirs(t, h.Home+"/proj/sub")
	t.Chdir(h.Home + "/proj")
	p, err := ForProfile(ProfileInput{Profile: ProfileSupervised, Host: h, Write: []string{"sub", "."}})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{
		{Path: h.Home + "/proj", Access: Write, Why: "--write ."},
		{Path: h.Home + "/proj/sub", Access: Write, Why: "--write sub"},
	})
}

// goldenHost builds the fixed tree the golden files describe.
func goldenHost(t *testing.T) (Host, string) {
	h, root := testHost(t)
	mkdirs(t, h.Home+"/notes/2024", h.Home+"/Pictures", h.Home+"/.ssh", root+"/exec/calendar",
		root+"/shim", root+"/python/bin", root+"/store/music")
	symlink(t, root+"/store/music", h.Home+"/Music")
	return h, root
}

func TestDeriveGolden(t *testing.T) {
	cases := []struct {
		name string
		in   func(h Host, root string) DeriveInput
	}{
		{"manifest_notes", func(h Host, root string) DeriveInput {
			return DeriveInput{
				Manifest: manifestOf("landlock+seccomp", []Capability{
					{Name: "fs:read", Hints: []string{"~/notes/**", "~/Music/*", "~/.ssh/**"}},
					{Name: "fs:write", Hints: []string{"~/notes/2024/*.md", "~/missing/**"}},
					{Name: "network:http"},
				}),
				Args: map[string]any{
					"path":  "~/Pictures/{x,y}.png",
					"items": []any{"~/notes/2024/new.md", "~/.ssh/id_ed25519", 1.0},
				},
				Extra: []Grant{
					{Path: root + "/exec/calendar", Access: Read, Why: "executor dir"},
					{Path: root + "/shim", Access: Read, Why: "shim dir"},
					{Path: root + "/python", Access: Read, Why: "interpreter root"},
				},
			}
		}},
		{"manifest_readonly", func(h Host, root string) DeriveInput {
			return DeriveInput{
				Manifest: manifestOf("", []Capability{{Name: "fs:write", Hints: []string{"~/notes/**"}}}),
				Args:     []any{"~/Music/new"},
				Autonomy: AutonomyReadonly,
				Extra:    []Grant{{Path: root + "/exec/calendar", Access: Write, Why: "executor dir"}},
			}
		}},
		{"manifest_full", func(h Host, root string) DeriveInput {
			return DeriveInput{
				Manifest: manifestOf("full", []Capability{{Name: "code:exec"}, {Name: "fs:read", Hints: []string{"~/Pictures"}}}),
				Autonomy: AutonomyFull,
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, root := goldenHost(t)
			in := c.in(h, root)
			in.Host = h
			p, err := Derive(in)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, c.name, p, root)
		})
	}
}

func TestProfileGolden(t *testing.T) {
	for _, prof := range []Profile{ProfileReadonly, ProfileSupervised, ProfileFull, ProfileFullFSNoNet} {
		t.Run(string(prof), func(t *testing.T) {
			h, root := goldenHost(t)
			p, err := ForProfile(ProfileInput{
				Profile: prof,
				Host:    h,
				Read:    []string{"~/Pictures", "~/Music"},
				Write:   []string{"~/notes"},
			})
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, "profile_"+strings.ReplaceAll(string(prof), "-", "_"), p, root)
		})
	}
}

// checkGolden compares the JSON of p, with root written as $ROOT, to
// testdata/derive/<name>.golden, or rewrites the file under -update.
// The lists are sorted again after the rewriting, so that where the
// temporary directory sorts does not matter. Link-target masks outside
// root depend on the machine running the test (a symlinked /etc/ssh,
// /run, ...) and are left out.
func checkGolden(t *testing.T, name string, p Policy, root string) {
	t.Helper()
	rel := func(s string) string { return strings.ReplaceAll(s, root, "$ROOT") }
	q := p
	q.System, q.Grants, q.Masks = nil, nil, nil
	for _, s := range p.System {
		q.System = append(q.System, rel(s))
	}
	for _, g := range p.Grants {
		g.Path, g.Via, g.Why = rel(g.Path), rel(g.Via), rel(g.Why)
		q.Grants = append(q.Grants, g)
	}
	for _, m := range p.Masks {
		if strings.HasSuffix(m.Why, "(link target)") && !pathWithin(m.Path, root) {
			continue
		}
		m.Path, m.Why = rel(m.Path), rel(m.Why)
		q.Masks = append(q.Masks, m)
	}
	q.Normalize()
	b, err := json.MarshalIndent(q, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got := string(b) + "\n"
	if strings.Contains(got, root) {
		t.Fatalf("%s still names the temporary directory:\n%s", name, got)
	}
	golden.Compare(t, filepath.Join("testdata", "derive", name+".golden"), []byte(got))
}

// Arguments naming kernel interfaces or system paths do not hand them to
// a writing executor: /proc/sys is dropped, /etc and / become read-only.
func TestDeriveGuardsSystemPaths(t *testing.T) {
	h, _ := testHost(t)
	for _, c := range []struct {
		arg  string
		want []Grant
	}{
		{"/proc/sys/kernel", nil},
		{"/sys/kernel", nil},
		{"/dev/shm", nil},
		{"/etc", []Grant{{Path: "/etc", Access: Read}}},
		{"/", nil}, // RootReadable, checked below
		{"/usr/lib", []Grant{{Path: "/usr/lib", Access: Read}}},
		{"/opt", []Grant{{Path: "/opt", Access: Read}}},
		{"/home", []Grant{{Path: "/home", Access: Read}}}, // everyone's homes
	} {
		p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:write"}}), Args: map[string]any{"path": c.arg}})
		if err != nil {
			t.Fatal(err)
		}
		var got []Grant
		for _, g := range p.Grants {
			got = append(got, Grant{Path: g.Path, Access: g.Access})
		}
		if len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) {
			t.Errorf("arg %s with fs:write: grants %v, want %v", c.arg, got, c.want)
		}
		if c.arg == "/" && (!p.RootReadable || p.RootWritable) {
			t.Errorf("arg / with fs:write: RootReadable=%v RootWritable=%v, want readable only", p.RootReadable, p.RootWritable)
		}
	}
}

// TestDeriveOwnGrantThroughMask: only the agent's own Extra grants open
// inside its masked directories; the same path from an argument, a hint
// or a plain Extra grant is dropped.
func TestDeriveOwnGrantThroughMask(t *testing.T) {
	h, _ := testHost(t)
	mkdirs(t, h.Home+"/.config/metnos/shimdata", h.Home+"/.config/metnos/other")
	p, err := Derive(DeriveInput{
		Host:     h,
		Manifest: manifestOf("", []Capability{{Name: "fs:write", Hints: []string{"~/.config/metnos/other/**"}}}),
		Args:     []any{"~/.config/metnos/other/x"},
		Extra: []Grant{
			{Path: "~/.config/metnos/shimdata", Access: Write, Own: true, Why: "user data"},
			{Path: "~/.config/metnos/other", Access: Write, Why: "not own"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkGrants(t, p, []Grant{{Path: h.Home + "/.config/metnos/shimdata", Access: Write, Why: "user data", Own: true}})
}

// manifestOf is ParseManifest(caps, min) for a test's own, valid input.
func manifestOf(min string, caps []Capability) Manifest {
	m, err := ParseManifest(caps, min)
	if err != nil {
		panic(err)
	}
	return m
}
