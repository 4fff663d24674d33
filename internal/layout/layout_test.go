package layout

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/layout.golden")

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestFor: the data and cache folders, as the Rust client computes them
// (the cases of the pairing test For replaced, with the same answers),
// and the overrides.
func TestFor(t *testing.T) {
	for _, tt := range []struct {
		name       string
		goos, home string
		env        map[string]string
		data       string
		cache      string
		err        string
	}{
		{name: "linux default", goos: "linux", home: "/home/ada",
			data: "/home/ada/.local/share/metnos", cache: "/home/ada/.cache/metnos"},
		{name: "linux xdg", goos: "linux", home: "/home/ada",
			env:  map[string]string{"XDG_DATA_HOME": "/srv/d/", "XDG_CACHE_HOME": "/srv/c"},
			data: "/srv/d/metnos", cache: "/srv/c/metnos"},
		{name: "linux relative xdg is ignored", goos: "linux", home: "/home/ada",
			env:  map[string]string{"XDG_DATA_HOME": "data", "XDG_CACHE_HOME": "~/c"},
			data: "/home/ada/.local/share/metnos", cache: "/home/ada/.cache/metnos"},
		{name: "linux odd home", goos: "linux", home: "/home/Zoë O'Brien %h",
			data: "/home/Zoë O'Brien %h/.local/share/metnos", cache: "/home/Zoë O'Brien %h/.cache/metnos"},
		{name: "linux home with a trailing slash", goos: "linux", home: "/home/ada/",
			data: "/home/ada/.local/share/metnos", cache: "/home/ada/.cache/metnos"},
		{name: "freebsd follows linux", goos: "freebsd", home: "/usr/home/ada",
			data: "/usr/home/ada/.local/share/metnos", cache: "/usr/home/ada/.cache/metnos"},
		{name: "linux no home", goos: "linux", home: "", err: "not an absolute path"},
		{name: "linux relative home", goos: "linux", home: "ada", err: `home folder "ada"`},
		{name: "linux no home, one override", goos: "linux",
			env: map[string]string{"METNOS_DATA_DIR": "/srv/agent"}, err: "METNOS_CACHE_DIR"},
		{name: "linux no home, both overrides", goos: "linux",
			env:  map[string]string{"METNOS_DATA_DIR": "/srv/agent/data", "METNOS_CACHE_DIR": "/srv/agent/cache"},
			data: "/srv/agent/data", cache: "/srv/agent/cache"},
		{name: "linux overrides win over xdg", goos: "linux", home: "/home/ada",
			env:  map[string]string{"XDG_DATA_HOME": "/srv/d", "METNOS_DATA_DIR": "/data//metnos/", "METNOS_CACHE_DIR": "/c/./x/../y"},
			data: "/data/metnos", cache: "/c/y"},
		{name: "linux override with tilde", goos: "linux", home: "/home/ada",
			env:  map[string]string{"METNOS_DATA_DIR": "~/elsewhere", "METNOS_CACHE_DIR": "~"},
			data: "/home/ada/elsewhere", cache: "/home/ada"},
		{name: "linux ~user is not expanded", goos: "linux", home: "/home/ada",
			env: map[string]string{"METNOS_DATA_DIR": "~bob/x"}, err: `METNOS_DATA_DIR="~bob/x" is not an absolute path`},
		{name: "linux relative override", goos: "linux", home: "/home/ada",
			env: map[string]string{"METNOS_CACHE_DIR": "cache"}, err: `METNOS_CACHE_DIR="cache" is not an absolute path`},
		{name: "linux tilde without home", goos: "linux",
			env: map[string]string{"METNOS_DATA_DIR": "~/d", "METNOS_CACHE_DIR": "/c"}, err: "home folder is not known"},
		{name: "darwin", goos: "darwin", home: "/Users/ada",
			env:  map[string]string{"XDG_DATA_HOME": "/ignored"},
			data: "/Users/ada/Library/Application Support/metnos", cache: "/Users/ada/Library/Caches/metnos"},
		{name: "darwin no home", goos: "darwin", err: "not an absolute path"},
		{name: "darwin overrides", goos: "darwin", home: "/Users/ada",
			env:  map[string]string{"METNOS_DATA_DIR": "/Volumes/x/d", "METNOS_CACHE_DIR": "~/Caches/m"},
			data: "/Volumes/x/d", cache: "/Users/ada/Caches/m"},
		{name: "windows", goos: "windows",
			env:  map[string]string{"LOCALAPPDATA": `C:\Users\Ada\AppData\Local`},
			data: `C:\Users\Ada\AppData\Local\metnos`, cache: `C:\Users\Ada\AppData\Local\metnos`},
		{name: "windows trailing separator", goos: "windows",
			env:  map[string]string{"LOCALAPPDATA": `D:\Profiles\Ada\`},
			data: `D:\Profiles\Ada\metnos`, cache: `D:\Profiles\Ada\metnos`},
		{name: "windows unc", goos: "windows",
			env:  map[string]string{"LOCALAPPDATA": `\\srv\home\ada`},
			data: `\\srv\home\ada\metnos`, cache: `\\srv\home\ada\metnos`},
		{name: "windows forward slashes", goos: "windows",
			env:  map[string]string{"LOCALAPPDATA": `C:/Users/Ada/AppData/Local`},
			data: `C:\Users\Ada\AppData\Local\metnos`, cache: `C:\Users\Ada\AppData\Local\metnos`},
		{name: "windows unset", goos: "windows", err: "LOCALAPPDATA"},
		{name: "windows relative", goos: "windows", env: map[string]string{"LOCALAPPDATA": `AppData`}, err: "not an absolute path"},
		{name: "windows unset, both overrides", goos: "windows",
			env:  map[string]string{"METNOS_DATA_DIR": `E:\metnos\data`, "METNOS_CACHE_DIR": `E:\metnos\cache\`},
			data: `E:\metnos\data`, cache: `E:\metnos\cache`},
		{name: "windows override with tilde", goos: "windows", home: `C:\Users\Ada`,
			env:  map[string]string{"LOCALAPPDATA": `C:\Users\Ada\AppData\Local`, "METNOS_DATA_DIR": `~/metnos`},
			data: `C:\Users\Ada\metnos`, cache: `C:\Users\Ada\AppData\Local\metnos`},
		{name: "windows rooted override without a drive", goos: "windows",
			env: map[string]string{"LOCALAPPDATA": `C:\L`, "METNOS_DATA_DIR": `\metnos`}, err: "not an absolute path"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, err := For(tt.goos, envOf(tt.env), tt.home)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.Data != tt.data || l.Cache != tt.cache {
				t.Errorf("got data %q cache %q\nwant data %q cache %q", l.Data, l.Cache, tt.data, tt.cache)
			}
		})
	}
}

// TestAgentDirs: on Linux the list sandbox.HostFromEnv made (the Linux
// places, the XDG variants, METNOS_DATA_DIR) followed by the data and
// cache folders agent.New added; on macOS and Windows the Rust client's
// folders too.
func TestAgentDirs(t *testing.T) {
	linuxHome := []string{"/home/ada/.config/metnos", "/home/ada/.local/share/metnos", "/home/ada/.cache/metnos"}
	for _, tt := range []struct {
		name       string
		goos, home string
		env        map[string]string
		want       []string
	}{
		{name: "linux", goos: "linux", home: "/home/ada", want: linuxHome},
		{name: "linux METNOS_DATA_DIR", goos: "linux", home: "/home/ada",
			env:  map[string]string{"METNOS_DATA_DIR": "~/elsewhere"},
			want: append(slices.Clone(linuxHome), "/home/ada/elsewhere")},
		{name: "linux both overrides", goos: "linux", home: "/home/ada",
			env:  map[string]string{"METNOS_DATA_DIR": "/srv/d", "METNOS_CACHE_DIR": "/srv/c"},
			want: append(slices.Clone(linuxHome), "/srv/d", "/srv/c")},
		{name: "linux xdg", goos: "linux", home: "/home/ada",
			env:  map[string]string{"XDG_CONFIG_HOME": "/x/conf", "XDG_DATA_HOME": "/x/data/", "XDG_CACHE_HOME": "/x/cache"},
			want: append(slices.Clone(linuxHome), "/x/conf/metnos", "/x/data/metnos", "/x/cache/metnos")},
		{name: "linux xdg equal to the defaults", goos: "linux", home: "/home/ada",
			env:  map[string]string{"XDG_DATA_HOME": "/home/ada/.local/share", "XDG_CONFIG_HOME": "rel"},
			want: linuxHome},
		{name: "linux no home", goos: "linux",
			env:  map[string]string{"METNOS_DATA_DIR": "/srv/d", "METNOS_CACHE_DIR": "/srv/c", "XDG_CACHE_HOME": "/x/cache"},
			want: []string{"/x/cache/metnos", "/srv/d", "/srv/c"}},
		{name: "darwin", goos: "darwin", home: "/Users/ada",
			want: []string{"/Users/ada/.config/metnos", "/Users/ada/.local/share/metnos", "/Users/ada/.cache/metnos",
				"/Users/ada/Library/Application Support/metnos", "/Users/ada/Library/Caches/metnos"}},
		{name: "darwin overrides keep the defaults masked", goos: "darwin", home: "/Users/ada",
			env: map[string]string{"METNOS_DATA_DIR": "/d", "METNOS_CACHE_DIR": "/c"},
			want: []string{"/Users/ada/.config/metnos", "/Users/ada/.local/share/metnos", "/Users/ada/.cache/metnos",
				"/Users/ada/Library/Application Support/metnos", "/Users/ada/Library/Caches/metnos", "/d", "/c"}},
		{name: "windows", goos: "windows", home: `C:\Users\Ada`,
			env: map[string]string{"LOCALAPPDATA": `C:\Users\Ada\AppData\Local`, "APPDATA": `C:\Users\Ada\AppData\Roaming`},
			want: []string{`C:\Users\Ada\.config\metnos`, `C:\Users\Ada\.local\share\metnos`, `C:\Users\Ada\.cache\metnos`,
				`C:\Users\Ada\AppData\Local\metnos`, `C:\Users\Ada\AppData\Roaming\metnos`}},
		{name: "windows without home or APPDATA", goos: "windows",
			env:  map[string]string{"LOCALAPPDATA": `C:\L`, "XDG_DATA_HOME": `D:\xdg`},
			want: []string{`D:\xdg\metnos`, `C:\L\metnos`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, err := For(tt.goos, envOf(tt.env), tt.home)
			if err != nil {
				t.Fatal(err)
			}
			if got := l.AgentDirs(); !slices.Equal(got, tt.want) {
				t.Errorf("AgentDirs =\n  %q\nwant\n  %q", got, tt.want)
			}
		})
	}
}

// TestByHand: a Layout built by hand masks its own folders and the
// Linux places under its home, and uses this OS's separator.
func TestByHand(t *testing.T) {
	root := filepath.Join(t.TempDir(), "x")
	l := Layout{Data: filepath.Join(root, "data"), Cache: filepath.Join(root, "cache"), Home: root}
	want := []string{
		filepath.Join(root, ".config", "metnos"), filepath.Join(root, ".local", "share", "metnos"),
		filepath.Join(root, ".cache", "metnos"), l.Data, l.Cache,
	}
	if got := l.AgentDirs(); !slices.Equal(got, want) {
		t.Errorf("AgentDirs = %q, want %q", got, want)
	}
	if got, want := l.SpoolResults(), filepath.Join(root, "data", "spool", "results"); got != want {
		t.Errorf("SpoolResults = %q, want %q", got, want)
	}
	if got := (Layout{Data: l.Data}).AgentDirs(); !slices.Equal(got, []string{l.Data}) {
		t.Errorf("AgentDirs without home = %q", got)
	}
}

// TestCurrentWith: this process's layout makes a relative override
// absolute against the working folder, and finds the home in the $HOME
// (%USERPROFILE%) its getenv gives, not in the process's.
func TestCurrentWith(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", "/not/this/one")
	t.Setenv("USERPROFILE", `C:\not\this\one`)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"METNOS_DATA_DIR": "rel/data", "METNOS_CACHE_DIR": "~/c", "LOCALAPPDATA": filepath.Join(home, "AppData", "Local"),
		"HOME": home, "USERPROFILE": home,
	}
	l, err := CurrentWith(envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(wd, "rel", "data"); l.Data != want {
		t.Errorf("Data = %q, want %q", l.Data, want)
	}
	if want := filepath.Join(home, "c"); l.Cache != want {
		t.Errorf("Cache = %q, want %q", l.Cache, want)
	}
	if l.Home != home {
		t.Errorf("Home = %q, want %q", l.Home, home)
	}
	if runtime.GOOS == "windows" {
		return
	}
	// No $HOME: the user database's home, or, with both overrides, none
	// needed.
	t.Setenv("HOME", "")
	abs := map[string]string{"METNOS_DATA_DIR": "/srv/d", "METNOS_CACHE_DIR": "/srv/c"}
	if _, err := CurrentWith(envOf(abs)); err != nil {
		t.Errorf("with both overrides and no $HOME: %v", err)
	}
	if l, err := CurrentWith(envOf(nil)); err == nil && !filepath.IsAbs(l.Data) {
		t.Errorf("Data = %q without $HOME", l.Data)
	}
}

// TestServiceDir and TestPlaceholderLocks: the folders outside the
// agent's own.
func TestServiceDir(t *testing.T) {
	for _, tt := range []struct {
		goos, home string
		env        map[string]string
		want       string
	}{
		{"linux", "/home/ada", nil, "/home/ada/.config/systemd/user"},
		{"linux", "/home/ada", map[string]string{"XDG_CONFIG_HOME": "/x/c/"}, "/x/c/systemd/user"},
		{"linux", "/home/ada", map[string]string{"XDG_CONFIG_HOME": "c"}, "/home/ada/.config/systemd/user"},
		{"linux", "", map[string]string{"METNOS_DATA_DIR": "/d", "METNOS_CACHE_DIR": "/c"}, ""},
		{"darwin", "/Users/ada", map[string]string{"XDG_CONFIG_HOME": "/x/c"}, "/Users/ada/Library/LaunchAgents"},
		{"windows", `C:\Users\Ada`, map[string]string{"LOCALAPPDATA": `C:\L`}, `C:\L\metnos`},
	} {
		l, err := For(tt.goos, envOf(tt.env), tt.home)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.ServiceDir(); got != tt.want {
			t.Errorf("%s %v: ServiceDir = %q, want %q", tt.goos, tt.env, got, tt.want)
		}
	}
}

func TestPlaceholderLocks(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		uid  int
		want string
	}{
		{nil, 0, "/run/metnos-agent/placeholders"},
		{map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000"}, 0, "/run/metnos-agent/placeholders"},
		{map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000/"}, 1000, "/run/user/1000/metnos-agent/placeholders"},
		{map[string]string{"XDG_RUNTIME_DIR": "run/user/1000"}, 1000, "/tmp/metnos-placeholders-1000"},
		{nil, 1000, "/tmp/metnos-placeholders-1000"},
	} {
		l, err := For("linux", envOf(tt.env), "/home/ada")
		if err != nil {
			t.Fatal(err)
		}
		if got := l.PlaceholderLocks(tt.uid, "/tmp"); got != tt.want {
			t.Errorf("%v uid %d: PlaceholderLocks = %q, want %q", tt.env, tt.uid, got, tt.want)
		}
	}
}

func TestWinClean(t *testing.T) {
	for in, want := range map[string]string{
		`C:\a\b`:        `C:\a\b`,
		`C:\a\b\`:       `C:\a\b`,
		`C:/a//b/./c`:   `C:\a\b\c`,
		`C:\a\..\..\b`:  `C:\b`,
		`C:\`:           `C:\`,
		`\\srv\share\x`: `\\srv\share\x`,
		`//srv/share/`:  `\\srv\share`,
		`\\srv\a\..\b`:  `\\srv\b`,
	} {
		if got := winClean(in); got != want {
			t.Errorf("winClean(%q) = %q, want %q", in, got, want)
		}
	}
}

// goldenCases are the environments testdata/layout.golden lists every
// path of.
var goldenCases = []struct {
	name, goos, home string
	env              map[string]string
}{
	{"linux", "linux", "/home/ada", nil},
	{"linux, XDG variables", "linux", "/home/ada", map[string]string{
		"XDG_CONFIG_HOME": "/xdg/config", "XDG_DATA_HOME": "/xdg/data", "XDG_CACHE_HOME": "/xdg/cache", "XDG_RUNTIME_DIR": "/run/user/1000"}},
	{"linux, overrides", "linux", "/home/ada", map[string]string{
		"METNOS_DATA_DIR": "/srv/metnos/data", "METNOS_CACHE_DIR": "~/metnos-cache"}},
	{"darwin", "darwin", "/Users/ada", nil},
	{"windows", "windows", `C:\Users\Ada`, map[string]string{
		"LOCALAPPDATA": `C:\Users\Ada\AppData\Local`, "APPDATA": `C:\Users\Ada\AppData\Roaming`}},
	{"windows, overrides", "windows", `C:\Users\Ada`, map[string]string{
		"LOCALAPPDATA": `C:\Users\Ada\AppData\Local`, "METNOS_DATA_DIR": `D:\metnos\data`, "METNOS_CACHE_DIR": `D:\metnos\cache`}},
}

// TestGolden lists every path of a Layout, each exported method's, for
// each of goldenCases: a method added without a line here fails.
func TestGolden(t *testing.T) {
	var b bytes.Buffer
	for _, c := range goldenCases {
		l, err := For(c.goos, envOf(c.env), c.home)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var env []string
		for _, k := range slices.Sorted(maps.Keys(c.env)) {
			env = append(env, k+"="+c.env[k])
		}
		fmt.Fprintf(&b, "== %s\n", strings.Join(append([]string{c.name, "home=" + c.home}, env...), " "))
		line := func(name string, v any) {
			switch v := v.(type) {
			case string:
				if v == "" {
					v = "(none)"
				}
				fmt.Fprintf(&b, "%-40s %s\n", name, v)
			case []string:
				for i, s := range v {
					fmt.Fprintf(&b, "%-40s %s\n", fmt.Sprintf("%s[%d]", name, i), s)
				}
			default:
				t.Fatalf("%s returns %T", name, v)
			}
		}
		line("Data", l.Data)
		line("Cache", l.Cache)
		line("Home", l.Home)
		v := reflect.ValueOf(l)
		for i := range v.NumMethod() {
			m, name := v.Method(i), v.Type().Method(i).Name
			switch name {
			case "Executor":
				line(name+`("hello", "0123456789ABCDEF…")`, l.Executor("hello", "0123456789ABCDEF0123456789abcdef"))
			case "RuntimeArchive":
				line(name+`("cpython-3.12.tar.gz")`, l.RuntimeArchive("cpython-3.12.tar.gz"))
			case "PlaceholderLocks":
				line(name+`(0, "/tmp")`, l.PlaceholderLocks(0, "/tmp"))
				line(name+`(1000, "/tmp")`, l.PlaceholderLocks(1000, "/tmp"))
			default:
				if m.Type().NumIn() != 0 {
					t.Fatalf("Layout.%s takes arguments: list it in TestGolden", name)
				}
				line(name, m.Call(nil)[0].Interface())
			}
		}
		b.WriteString("\n")
	}
	path := filepath.Join("testdata", "layout.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./internal/layout -update creates it)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("the paths differ from testdata/layout.golden (go test ./internal/layout -update rewrites it):\n%s", b.Bytes())
	}
}

// TestDirsFollowXDG is pairing's test of DataDir and CacheDir, which
// CurrentWith replaced.
func TestDirsFollowXDG(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("XDG directories are Linux's")
	}
	env := map[string]string{"XDG_DATA_HOME": "/x/data", "XDG_CACHE_HOME": "/x/cache"}
	l, err := CurrentWith(envOf(env))
	if err != nil || l.Data != "/x/data/metnos" {
		t.Errorf("Data = %q, %v", l.Data, err)
	}
	if err != nil || l.Cache != "/x/cache/metnos" {
		t.Errorf("Cache = %q, %v", l.Cache, err)
	}
	env["XDG_DATA_HOME"] = ""
	env["HOME"] = "/home/u"
	if l, _ := CurrentWith(envOf(env)); l.Data != "/home/u/.local/share/metnos" {
		t.Errorf("Data without XDG = %q", l.Data)
	}
}

// TestLimitsHidden: the owner's limits file is in the configuration
// folder, which is one of AgentDirs (the folders every executor's
// sandbox masks) on every operating system and whatever the
// environment moves; the copy the agent keeps of it is in the data
// folder, masked too.
func TestLimitsHidden(t *testing.T) {
	for _, tt := range []struct {
		name       string
		goos, home string
		env        map[string]string
		want       string
	}{
		{name: "linux", goos: "linux", home: "/home/ada", want: "/home/ada/.config/metnos/limits.toml"},
		{name: "linux xdg", goos: "linux", home: "/home/ada", env: map[string]string{"XDG_CONFIG_HOME": "/x/conf"},
			want: "/x/conf/metnos/limits.toml"},
		{name: "linux data moved", goos: "linux", home: "/home/ada", env: map[string]string{"METNOS_DATA_DIR": "/srv/d"},
			want: "/home/ada/.config/metnos/limits.toml"},
		{name: "darwin", goos: "darwin", home: "/Users/ada", want: "/Users/ada/Library/Application Support/metnos/limits.toml"},
		{name: "windows", goos: "windows", home: `C:\Users\Ada`,
			env:  map[string]string{"LOCALAPPDATA": `C:\Users\Ada\AppData\Local`, "APPDATA": `C:\Users\Ada\AppData\Roaming`},
			want: `C:\Users\Ada\AppData\Roaming\metnos\limits.toml`},
		{name: "windows without APPDATA", goos: "windows", env: map[string]string{"LOCALAPPDATA": `C:\L`},
			want: `C:\L\metnos\limits.toml`},
		{name: "no home", goos: "linux", env: map[string]string{"METNOS_DATA_DIR": "/srv/d", "METNOS_CACHE_DIR": "/srv/c"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, err := For(tt.goos, envOf(tt.env), tt.home)
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Limits(); got != tt.want {
				t.Fatalf("Limits = %q, want %q", got, tt.want)
			}
			if tt.want == "" {
				return
			}
			for _, p := range []string{l.ConfigDir(), l.Limits(), l.LimitsSeen()} {
				if !slices.ContainsFunc(l.AgentDirs(), func(d string) bool { return p == d || strings.HasPrefix(p, d+sep(tt.goos)) }) {
					t.Errorf("%s is in none of AgentDirs %q", p, l.AgentDirs())
				}
			}
		})
	}
	l := Layout{Data: "/d", Cache: "/c", Home: "/home/ada"}
	if got, want := l.Limits(), filepath.Join("/home/ada", ".config", "metnos", "limits.toml"); got != want {
		t.Errorf("a Layout by hand: Limits = %q, want %q", got, want)
	}
	if got := (Layout{Data: "/d"}).Limits(); got != "" {
		t.Errorf("a Layout by hand without home: Limits = %q, want none", got)
	}
}

// sep is the path separator on goos.
func sep(goos string) string {
	if goos == "windows" {
		return `\`
	}
	return "/"
}
