package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/testkit/golden"
)

// The same awkward names on every OS: spaces, quotes, unicode, systemd's
// specifier %, shell's $, XML's &<>, a backslash.
var (
	unixConfig = Config{
		Exe:     `/home/Zoë O'Brien/100% <fun> & $HOME/bin/metnos-agent`, // no " or \: systemd refuses them there
		Args:    []string{"run", `--server=http://a\b`},
		Env:     []EnvVar{{"METNOS_LOG", "debug"}, {"METNOS_PYTHON", `/opt/py 3/bin/python3 "%i" $x & <y>`}},
		DataDir: `/home/Zoë "Z" O'Brien/.local/share/metnos`,
	}
	plainConfig = Config{
		Exe:     "/home/ada/.local/bin/metnos-agent",
		Args:    []string{"run"},
		DataDir: "/home/ada/.local/share/metnos",
	}
	winConfig = Config{
		Exe:     `C:\Users\Zoë O'Brien\100% <fun> & co\metnos-agent.exe`,
		Args:    []string{"run", `--server=a "b" c\`},
		DataDir: `C:\Users\Zoë O'Brien\AppData\Local\metnos`,
		User:    `ZOË-PC\Zoë O'Brien & co`,
	}
)

func TestGoldenFiles(t *testing.T) {
	for _, tt := range []struct {
		name   string
		render func(Config) ([]byte, error)
		c      Config
	}{
		{"systemd_plain.golden", SystemdUnit, plainConfig},
		{"systemd_tricky.golden", SystemdUnit, unixConfig},
		{"launchd_plain.golden", launchdPlist, plainConfig},
		{"launchd_tricky.golden", launchdPlist, unixConfig},
		{"task_tricky.golden", taskXML, winConfig},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.render(tt.c)
			if err != nil {
				t.Fatal(err)
			}
			golden.Compare(t, filepath.Join("testdata", tt.name), b)
		})
	}
}

func TestRenderRefuses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		render func(Config) ([]byte, error)
		c      Config
		want   string
	}{
		{"relative exe", SystemdUnit, Config{Exe: "bin/metnos-agent"}, "not absolute"},
		{"newline in exe", SystemdUnit, Config{Exe: "/a\nb"}, "control character"},
		{"newline in env", launchdPlist, Config{Exe: "/a", DataDir: "/d", Env: []EnvVar{{"K", "a\nb"}}}, "control character"},
		{"bad env name", SystemdUnit, Config{Exe: "/a", Env: []EnvVar{{"A-B", "1"}}}, "not an environment variable name"},
		{"unix exe on windows", taskXML, Config{Exe: "/a", User: "u"}, "not absolute"},
		{"env on windows", taskXML, Config{Exe: `C:\a.exe`, User: "u", Env: []EnvVar{{"K", "v"}}}, "setx"},
		{"no user on windows", taskXML, Config{Exe: `C:\a.exe`}, "user"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.render(tt.c); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestSystemdQuote(t *testing.T) {
	for _, tt := range []struct{ in, cmd, env string }{
		{"run", `"run"`, `"run"`},
		{`a b`, `"a b"`, `"a b"`},
		{`100%`, `"100%%"`, `"100%%"`},
		{`$HOME`, `"$$HOME"`, `"$HOME"`},
		{`a"b\c`, `"a\"b\\c"`, `"a\"b\\c"`},
		{"é\t", "\"é\\t\"", "\"é\\t\""},
	} {
		if got := systemdQuote(tt.in, true); got != tt.cmd {
			t.Errorf("command line %q: %s, want %s", tt.in, got, tt.cmd)
		}
		if got := systemdQuote(tt.in, false); got != tt.env {
			t.Errorf("setting %q: %s, want %s", tt.in, got, tt.env)
		}
	}
}

func TestWindowsArg(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"run", "run"},
		{"", `""`},
		{"a b", `"a b"`},
		{`a\b`, `a\b`},
		{`a "b"`, `"a \"b\""`},
		{`c:\x y\`, `"c:\x y\\"`},
		{`a\"b`, `"a\\\"b"`},
	} {
		if got := windowsArg(tt.in); got != tt.want {
			t.Errorf("windowsArg(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestUTF16(t *testing.T) {
	b := utf16LE([]byte("a\né😀"))
	if b[0] != 0xFF || b[1] != 0xFE {
		t.Fatalf("no BOM: % x", b[:2])
	}
	u := make([]uint16, (len(b)-2)/2)
	for i := range u {
		u[i] = uint16(b[2+2*i]) | uint16(b[3+2*i])<<8
	}
	if got := string(utf16.Decode(u)); got != "a\r\né😀" {
		t.Errorf("decoded %q", got)
	}
}

// fakeRunner records command lines and answers from a table keyed by
// the command line's prefix; unknown commands succeed with no output.
type fakeRunner struct {
	calls   []string
	answers map[string]fakeAnswer
}

type fakeAnswer struct {
	out string
	err bool
}

func (f *fakeRunner) Run(_ context.Context, name string, args ...string) (string, error) {
	line := cmdline(name, args)
	f.calls = append(f.calls, line)
	for prefix, a := range f.answers {
		if strings.HasPrefix(line, prefix) {
			if a.err {
				return a.out, fmt.Errorf("%s: exit status 1", line)
			}
			return a.out, nil
		}
	}
	return "", nil
}

func newManager(t *testing.T, goos string, answers map[string]fakeAnswer) (*Manager, *fakeRunner, *bytes.Buffer) {
	home := t.TempDir()
	r := &fakeRunner{answers: answers}
	var out bytes.Buffer
	user := "ada"
	if goos == "windows" {
		user = `PC\ada`
	}
	dir := map[string]string{ // where each OS keeps a user's service file
		"linux":   filepath.Join(home, ".config", "systemd", "user"),
		"darwin":  filepath.Join(home, "Library", "LaunchAgents"),
		"windows": filepath.Join(home, "data", "metnos"),
	}[goos]
	return &Manager{
		GOOS: goos, Home: home, Dir: dir, User: user, UID: 501,
		DataDir: filepath.Join(home, "data", "metnos"), CacheDir: filepath.Join(home, "cache", "metnos"),
		LingerDir: filepath.Join(home, "linger"),
		Runner:    r, Out: &out,
	}, r, &out
}

var systemdUp = map[string]fakeAnswer{"systemctl --user is-system-running": {out: "running\n"}}

func TestInstallSystemd(t *testing.T) {
	s, r, out := newManager(t, "linux", systemdUp)
	rust := filepath.Join(s.Dir, rustSystemdUnitName)
	os.MkdirAll(filepath.Dir(rust), 0o755)
	os.WriteFile(rust, []byte("[Service]\n"), 0o644)
	if err := s.Install(context.Background(), plainConfig); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"systemctl --user is-system-running",
		"systemctl --user disable --now metnos-client.service",
		"systemctl --user daemon-reload",
		"systemctl --user enable metnos-agent.service",
		"systemctl --user restart metnos-agent.service",
		"loginctl enable-linger ada",
	}
	if got := strings.Join(r.calls, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("ran:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	b, err := os.ReadFile(s.file())
	if want, _ := SystemdUnit(plainConfig); err != nil || !bytes.Equal(b, want) {
		t.Errorf("unit file: %v\n%s", err, b)
	}
	if !strings.Contains(out.String(), "taking over from the Rust client") {
		t.Errorf("output: %s", out)
	}
}

func TestInstallSystemdLingerRefused(t *testing.T) {
	s, _, out := newManager(t, "linux", map[string]fakeAnswer{
		"systemctl --user is-system-running": {out: "degraded\n", err: true},
		"loginctl enable-linger":             {out: "Access denied", err: true},
	})
	if err := s.Install(context.Background(), plainConfig); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "sudo loginctl enable-linger ada") {
		t.Errorf("output does not say how to enable linger:\n%s", out)
	}
}

func TestInstallSystemdDown(t *testing.T) {
	s, r, out := newManager(t, "linux", map[string]fakeAnswer{
		"systemctl --user is-system-running": {out: "offline\n", err: true},
	})
	err := s.Install(context.Background(), plainConfig)
	if !errors.Is(err, ErrNotEnabled) {
		t.Fatalf("err = %v, want ErrNotEnabled", err)
	}
	if len(r.calls) != 1 {
		t.Errorf("ran more than the probe: %q", r.calls)
	}
	for _, w := range []string{`says "offline"`, "NOT enabled", "systemctl --user enable --now metnos-agent.service"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if !exists(s.file()) {
		t.Error("the unit was not written")
	}
	st, err := s.Status(context.Background())
	if err != nil || !st.Installed || st.Enabled || st.Running {
		t.Errorf("status = %+v, %v", st, err)
	}
}

func TestInstallDryRun(t *testing.T) {
	for _, goos := range []string{"linux", "darwin", "windows"} {
		t.Run(goos, func(t *testing.T) {
			s, r, out := newManager(t, goos, systemdUp)
			s.DryRun = true
			c := plainConfig
			if goos == "windows" {
				c = winConfig
			}
			if err := s.Install(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			if exists(s.file()) {
				t.Error("a dry run wrote the file")
			}
			for _, l := range r.calls {
				if !strings.Contains(l, "is-system-running") && !strings.Contains(l, "/Query") {
					t.Errorf("a dry run ran %s", l)
				}
			}
			if !strings.Contains(out.String(), "would write "+s.file()) || !strings.Contains(out.String(), "would run: ") {
				t.Errorf("output:\n%s", out)
			}
		})
	}
}

func TestLaunchd(t *testing.T) {
	s, r, _ := newManager(t, "darwin", map[string]fakeAnswer{
		"launchctl print": {out: "gui/501/org.metnos.agent = {\n\tstate = running\n}\n"},
	})
	ctx := context.Background()
	if err := s.Install(ctx, plainConfig); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(ctx)
	if err != nil || !st.Installed || !st.Enabled || st.Supervised != "running" {
		t.Errorf("status = %+v, %v", st, err)
	}
	if err := s.Uninstall(ctx, UninstallOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"launchctl bootout gui/501/org.metnos.agent",
		"launchctl enable gui/501/org.metnos.agent",
		"launchctl bootstrap gui/501 " + s.file(),
		"launchctl print gui/501/org.metnos.agent",
		"launchctl bootout gui/501/org.metnos.agent",
	}
	if got := strings.Join(r.calls, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("ran:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	if exists(s.file()) {
		t.Error("uninstall left the plist")
	}
}

func TestTask(t *testing.T) {
	s, r, _ := newManager(t, "windows", map[string]fakeAnswer{
		"schtasks /Query /TN MetnosClient": {out: `"\MetnosClient","N/A","Running"`},
		"schtasks /Query /TN MetnosAgent":  {out: `"\MetnosAgent","N/A","Running"`},
	})
	ctx := context.Background()
	if err := s.Install(ctx, winConfig); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(s.file())
	if want, _ := taskXML(winConfig); !bytes.Equal(b, utf16LE(want)) {
		t.Error("the task XML written is not the UTF-16 of taskXML")
	}
	st, err := s.Status(ctx)
	if err != nil || !st.Installed || !st.Enabled || st.RustClient != "task MetnosClient" || !st.RustEnabled {
		t.Errorf("status = %+v, %v", st, err)
	}
	if err := s.Uninstall(ctx, UninstallOptions{Purge: true}); err == nil || !strings.Contains(err.Error(), "Rust client") {
		t.Errorf("purge with the Rust client installed: %v", err)
	}
	want := []string{
		"schtasks /Query /TN MetnosClient /FO CSV /NH",
		"schtasks /End /TN MetnosClient",
		"schtasks /Change /TN MetnosClient /DISABLE",
		"schtasks /Create /TN MetnosAgent /XML " + s.file() + " /F",
		"schtasks /Run /TN MetnosAgent",
		"schtasks /Query /TN MetnosAgent /FO CSV /NH",
		"schtasks /Query /TN MetnosClient /FO CSV /NH",
		"schtasks /Query /TN MetnosAgent /FO CSV /NH",
		"schtasks /End /TN MetnosAgent",
		"schtasks /Delete /TN MetnosAgent /F",
	}
	if got := strings.Join(r.calls[:len(want)], "\n"); got != strings.Join(want, "\n") {
		t.Errorf("ran:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

// TestTaskExists: only a row of schtasks /Query naming the task shows
// it is there; a query that exits 0 printing nothing (Wine's schtasks,
// which has no /Query) or another task does not.
func TestTaskExists(t *testing.T) {
	for _, tt := range []struct {
		name            string
		answer          fakeAnswer
		exists, enabled bool
	}{
		{"ready", fakeAnswer{out: "\r\n\"\\MetnosAgent\",\"N/A\",\"Ready\"\r\n"}, true, true},
		{"running, other case", fakeAnswer{out: `"\metnosagent","N/A","Running"`}, true, true},
		{"disabled", fakeAnswer{out: `"\MetnosAgent","N/A","Disabled"`}, true, false},
		{"nothing printed", fakeAnswer{}, false, false},
		{"another task", fakeAnswer{out: `"\MetnosAgentOld","N/A","Ready"`}, false, false},
		{"not found", fakeAnswer{out: "ERROR: The system cannot find the file specified.", err: true}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newManager(t, "windows", map[string]fakeAnswer{"schtasks /Query /TN MetnosAgent": tt.answer})
			if exists, enabled := s.taskExists(context.Background(), taskName); exists != tt.exists || enabled != tt.enabled {
				t.Errorf("exists, enabled = %v, %v; want %v, %v", exists, enabled, tt.exists, tt.enabled)
			}
		})
	}
}

func TestUninstallPurge(t *testing.T) {
	s, r, out := newManager(t, "linux", systemdUp)
	ctx := context.Background()
	if err := s.Install(ctx, plainConfig); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(s.DataDir, 0o700)
	os.WriteFile(filepath.Join(s.DataDir, "key"), make([]byte, 32), 0o600)
	os.MkdirAll(s.CacheDir, 0o700)
	if err := s.Uninstall(ctx, UninstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if exists(s.file()) || !exists(filepath.Join(s.DataDir, "key")) {
		t.Fatalf("uninstall: unit left or key removed\n%s", out)
	}
	// An agent still running keeps its data.
	l, err := lockfile.Lock(filepath.Join(s.DataDir, "client.lock"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Uninstall(ctx, UninstallOptions{Purge: true}); err == nil || !strings.Contains(err.Error(), "still holds") {
		t.Errorf("purge under a running agent: %v", err)
	}
	l.Release()
	if err := s.Uninstall(ctx, UninstallOptions{Purge: true}); err != nil {
		t.Fatal(err)
	}
	if exists(s.DataDir) || exists(s.CacheDir) {
		t.Error("purge left the data or cache directory")
	}
	if !strings.Contains(strings.Join(r.calls, "\n"), "systemctl --user disable --now metnos-agent.service") {
		t.Errorf("uninstall did not disable the unit: %q", r.calls)
	}
}

// TestPurgeOnlyTheAgentsFolders: a data or cache folder given by
// METNOS_DATA_DIR or METNOS_CACHE_DIR that is not named metnos (a shared
// cache, a home) is not removed by --purge.
func TestPurgeOnlyTheAgentsFolders(t *testing.T) {
	home, _ := os.UserHomeDir()
	for _, d := range []string{filepath.Join(t.TempDir(), ".cache"), home, "/"} {
		if err := purgeable(d, home); err == nil {
			t.Errorf("%s would be purged", d)
		}
	}
	if err := purgeable(filepath.Join(t.TempDir(), "metnos"), home); err != nil {
		t.Error(err)
	}
}

// TestSystemdExecutableName: systemd undoes %% but not $$ in the
// executable's name, and refuses quotes and backslashes in it.
func TestSystemdExecutableName(t *testing.T) {
	b, err := SystemdUnit(Config{Exe: "/opt/a b/d$x%y", Args: []string{"run"}})
	if err != nil || !strings.Contains(string(b), `ExecStart="/opt/a b/d$x%%y" "run"`) {
		t.Fatalf("%s %v", b, err)
	}
	if _, err := SystemdUnit(Config{Exe: `/opt/a"b/metnos-agent`}); err == nil {
		t.Error("a quote in the executable's name was accepted")
	}
}
