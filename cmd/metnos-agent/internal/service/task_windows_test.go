package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/testkit/winetest"
)

// These tests register, query, run and delete the agent's logon task with
// the real schtasks.exe: under Wine in CI (.ci/wine), where they skip
// what Wine's schtasks lacks, naming it; on Windows only when
// METNOS_TEST_REAL_TASKS=1, since they replace and delete the tasks
// MetnosAgent and MetnosClient (test/windows/accept.ps1 is the check for
// a Windows owner).

// taskAction is the first argument with which the test binary, started
// by the task's action, writes its process id to the file named by the
// second and exits: the action the tests register.
const taskAction = "metnos-test-task-action"

func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == taskAction {
		if err := os.WriteFile(os.Args[2], []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// taskRunner runs the supervisor's tools for real and logs each command
// line with what it printed. Where Wine's schtasks has no /Query
// (emulateQuery), it answers /Query from Wine's task store as Windows'
// "schtasks /Query /FO CSV /NH" would, so that Install and Uninstall go
// on to the verbs Wine does have (/Create, /Delete).
type taskRunner struct {
	t            *testing.T // the test or subtest now running
	emulateQuery bool
}

func (r *taskRunner) Run(ctx context.Context, name string, args ...string) (string, error) {
	r.t.Helper()
	if r.emulateQuery && strings.EqualFold(name, "schtasks") && len(args) >= 3 && strings.EqualFold(args[0], "/Query") {
		out, err := storeQuery(args[2])
		r.t.Logf("%s, answered from Wine's task store: %q, %v", cmdline(name, args), out, err)
		return out, err
	}
	out, err := ExecRunner{}.Run(ctx, name, args...)
	r.t.Logf("%s: %q, %v", cmdline(name, args), strings.TrimSpace(out), err)
	return out, err
}

// Write logs what the Manager says, a line at a time.
func (r *taskRunner) Write(b []byte) (int, error) {
	r.t.Helper()
	r.t.Logf("says: %s", strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// storeFile is where Wine's Task Scheduler keeps the task name it
// registered: one XML file a task, in %SystemRoot%\system32\tasks.
func storeFile(name string) string {
	return filepath.Join(os.Getenv("SystemRoot"), "system32", "tasks", name)
}

// storeQuery answers "schtasks /Query /TN name /FO CSV /NH" from Wine's
// task store.
func storeQuery(name string) (string, error) {
	b, err := os.ReadFile(storeFile(name))
	if errors.Is(err, fs.ErrNotExist) {
		return "ERROR: The system cannot find the file specified.\r\n", fmt.Errorf("schtasks /Query /TN %s: exit status 1", name)
	}
	if err != nil {
		return "", err
	}
	state := "Ready"
	if bytes.Contains(b, []byte("<Enabled>false</Enabled>")) {
		state = "Disabled"
	}
	return fmt.Sprintf("\"\\%s\",\"N/A\",\"%s\"\r\n", name, state), nil
}

// noSuchTask names a task no test registers.
const noSuchTask = "metnos-test-no-such-task"

// wineLacks reports, under Wine, whether its schtasks lacks verb, and
// what showed it: for a task that does not exist, Windows' schtasks fails
// saying so, while Wine's does nothing for a verb it does not implement
// and exits 0 printing nothing (its note "Unsupported command" goes to
// Wine's debug output, which the test cannot read). "" when schtasks has
// verb, and not under Wine.
func wineLacks(t *testing.T, verb string) string {
	t.Helper()
	if !winetest.UnderWine() {
		return ""
	}
	args := []string{verb, "/TN", noSuchTask}
	out, err := exec.Command("schtasks", args...).CombinedOutput()
	t.Logf("under Wine, %s: %q, %v", cmdline("schtasks", args), strings.TrimSpace(string(out)), err)
	if err == nil && strings.TrimSpace(string(out)) == "" {
		return cmdline("schtasks", args) + " exits 0 printing nothing"
	}
	return ""
}

// taskTest is a Manager for a Windows user's logon task, driving the real
// schtasks, with the agent's data in a temporary folder.
type taskTest struct {
	s        *Manager
	r        *taskRunner
	c        Config
	queryGap string // what Wine says of /Query ("": it has it)
}

func newTaskTest(t *testing.T) *taskTest {
	t.Helper()
	if !winetest.UnderWine() && os.Getenv("METNOS_TEST_REAL_TASKS") != "1" {
		t.Skip("registers, then deletes, the tasks MetnosAgent and MetnosClient of this user: set METNOS_TEST_REAL_TASKS=1 to run it on a Windows where neither is wanted (test/windows/accept.ps1 checks install on Windows)")
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	home := winetest.TempDir(t)
	data := filepath.Join(home, "metnos")
	r := &taskRunner{t: t}
	tt := &taskTest{
		s: &Manager{
			GOOS: "windows", Home: home, Dir: data, User: u.Username,
			DataDir: data, CacheDir: filepath.Join(home, "cache", "metnos"),
			Runner: r, Out: r,
		},
		r: r,
		c: Config{Exe: exe, Args: []string{taskAction, filepath.Join(data, "ran")}, DataDir: data, User: u.Username},
	}
	tt.queryGap = wineLacks(t, "/Query")
	r.emulateQuery = tt.queryGap != ""
	for _, name := range []string{taskName, rustTaskName} {
		if _, ok := tt.registered(name); ok {
			t.Fatalf("a task %s is registered here already: this test would replace and delete it", name)
		}
	}
	t.Cleanup(func() {
		r.t = t
		for _, name := range []string{taskName, rustTaskName} {
			if _, ok := tt.registered(name); ok {
				r.Run(context.Background(), "schtasks", "/Delete", "/TN", name, "/F")
			}
		}
	})
	return tt
}

// registered returns the task name's definition as Task Scheduler keeps
// it, and whether it is registered: "schtasks /Query /TN name /XML", or
// where Wine's schtasks has no /Query, Wine's stored copy.
func (tt *taskTest) registered(name string) (string, bool) {
	if tt.queryGap != "" {
		b, err := os.ReadFile(storeFile(name))
		return string(b), err == nil
	}
	out, err := exec.Command("schtasks", "/Query", "/TN", name, "/XML").CombinedOutput()
	return string(out), err == nil
}

// TestWindowsTask installs the agent's logon task from the rendered XML
// with the real schtasks, checks that Task Scheduler holds it under the
// agent's name and that Status sees it, that it runs, and that Uninstall
// leaves neither the task nor the copy of its XML (and keeps the data).
func TestWindowsTask(t *testing.T) {
	tt := newTaskTest(t)
	s, ctx := tt.s, context.Background()
	if !t.Run("install", func(t *testing.T) {
		tt.r.t = t
		if err := s.Install(ctx, tt.c); err != nil {
			t.Fatal(err)
		}
		want, _ := taskXML(tt.c)
		if b, err := os.ReadFile(s.file()); err != nil || !bytes.Equal(b, utf16LE(want)) {
			t.Errorf("the copy of the task's XML at %s is not the UTF-16 of taskXML (%v)", s.file(), err)
		}
		def, ok := tt.registered(taskName)
		if !ok {
			t.Fatalf("after install no task %s is registered", taskName)
		}
		for _, w := range []string{`<URI>\` + taskName + `</URI>`, "<Description>Metnos device agent</Description>"} {
			if !strings.Contains(def, w) {
				t.Errorf("the task registered holds no %s:\n%s", w, def)
			}
		}
		// Wine's Task Scheduler keeps no action (its copy holds <Exec/>).
		if tt.queryGap == "" && !strings.Contains(def, "<Command>"+xmlText(tt.c.Exe)+"</Command>") {
			t.Errorf("the task registered does not run %s:\n%s", tt.c.Exe, def)
		}
	}) {
		return
	}
	t.Run("status", func(t *testing.T) {
		tt.r.t = t
		if tt.queryGap != "" {
			t.Skipf("Wine's schtasks has no /Query (%s), so Status cannot see the task here; test/windows/accept.ps1 checks status on Windows", tt.queryGap)
		}
		st, err := s.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Supervisor != "Task Scheduler" || !st.Installed || !st.Enabled || st.File != s.file() || st.RustClient != "" {
			t.Errorf("status after install = %+v, want the task installed and enabled, and no Rust client", st)
		}
	})
	t.Run("run", func(t *testing.T) {
		tt.r.t = t
		if gap := wineLacks(t, "/Run"); gap != "" {
			t.Skipf("Wine's schtasks has no /Run (%s), and Wine's Task Scheduler keeps no action of a task (its copy holds an empty <Exec/>): the task cannot run here; test/windows/accept.ps1 checks on Windows that it runs and is restarted", gap)
		}
		// Install ran it: its action writes its process id to "ran".
		ran := filepath.Join(tt.c.DataDir, "ran")
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
			if b, err := os.ReadFile(ran); err == nil && len(b) > 0 {
				t.Logf("the task's action ran as process %s", b)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("a minute after install the task's action has not run (no %s)", ran)
			}
		}
	})
	t.Run("uninstall", func(t *testing.T) {
		tt.r.t = t
		if err := s.Uninstall(ctx, UninstallOptions{}); err != nil {
			t.Fatal(err)
		}
		if def, ok := tt.registered(taskName); ok {
			t.Errorf("after uninstall the task %s is still registered:\n%s", taskName, def)
		}
		if _, err := os.Lstat(s.file()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after uninstall the copy of the task's XML is still at %s (%v)", s.file(), err)
		}
		if _, err := os.Stat(s.DataDir); err != nil {
			t.Errorf("uninstall without --purge removed the data folder: %v", err)
		}
		if tt.queryGap != "" {
			return
		}
		if st, err := s.Status(ctx); err != nil || st.Installed || st.Enabled {
			t.Errorf("status after uninstall = %+v, %v; want nothing installed", st, err)
		}
	})
}

// TestWindowsTaskTakeover: with the Rust client's task MetnosClient
// registered first, Install disables it (keeping it) and registers the
// agent's, and Status shows the Rust client's task disabled; where its
// task cannot be disabled, Install stops before registering the agent's,
// so that one agent serves the device.
func TestWindowsTaskTakeover(t *testing.T) {
	tt := newTaskTest(t)
	s, ctx := tt.s, context.Background()
	// The Rust client's task, standing in: cmd.exe /c exit 0 at logon.
	rc := tt.c
	rc.Exe = filepath.Join(os.Getenv("SystemRoot"), "System32", "cmd.exe")
	rc.Args = []string{"/d", "/c", "exit", "0"}
	x, err := taskXML(rc)
	if err != nil {
		t.Fatal(err)
	}
	x = bytes.Replace(x, []byte(`<URI>\`+taskName+`</URI>`), []byte(`<URI>\`+rustTaskName+`</URI>`), 1)
	rustXML := filepath.Join(s.Home, rustTaskName+".xml")
	if err := os.WriteFile(rustXML, utf16LE(x), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tt.r.Run(ctx, "schtasks", "/Create", "/TN", rustTaskName, "/XML", rustXML, "/F"); err != nil {
		t.Fatal(err)
	}
	if _, ok := tt.registered(rustTaskName); !ok {
		t.Fatalf("the Rust client's task %s is not registered after schtasks /Create", rustTaskName)
	}
	err = s.Install(ctx, tt.c)
	if _, ok := tt.registered(rustTaskName); !ok {
		t.Errorf("install removed the Rust client's task %s; it must only disable it", rustTaskName)
	}
	if winetest.UnderWine() && err != nil && strings.Contains(err.Error(), "/Change /TN "+rustTaskName+" /DISABLE") {
		if !strings.Contains(err.Error(), "disabling the Rust client's task") {
			t.Errorf("install's error does not say what failed: %v", err)
		}
		if _, ok := tt.registered(taskName); ok {
			t.Errorf("install registered the agent's task although the Rust client's could not be disabled")
		}
		t.Skipf("Wine's schtasks /Change has no /DISABLE (it knows /TN, /ENABLE, which changes nothing, and /TR): %v; install stopped before registering the agent's task, as it should; test/windows/accept.ps1 checks the takeover on Windows", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if tt.queryGap != "" {
		t.Skipf("Wine's schtasks has no /Query (%s), so Status cannot see the tasks here; test/windows/accept.ps1 checks the takeover on Windows", tt.queryGap)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.RustClient != "task "+rustTaskName || st.RustEnabled || !st.Installed || !st.Enabled {
		t.Errorf("status after the takeover = %+v, want the Rust client's task there but disabled, and the agent's installed and enabled", st)
	}
	if err := s.Uninstall(ctx, UninstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := tt.registered(rustTaskName); !ok {
		t.Errorf("uninstall removed the Rust client's task %s; it leaves it as it is", rustTaskName)
	}
}
