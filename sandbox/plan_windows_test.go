package sandbox

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unicode/utf16"

	"golang.org/x/sys/windows"

	"github.com/metnos/agent/testkit/winetest"
)

func TestWindowsJobExtendedLimits(t *testing.T) {
	info := jobLimits{memory: 64 << 20, processes: 8}.extendedLimits()
	b := info.BasicLimitInformation
	const want = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | windows.JOB_OBJECT_LIMIT_PROCESS_MEMORY | windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS
	if b.LimitFlags&want != want || b.LimitFlags&(windows.JOB_OBJECT_LIMIT_BREAKAWAY_OK|windows.JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK) != 0 {
		t.Errorf("limit flags %#x", b.LimitFlags)
	}
	if b.ActiveProcessLimit != 8 || info.ProcessMemoryLimit != 64<<20 {
		t.Errorf("limits %d processes, %d bytes", b.ActiveProcessLimit, info.ProcessMemoryLimit)
	}
}

func TestWindowsEnvBlock(t *testing.T) {
	b, err := envBlock(nil)
	if err != nil || !slices.Equal(b, []uint16{0, 0}) {
		t.Errorf("empty env: %v %v", b, err)
	}
	b, err = envBlock([]string{"A=1", "=C:=C:\\", "Ü=ß"})
	want := utf16.Encode([]rune("A=1\x00=C:=C:\\\x00Ü=ß\x00\x00"))
	if err != nil || !slices.Equal(b, want) {
		t.Errorf("env block %v %v, want %v", b, err, want)
	}
	for _, bad := range []string{"NOEQUALS", "A=1\x00B=2"} {
		if _, err := envBlock([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestWindowsWithEnv(t *testing.T) {
	got := withEnv([]string{"temp=a", "PATH=p", "Temp=b"}, "TEMP", `C:\s`)
	if want := []string{"PATH=p", `TEMP=C:\s`}; !slices.Equal(got, want) {
		t.Errorf("withEnv: %q, want %q", got, want)
	}
	if v, ok := envValue([]string{"Path=x"}, "PATH"); !ok || v != "x" {
		t.Errorf("envValue: %q %v", v, ok)
	}
}

func TestWindowsLookPath(t *testing.T) {
	files := map[string]bool{
		`C:\bin\tool.exe`:   true,
		`C:\bin\script.cmd`: true,
		`D:\py\python.exe`:  true,
		`C:\abs\prog.exe`:   true,
	}
	isFile := func(p string) bool { return files[p] }
	env := []string{`Path=relative;"C:\bin";D:\py`}
	for _, tc := range []struct{ name, want string }{
		{"tool", `C:\bin\tool.exe`},
		{"tool.exe", `C:\bin\tool.exe`},
		{"python", `D:\py\python.exe`},
		{"script", `C:\bin\script.cmd`},
		{`C:\abs\prog`, `C:\abs\prog.exe`},
		{`C:\abs\prog.exe`, `C:\abs\prog.exe`},
		{"missing", ""},
		{`C:\abs\missing`, ""},
	} {
		got, err := lookPath(tc.name, env, isFile)
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("lookPath(%q) = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	// PATHEXT narrows what counts as executable.
	if got, err := lookPath("script", append(env, "PATHEXT=.EXE"), isFile); err == nil {
		t.Errorf("script found without .CMD in PATHEXT: %q", got)
	}
}

func TestWindowsScratchNames(t *testing.T) {
	dir, err := newScratch()
	if err != nil {
		t.Fatal(err)
	}
	pid, ok := scratchPID(filepath.Base(dir))
	if !ok || pid != os.Getpid() {
		t.Errorf("scratch %s: pid %d %v", dir, pid, ok)
	}
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a", "b", "ro"), []byte("x"), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := removeTree(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", dir, err)
	}
	for _, bad := range []string{"metnos-exec-12-short", "metnos-exec-x-0123456789abcdef0123456789abcdef", "other-1-0123456789abcdef0123456789abcdef"} {
		if _, ok := scratchPID(bad); ok {
			t.Errorf("%q taken for a scratch folder", bad)
		}
	}
}

func TestWindowsStaleScratchRemoved(t *testing.T) {
	// A pid no process has: the highest multiple of 4 Windows hands out
	// is far below this.
	stale := filepath.Join(os.TempDir(), scratchPrefix+"4294967292-0123456789abcdef0123456789abcdef")
	if err := os.MkdirAll(filepath.Join(stale, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = winetest.RemoveTree(stale) })
	staleScratchOnce = sync.Once{}
	removeStaleScratch(slog.New(slog.DiscardHandler))
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("stale scratch %s left: %v", stale, err)
	}
}

func TestWindowsCapBuffer(t *testing.T) {
	c := &capped{limit: 5}
	for _, s := range []string{"ab", "cde", "", "f"} {
		if n, err := c.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if string(c.buf) != "abcde" || !c.dropped {
		t.Errorf("buf %q dropped %v", c.buf, c.dropped)
	}
	c = &capped{limit: 5}
	c.Write([]byte("abcde"))
	c.Write(nil)
	if c.dropped {
		t.Error("dropped with nothing dropped")
	}
}
