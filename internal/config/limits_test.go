package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// TestLimitsDefaults: without a file (or a path), the limits are
// today's behaviour, every setting from its default; the template
// `limits edit` writes says nothing either.
func TestLimitsDefaults(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{"", filepath.Join(dir, "limits.toml")} {
		l, err := LoadLimits(path, dir, Config{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Present || l.InForce() != ModeFull || l.Never != nil || l.Network.Allow != nil || l.Executors.Deny != nil || l.Priority != (Priority{}) {
			t.Errorf("LoadLimits(%q) = %+v, want the defaults", path, l)
		}
		for _, s := range l.Settings() {
			if s.Source != FromDefault {
				t.Errorf("%s: from %s, want default", s.Key, s.Source)
			}
		}
		if got := l.RefuseExecutor("anything"); got != "" {
			t.Errorf("the defaults refuse an executor: %s", got)
		}
	}
	l, err := ParseLimits([]byte(LimitsTemplate), "limits.toml", dir)
	if err != nil {
		t.Fatalf("the template: %v", err)
	}
	if ch := DiffLimits(Limits{}, l); len(ch) != 0 {
		t.Errorf("the template sets %+v, want nothing", ch)
	}
}

// TestLimitsKeys: each key of the file, what it gives and that it
// comes from the file (and from where in it).
func TestLimitsKeys(t *testing.T) {
	home := filepath.Join(string(filepath.Separator), "home", "ada")
	for _, tt := range []struct {
		name string
		file string
		got  func(Limits) any
		want any
		key  string // the key the file sets, at row 1
	}{
		{name: "mode full", file: `mode = "full"`, got: func(l Limits) any { return l.InForce() }, want: ModeFull, key: "mode"},
		{name: "mode supervised", file: `mode = "supervised"`, got: func(l Limits) any { return l.InForce() }, want: ModeSupervised, key: "mode"},
		{name: "mode readonly", file: `mode = "readonly"`, got: func(l Limits) any { return l.InForce() }, want: ModeReadonly, key: "mode"},
		{name: "mode preview", file: `mode = "preview"`, got: func(l Limits) any { return l.InForce() }, want: ModePreview, key: "mode"},
		{name: "never expands ~", file: `never = ["~/Private", "/srv/family/", "~/Private"]`, got: func(l Limits) any { return l.Never },
			want: []string{filepath.Join(home, "Private"), filepath.Clean("/srv/family")}, key: "never"},
		{name: "never as written", file: `never = ["~/Private", "/srv/family/"]`, got: func(l Limits) any { return l.NeverAsWritten },
			want: []string{"~/Private", "/srv/family/"}, key: "never"},
		{name: "network allow", file: "[network]\nallow = [\"nas.local\", \"192.168.1.0/24\"]", got: func(l Limits) any { return l.Network.Allow },
			want: []string{"nas.local", "192.168.1.0/24"}},
		{name: "network deny", file: "[network]\ndeny = [\"*:25\"]", got: func(l Limits) any { return l.Network.Deny }, want: []string{"*:25"}},
		{name: "network dotted", file: `network.deny = ["evil.example"]`, got: func(l Limits) any { return l.Network.Deny }, want: []string{"evil.example"}, key: "network.deny"},
		{name: "executors allow", file: "[executors]\nallow = [\"list_folder\"]", got: func(l Limits) any { return l.Executors.Allow }, want: []string{"list_folder"}},
		{name: "executors deny", file: "[executors]\ndeny = [\"delete_files\"]", got: func(l Limits) any { return l.Executors.Deny }, want: []string{"delete_files"}},
		{name: "priority", file: "[priority]\ncpu = \"background\"\nio = \"best-effort-low\"\ncpu_time_s = 600",
			got: func(l Limits) any { return l.Priority }, want: Priority{CPU: "background", IO: "best-effort-low", CPUTimeS: 600}},
		{name: "concurrency", file: "[priority]\nconcurrency = 1", got: func(l Limits) any { return l.Concurrency() }, want: 1},
		{name: "comments and blank lines", file: "# mine\n\nmode = \"readonly\" # for now\n", got: func(l Limits) any { return l.InForce() }, want: ModeReadonly},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, err := ParseLimits([]byte(tt.file), "/c/limits.toml", home)
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.got(l); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
			if tt.key != "" {
				if s := l.Source(tt.key); s != FromFile {
					t.Errorf("%s from %s, want file", tt.key, s)
				}
				if w := l.Where(tt.key); !strings.HasPrefix(w, "/c/limits.toml:1:") {
					t.Errorf("%s is set at %q, want row 1", tt.key, w)
				}
			}
		})
	}
}

// TestLimitsRefused: what the file may not say, each refused with the
// file's name, the row and column, and what the key takes.
func TestLimitsRefused(t *testing.T) {
	home := "/home/ada"
	if runtime.GOOS == "windows" {
		t.Skip("the paths are Unix paths")
	}
	for _, tt := range []struct {
		name, file string
		want       string
	}{
		{name: "bad mode", file: "\nmode = \"fulll\"", want: `limits.toml:2:8: mode = "fulll" is not a mode: write "full", "supervised", "readonly" or "preview"`},
		{name: "mode of the wrong type", file: "mode = 1", want: `limits.toml:1:8: mode takes a string: "full", "supervised", "readonly" or "preview"`},
		{name: "unknown key", file: "never = []\nmoed = \"full\"", want: `limits.toml:2:1: unknown key "moed" (the limits file takes mode, never, [network], [executors] and [priority])`},
		{name: "unknown key in a table", file: "[network]\nalow = []", want: `limits.toml:2:1: unknown key "network.alow" (the limits file takes allow and deny in [network])`},
		{name: "unknown table", file: "[netwrok]\nallow = []", want: `limits.toml:1:2: unknown table [netwrok]`},
		{name: "never not a list", file: `never = "~/Private"`, want: `limits.toml:1:9: never takes a list of paths`},
		{name: "never relative", file: `never = ["Private"]`, want: `limits.toml:1:9: never: "Private" is not an absolute path`},
		{name: "never the home", file: `never = ["~"]`, want: `would hide your whole home folder`},
		{name: "never the root", file: `never = ["/"]`, want: `would hide the whole file system`},
		{name: "never above the home", file: `never = ["/home"]`, want: `would hide your whole home folder`},
		{name: "list of numbers", file: "[executors]\ndeny = [1]", want: `limits.toml:2:9: executors.deny takes a list of executor names`},
		{name: "empty name", file: "[executors]\nallow = [\"\"]", want: `limits.toml:2:9: [executors] allow: "" is not an executor name`},
		{name: "bad cpu", file: "[priority]\ncpu = \"fast\"", want: `limits.toml:2:7: [priority] cpu = "fast" is not one it takes: write "background", "low" or "normal"`},
		{name: "bad io", file: "[priority]\nio = \"fast\"", want: `[priority] io = "fast" is not one it takes: write "idle", "low" (or "best-effort-low") or "normal"`},
		{name: "no concurrency", file: "[priority]\nconcurrency = 0", want: `limits.toml:2:15: [priority] concurrency = 0: it takes a whole number of invocations run at once, from 1`},
		{name: "concurrency too high", file: "[priority]\nconcurrency = 1000", want: `[priority] concurrency = 1000: it takes`},
		{name: "negative cpu time", file: "[priority]\ncpu_time_s = -1", want: `limits.toml:2:14: [priority] cpu_time_s = -1: it takes a whole number of seconds`},
		{name: "cpu time not a number", file: "[priority]\ncpu_time_s = \"600\"", want: `limits.toml:2:14: priority.cpu_time_s takes a whole number of seconds`},
		{name: "not TOML", file: "mode = ", want: `limits.toml:1:7: expected value`},
		{name: "twice", file: "mode = \"full\"\nmode = \"readonly\"", want: `limits.toml:2:1: key mode is already defined`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseLimits([]byte(tt.file), "/c/limits.toml", home)
			var le *LimitsError
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.As(err, &le) {
				t.Fatalf("err = %v, want a *LimitsError saying %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), "/c/limits.toml") {
				t.Errorf("err = %v: it does not name the file", err)
			}
		})
	}
}

// TestLimitsEnvOverrides: METNOS_NET_ALLOW and METNOS_NET_DENY, when
// set, override the file's [network] lists, and say so.
func TestLimitsEnvOverrides(t *testing.T) {
	dir := t.TempDir()
	path := writeLimits(t, dir, "[network]\nallow = [\"nas.local\"]\ndeny = [\"evil.example\"]\n")
	env, err := FromEnv("linux", envOf(map[string]string{"METNOS_NET_ALLOW": "a.example, b.example"}))
	if err != nil {
		t.Fatal(err)
	}
	l, err := LoadLimits(path, dir, env)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(l.Network.Allow, []string{"a.example", "b.example"}) || !reflect.DeepEqual(l.Network.Deny, []string{"evil.example"}) {
		t.Errorf("network = %+v", l.Network)
	}
	for _, s := range l.Settings() {
		switch s.Key {
		case "network.allow":
			if s.Source != FromEnvironment || s.Var != "METNOS_NET_ALLOW" {
				t.Errorf("network.allow: %+v, want from METNOS_NET_ALLOW", s)
			}
		case "network.deny":
			if s.Source != FromFile || !strings.HasPrefix(s.At, path+":3:") {
				t.Errorf("network.deny: %+v, want from the file, row 3", s)
			}
		}
	}
	// Without a file the variables still count.
	l, err = LoadLimits(filepath.Join(dir, "none.toml"), dir, env)
	if err != nil || l.Source("network.allow") != FromEnvironment || len(l.Network.Allow) != 2 {
		t.Errorf("without a file: %+v, %v", l, err)
	}
}

// TestLimitsPrivate: a file another user could have written is refused
// with what to run: a file or folder the group or others can write, or
// one that belongs to another user.
func TestLimitsPrivate(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has no mode bits: the check is not made")
	}
	for _, tt := range []struct {
		name       string
		file, dir  os.FileMode
		chownOther bool
		want       string
	}{
		{name: "private", file: 0o600, dir: 0o700},
		{name: "readable by all", file: 0o644, dir: 0o755},
		{name: "group-writable file", file: 0o664, dir: 0o700, want: "other users can write it (mode 0664): run chmod go-w "},
		{name: "world-writable file", file: 0o646, dir: 0o700, want: "(mode 0646): run chmod go-w "},
		{name: "group-writable folder", file: 0o600, dir: 0o770, want: "other users can write its folder "},
		{name: "another user's file", file: 0o600, dir: 0o700, chownOther: true, want: "belongs to uid 4242, not to this user"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.chownOther && os.Getuid() != 0 {
				t.Skip("giving a file to another user needs root")
			}
			dir := filepath.Join(t.TempDir(), "metnos")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := writeLimits(t, dir, "mode = \"readonly\"\n")
			if err := os.Chmod(path, tt.file); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tt.dir); err != nil {
				t.Fatal(err)
			}
			if tt.chownOther {
				if err := os.Chown(path, 4242, 4242); err != nil {
					t.Fatal(err)
				}
			}
			l, err := LoadLimits(path, t.TempDir(), Config{})
			if tt.want == "" {
				if err != nil || l.InForce() != ModeReadonly || !l.Present {
					t.Fatalf("LoadLimits = %+v, %v, want mode readonly", l, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v, want one naming %s and saying %q", err, path, tt.want)
			}
			if l.InForce() != ModeFull {
				t.Errorf("a refused file still gives mode %s", l.InForce())
			}
		})
	}
}

// TestDiffLimits: the changes from one file to the next, old and new
// values written as TOML writes them.
func TestDiffLimits(t *testing.T) {
	old, err := ParseLimits([]byte("mode = \"full\"\nnever = [\"~/a\"]\n"), "l", "/h")
	if err != nil {
		t.Fatal(err)
	}
	new, err := ParseLimits([]byte("mode = \"readonly\"\nnever = [\"~/a\", \"/srv/b\"]\n[executors]\ndeny = [\"x\"]\n"), "l", "/h")
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{
		{Key: "mode", Old: `"full"`, New: `"readonly"`},
		{Key: "never", Old: `["~/a"]`, New: `["~/a", "/srv/b"]`},
		{Key: "executors.deny", Old: `[]`, New: `["x"]`},
	}
	if got := DiffLimits(old, new); !reflect.DeepEqual(got, want) {
		t.Errorf("DiffLimits =\n%+v\nwant\n%+v", got, want)
	}
	if got := DiffLimits(new, new); len(got) != 0 {
		t.Errorf("DiffLimits of the same = %+v", got)
	}
}

// TestRefuseExecutor: deny wins, an empty allow list allows all.
func TestRefuseExecutor(t *testing.T) {
	for _, tt := range []struct {
		allow, deny []string
		name, want  string
	}{
		{name: "x"},
		{deny: []string{"x"}, name: "x", want: `[executors] deny lists "x"`},
		{allow: []string{"x"}, deny: []string{"x"}, name: "x", want: `[executors] deny lists "x"`},
		{allow: []string{"y"}, name: "x", want: `[executors] allow does not list "x"`},
		{allow: []string{"x"}, deny: []string{"y"}, name: "x"},
	} {
		l := Limits{File: "/c/limits.toml", Executors: Lists{Allow: tt.allow, Deny: tt.deny}}
		if got := l.RefuseExecutor(tt.name); got != tt.want {
			t.Errorf("allow %q deny %q: RefuseExecutor(%q) = %q, want %q", tt.allow, tt.deny, tt.name, got, tt.want)
		}
	}
	err := Limits{File: "/c/limits.toml"}.Refused(`mode = "readonly" refuses executors that write`)
	if want := `refused by the owner's limits (/c/limits.toml): mode = "readonly" refuses executors that write`; err.Error() != want {
		t.Errorf("Refused = %q, want %q", err, want)
	}
}

// TestEditor: VISUAL, else EDITOR.
func TestEditor(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{want: ""},
		{env: map[string]string{"EDITOR": "nano"}, want: "nano"},
		{env: map[string]string{"EDITOR": "nano", "VISUAL": "code --wait"}, want: "code --wait"},
	} {
		c, err := FromEnv("linux", envOf(tt.env))
		if err != nil || c.Editor != tt.want {
			t.Errorf("%v: Editor = %q, %v, want %q", tt.env, c.Editor, err, tt.want)
		}
	}
}

func writeLimits(t *testing.T, dir, s string) string {
	t.Helper()
	p := filepath.Join(dir, "limits.toml")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConcurrency: [priority] concurrency says how many invocations
// run at once, 4 when nothing says, and METNOS_CONCURRENCY overrides
// the file.
func TestConcurrency(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.toml")
	if l, err := LoadLimits(path, dir, Config{}); err != nil || l.Concurrency() != DefaultConcurrency || l.Source("priority.concurrency") != FromDefault {
		t.Fatalf("no file: %d from %s (err %v), want %d by default", l.Concurrency(), l.Source("priority.concurrency"), err, DefaultConcurrency)
	}
	if err := os.WriteFile(path, []byte("[priority]\nconcurrency = 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := LoadLimits(path, dir, Config{})
	if err != nil || l.Concurrency() != 2 || l.Source("priority.concurrency") != FromFile {
		t.Fatalf("file: %d from %s (err %v), want 2 from the file", l.Concurrency(), l.Source("priority.concurrency"), err)
	}
	env, err := FromEnv("linux", func(k string) string {
		if k == "METNOS_CONCURRENCY" {
			return "1"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err = LoadLimits(path, dir, env)
	if err != nil || l.Concurrency() != 1 || l.Source("priority.concurrency") != FromEnvironment {
		t.Fatalf("METNOS_CONCURRENCY=1: %d from %s (err %v), want 1 from the environment", l.Concurrency(), l.Source("priority.concurrency"), err)
	}
	for _, bad := range []string{"0", "-1", "x", "65"} {
		if _, err := FromEnv("linux", func(k string) string {
			if k == "METNOS_CONCURRENCY" {
				return bad
			}
			return ""
		}); err == nil || !strings.Contains(err.Error(), "METNOS_CONCURRENCY") {
			t.Errorf("METNOS_CONCURRENCY=%s: err %v, want it refused", bad, err)
		}
	}
}
