package policy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testHost builds a Host rooted in a fresh temporary directory, so that
// nothing touches the real home: root/home is the home, root/sys/{usr,etc}
// are the system paths (root/sys/missing is a candidate that does not
// exist), root/run/user/1000 is $XDG_RUNTIME_DIR and the session bus
// lives at root/dbus/bus. It returns the host and the (resolved) root.
func testHost(t *testing.T) (Host, string) {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(root, "home")
	mkdirs(t, home, filepath.Join(root, "sys", "usr"), filepath.Join(root, "sys", "etc"),
		filepath.Join(root, "run", "user", "1000"), filepath.Join(root, "dbus"))
	return Host{
		Home:        home,
		UID:         1000,
		RuntimeDir:  filepath.Join(root, "run", "user", "1000"),
		DBusSession: "unix:path=" + filepath.Join(root, "dbus", "bus") + ",guid=42;unix:abstract=/tmp/dbus-abc",
		// As the agent's layout lists them: the Linux places, then one
		// elsewhere.
		AgentDataDirs: []string{filepath.Join(home, ".config", "metnos"), filepath.Join(home, ".local", "share", "metnos"),
			filepath.Join(home, ".cache", "metnos"), filepath.Join(root, "agentdata")},
		SystemPaths: []string{
			filepath.Join(root, "sys", "usr"),
			filepath.Join(root, "sys", "etc"),
			filepath.Join(root, "sys", "missing"),
		},
	}, root
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(t *testing.T, path string) {
	t.Helper()
	mkdirs(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	mkdirs(t, filepath.Dir(link))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func maskByPath(ms []Mask, path string) (Mask, bool) {
	for _, m := range ms {
		if m.Path == path {
			return m, true
		}
	}
	return Mask{}, false
}

func TestNucleusEntries(t *testing.T) {
	h, root := testHost(t)
	ms := Nucleus(h)
	want := []struct {
		path string
		kind MaskKind
		why  string
	}{
		{h.Home + "/.ssh", MaskDir, "~/.ssh"},
		{h.Home + "/.gnupg", MaskDir, "~/.gnupg"},
		{h.Home + "/.netrc", MaskFile, "~/.netrc"},
		{h.Home + "/.config/gcloud", MaskDir, "~/.config/gcloud"},
		{h.Home + "/.var/app", MaskDir, "~/.var/app"},
		{h.Home + "/.m2/settings.xml", MaskFile, "~/.m2/settings.xml"},
		{h.Home + "/.cargo/credentials.toml", MaskFile, "~/.cargo/credentials.toml"},
		{h.Home + "/.config/git/credentials", MaskFile, "~/.config/git/credentials"},
		{h.Home + "/.config/metnos", MaskDir, "agent data " + h.Home + "/.config/metnos"},
		{h.Home + "/.local/share/metnos", MaskDir, "agent data " + h.Home + "/.local/share/metnos"},
		{h.Home + "/.cache/metnos", MaskDir, "agent data " + h.Home + "/.cache/metnos"},
		{root + "/agentdata", MaskDir, "agent data " + root + "/agentdata"},
		{"/etc/shadow", MaskFile, "/etc/shadow"},
		{"/etc/gshadow-", MaskFile, "/etc/gshadow-"},
		{"/etc/ssh", MaskDir, "/etc/ssh"},
		{"/etc/sudoers", MaskFile, "/etc/sudoers"},
		{"/etc/sudoers.d", MaskDir, "/etc/sudoers.d"},
		{"/var/backups", MaskDir, "/var/backups"},
		{"/root", MaskDir, "/root"},
	}
	for _, w := range want {
		m, ok := maskByPath(ms, w.path)
		if !ok {
			t.Errorf("Nucleus lacks %s", w.path)
			continue
		}
		if m.Kind != w.kind || m.Why != w.why {
			t.Errorf("Nucleus mask %s = %v %q, want %v %q", w.path, m.Kind, m.Why, w.kind, w.why)
		}
	}
	seen := map[string]bool{}
	for _, m := range ms {
		if seen[m.Path] {
			t.Errorf("Nucleus lists %s twice", m.Path)
		}
		seen[m.Path] = true
		if m.Path == "/boot" {
			t.Errorf("Nucleus masks /boot")
		}
	}
}

func TestNucleusRootHome(t *testing.T) {
	for _, home := range []string{"/root", "/root/sub"} {
		ms := Nucleus(Host{Home: home})
		if _, ok := maskByPath(ms, "/root"); ok {
			t.Errorf("home %s: /root is masked as a whole", home)
		}
		if _, ok := maskByPath(ms, home+"/.ssh"); !ok {
			t.Errorf("home %s: %s/.ssh is not masked", home, home)
		}
	}
	if ms := Nucleus(Host{Home: "/rootless"}); !hasMask(ms, "/root") {
		t.Errorf("home /rootless: /root is not masked")
	}
	if ms := Nucleus(Host{Home: "relative"}); ms != nil {
		t.Errorf("relative home: Nucleus = %v, want nil", ms)
	}
}

func hasMask(ms []Mask, path string) bool {
	_, ok := maskByPath(ms, path)
	return ok
}

func TestNucleusLinkTargets(t *testing.T) {
	h, root := testHost(t)
	dot := filepath.Join(root, "dotfiles")
	mkdirs(t, filepath.Join(dot, "ssh"))
	symlink(t, filepath.Join(dot, "ssh"), filepath.Join(h.Home, ".ssh"))
	// A dangling link: its target must be masked too, so that it
	// cannot be created.
	symlink(t, filepath.Join(dot, "aws-not-yet"), filepath.Join(h.Home, ".aws"))
	// A file link.
	writeFile(t, filepath.Join(dot, "netrc"))
	symlink(t, "../dotfiles/netrc", filepath.Join(h.Home, ".netrc"))

	ms := Nucleus(h)
	for _, c := range []struct {
		path string
		kind MaskKind
		why  string
	}{
		{filepath.Join(dot, "ssh"), MaskDir, "~/.ssh (link target)"},
		{filepath.Join(dot, "aws-not-yet"), MaskDir, "~/.aws (link target)"},
		{filepath.Join(dot, "netrc"), MaskFile, "~/.netrc (link target)"},
	} {
		m, ok := maskByPath(ms, c.path)
		if !ok {
			t.Errorf("Nucleus lacks link target %s", c.path)
			continue
		}
		if m.Kind != c.kind || m.Why != c.why {
			t.Errorf("link target %s = %v %q, want %v %q", c.path, m.Kind, m.Why, c.kind, c.why)
		}
	}
	if !hasMask(ms, filepath.Join(h.Home, ".ssh")) {
		t.Errorf("Nucleus lacks the link itself")
	}
}

func TestNucleusHomeBehindLink(t *testing.T) {
	h, root := testHost(t)
	real := filepath.Join(root, "var", "home", "u")
	mkdirs(t, real)
	symlink(t, real, filepath.Join(root, "linkhome"))
	h.Home = filepath.Join(root, "linkhome")
	ms := Nucleus(h)
	if !hasMask(ms, filepath.Join(real, ".ssh")) {
		t.Errorf("home behind a symlink: %s/.ssh is not masked", real)
	}
}

func TestNucleusSessionIPC(t *testing.T) {
	h, root := testHost(t)
	ms := SessionIPC(h)
	want := map[string]MaskKind{
		h.RuntimeDir:                       MaskDir,
		"/run/user/1000":                   MaskDir,
		"/tmp/.X11-unix":                   MaskDir,
		filepath.Join(root, "dbus", "bus"): MaskFile,
	}
	for p, k := range want {
		m, ok := maskByPath(ms, p)
		if !ok {
			t.Errorf("SessionIPC lacks %s", p)
		} else if m.Kind != k {
			t.Errorf("SessionIPC %s kind %v, want %v", p, m.Kind, k)
		}
	}
	for _, m := range ms {
		if strings.Contains(m.Path, "dbus-abc") {
			t.Errorf("SessionIPC masks the abstract socket: %v", m)
		}
	}

	// A bus inside the runtime dir needs no mask of its own; several
	// addresses and escapes are understood.
	h.DBusSession = "unix:path=" + h.RuntimeDir + "/bus;unix:abstract=/x;unix:path=/srv/my%20bus,guid=1;tcp:host=localhost,port=1"
	ms = SessionIPC(h)
	if hasMask(ms, h.RuntimeDir+"/bus") {
		t.Errorf("bus inside $XDG_RUNTIME_DIR masked on its own")
	}
	if m, ok := maskByPath(ms, "/srv/my bus"); !ok || m.Kind != MaskFile {
		t.Errorf("escaped bus path not masked as a file: %v %v", m, ok)
	}
	if hasMask(ms, "/run/dbus/system_bus_socket") {
		t.Errorf("system bus masked")
	}

	// No session at all still masks the fixed directories.
	ms = SessionIPC(Host{Home: "/h", UID: 7})
	if !hasMask(ms, "/run/user/7") || !hasMask(ms, "/tmp/.X11-unix") {
		t.Errorf("SessionIPC without a session = %v", ms)
	}
	// $XDG_RUNTIME_DIR equal to /run/user/<uid> is listed once.
	ms = SessionIPC(Host{Home: "/h", UID: 7, RuntimeDir: "/run/user/7/"})
	n := 0
	for _, m := range ms {
		if m.Path == "/run/user/7" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("/run/user/7 listed %d times", n)
	}
}

func TestNucleusCoveredByMask(t *testing.T) {
	ms := []Mask{{Path: "/h/.ssh", Why: "~/.ssh"}, {Path: "/etc/shadow", Kind: MaskFile, Why: "/etc/shadow"}, {Path: "/", Why: "all"}}
	for _, c := range []struct {
		path string
		why  string
		ok   bool
	}{
		{"/h/.ssh", "~/.ssh", true},
		{"/h/.ssh/", "~/.ssh", true},
		{"/h/.ssh/id_rsa", "~/.ssh", true},
		{"/h/x/../.ssh/id", "~/.ssh", true},
		{"/h/.sshx", "all", true},
		{"/etc/shadow", "/etc/shadow", true},
	} {
		m, ok := CoveredByMask(c.path, ms)
		if ok != c.ok || m.Why != c.why {
			t.Errorf("CoveredByMask(%q) = %q, %v; want %q, %v", c.path, m.Why, ok, c.why, c.ok)
		}
	}
	ms = ms[:2]
	for _, p := range []string{"/h/.sshx", "/h/.ss", "/h", "/etc/shadow-", "/etc"} {
		if m, ok := CoveredByMask(p, ms); ok {
			t.Errorf("CoveredByMask(%q) = %v, want none", p, m)
		}
	}
}

func TestNucleusResolveLoose(t *testing.T) {
	_, root := testHost(t)
	mkdirs(t, filepath.Join(root, "real", "d"))
	symlink(t, filepath.Join(root, "real"), filepath.Join(root, "l"))
	symlink(t, "nowhere/yet", filepath.Join(root, "real", "dangling"))
	for _, c := range []struct{ in, want string }{
		{root + "/l/d", root + "/real/d"},
		{root + "/l/missing/x", root + "/real/missing/x"},
		{root + "/l/dangling/x", root + "/real/nowhere/yet/x"},
		{root + "/none/x", root + "/none/x"},
	} {
		if got := resolveLoose(c.in); got != c.want {
			t.Errorf("resolveLoose(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// A loop ends.
	symlink(t, "loop2", filepath.Join(root, "loop1"))
	symlink(t, "loop1", filepath.Join(root, "loop2"))
	_ = resolveLoose(root + "/loop1/x")
}

// TestNucleusNever: the owner's never entries join the nucleus, ~
// expanded, an existing file as a file and anything else as a folder,
// with their link targets; a grant of the whole home, or one an
// argument names inside them, does not reach them.
func TestNucleusNever(t *testing.T) {
	h, root := testHost(t)
	private := filepath.Join(h.Home, "Private")
	mkdirs(t, private)
	letter := filepath.Join(root, "srv", "letter.txt")
	writeFile(t, letter)
	symlink(t, private, filepath.Join(h.Home, "Link"))
	h.Never = []string{"~/Private", letter, filepath.Join(root, "srv", "absent"), "relative", "~/Link"}
	ms := Nucleus(h)
	for _, want := range []Mask{
		{Path: private, Kind: MaskDir},
		{Path: letter, Kind: MaskFile},
		{Path: filepath.Join(root, "srv", "absent"), Kind: MaskDir},
		{Path: filepath.Join(h.Home, "Link"), Kind: MaskDir},
	} {
		m, ok := maskByPath(ms, want.Path)
		if !ok || m.Kind != want.Kind || !strings.HasPrefix(m.Why, "owner's never ") {
			t.Errorf("mask of %s: %+v (found %v), want kind %s from the owner's never", want.Path, m, ok, want.Kind)
		}
	}
	if _, ok := maskByPath(ms, "relative"); ok {
		t.Error("a relative never entry was masked")
	}
	m, err := ParseManifest([]Capability{{Name: "fs:write"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Derive(DeriveInput{Manifest: m, Args: map[string]any{"a": h.Home, "b": filepath.Join(private, "x.txt")}, Host: h})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := CoveredByMask(filepath.Join(private, "x.txt"), p.Masks); !ok {
		t.Errorf("the policy's masks do not cover %s: %+v", private, p.Masks)
	}
	for _, g := range p.Grants {
		if pathWithin(g.Path, private) {
			t.Errorf("a grant reaches the owner's never folder: %+v", g)
		}
	}
}

// TestNucleusEvalSymlinks: the resolver's memoised evalSymlinks answers
// as filepath.EvalSymlinks does, path for path, asked in any order
// through one resolver: links absolute and relative, chained, to files,
// dangling, in a loop, and below each of them.
func TestNucleusEvalSymlinks(t *testing.T) {
	_, root := testHost(t)
	mkdirs(t, filepath.Join(root, "real", "d", "e"))
	if err := os.WriteFile(filepath.Join(root, "real", "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	symlink(t, filepath.Join(root, "real"), filepath.Join(root, "abs"))
	symlink(t, "real/d", filepath.Join(root, "rel"))
	symlink(t, "../abs", filepath.Join(root, "real", "up"))
	symlink(t, "rel", filepath.Join(root, "chain"))
	symlink(t, "f", filepath.Join(root, "real", "tofile"))
	symlink(t, "nowhere", filepath.Join(root, "real", "dangling"))
	symlink(t, "loop2", filepath.Join(root, "loop1"))
	symlink(t, "loop1", filepath.Join(root, "loop2"))
	var paths []string
	for _, p := range []string{"", "real", "real/d", "real/d/e", "real/f", "real/f/x", "abs", "abs/d/e", "abs/up/d", "rel", "rel/e",
		"chain", "chain/e/x", "real/tofile", "real/tofile/x", "real/dangling", "real/dangling/x", "loop1", "loop1/x", "none", "none/x", "abs/none/x"} {
		paths = append(paths, filepath.Join(root, p))
	}
	paths = append(paths, "/", filepath.Dir(root))
	reversed := slices.Clone(paths)
	slices.Reverse(reversed)
	for _, order := range [][]string{paths, reversed} {
		r := &linkResolver{}
		for _, p := range order {
			want, werr := filepath.EvalSymlinks(p)
			got, err := r.evalSymlinks(p)
			if (err == nil) != (werr == nil) || (err == nil && got != want) {
				t.Errorf("evalSymlinks(%q) = %q, %v; filepath.EvalSymlinks gives %q, %v", p, got, err, want, werr)
			}
		}
	}
}
