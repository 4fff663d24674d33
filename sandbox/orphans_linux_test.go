package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/sandbox/shim"
)

// The helper processes of TestSweepOrphans, run from TestMain:
//
//	<test binary> --orphan-sleeper ...          sleeps
//	<test binary> --orphan-parent exit|stay ARGV0 starts a sleeper in a
//	    user namespace of its own, named ARGV0 with the shim's argument,
//	    prints its pid, then exits or stays.
func orphanHelperMain() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case "--orphan-sleeper":
		time.Sleep(time.Hour)
		os.Exit(0)
	case "--orphan-parent":
		cmd := sleeper(os.Args[3], true)
		if err := cmd.Start(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		if os.Args[2] == "stay" {
			time.Sleep(time.Hour)
		}
		os.Exit(0)
	}
}

// sleeper is a process that looks like a sandbox's bwrap (argv[0]
// argv0, the shim's argument among its arguments), in a user namespace
// of its own when userns is set.
func sleeper(argv0 string, userns bool) *exec.Cmd {
	self, _ := os.Executable()
	cmd := &exec.Cmd{Path: self, Args: []string{argv0, "--orphan-sleeper", shim.Arg}}
	if userns {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:                 syscall.CLONE_NEWUSER,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
			GidMappingsEnableSetgroups: false,
		}
	}
	return cmd
}

// parentOf starts the --orphan-parent helper (named parent0) and
// returns it and its sleeper's pid.
func parentOf(t *testing.T, mode, parent0, sleeper0 string) (*exec.Cmd, int) {
	t.Helper()
	return parentOfIn(t, false, mode, parent0, sleeper0)
}

// parentOfIn is parentOf, the helper itself in a user namespace of its
// own when userns is set (its sleeper's is then a namespace further
// down, as a dry run's inner bwrap's is).
func parentOfIn(t *testing.T, userns bool, mode, parent0, sleeper0 string) (*exec.Cmd, int) {
	t.Helper()
	self, _ := os.Executable()
	p := &exec.Cmd{Path: self, Args: []string{parent0, "--orphan-parent", mode, sleeper0, shim.Arg}}
	if userns {
		p.SysProcAttr = sleeper("", true).SysProcAttr
	}
	out, err := p.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		p.Process.Kill()
		p.Wait()
		if strings.Contains(line, "operation not permitted") || strings.Contains(line, "invalid argument") {
			skipOrFail(t, "this machine does not let this user make a user namespace: "+strings.TrimSpace(line))
		}
		t.Fatalf("the helper printed %q", line)
	}
	t.Cleanup(func() {
		syscall.Kill(pid, syscall.SIGKILL)
		p.Process.Kill()
		p.Wait()
	})
	return p, pid
}

func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
		t.Fatal(why + " (METNOS_REQUIRE_SANDBOX=1 makes this a failure)")
	}
	t.Skip(why)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// newOrphan starts an inner bwrap stand-in whose launcher exits, and
// waits until it is reparented to this process (a subreaper).
func newOrphan(t *testing.T) int {
	t.Helper()
	return newOrphanOf(t, false, "/usr/bin/bwrap")
}

// newOrphanOf is newOrphan of a stand-in named argv0, its launcher in a
// user namespace of its own when userns is set.
func newOrphanOf(t *testing.T, userns bool, argv0 string) int {
	t.Helper()
	p, orphan := parentOfIn(t, userns, "exit", "metnos-agent", argv0)
	p.Wait()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if ppid, _ := procStat(orphan); ppid == os.Getpid() || !alive(orphan) {
			break
		}
	}
	if ppid, _ := procStat(orphan); alive(orphan) && ppid != os.Getpid() {
		t.Fatalf("the orphan %d was not reparented here (parent %d)", orphan, ppid)
	}
	return orphan
}

// TestSweepOrphans: an inner bwrap whose outer process is gone is
// killed; a running sandbox's inner process (its parent a bwrap), an
// outer one (in this user namespace) and a process that merely runs
// the shim's argument under another name are left alone.
func TestSweepOrphans(t *testing.T) {
	if !subreaper() {
		t.Skip("cannot become a child subreaper")
	}
	// The orphan: its launcher exits, and it comes to this process.
	orphan := newOrphan(t)
	// A running sandbox: the inner process's parent is its bwrap.
	_, inner := parentOf(t, "stay", "/usr/bin/bwrap", "/usr/bin/bwrap")
	// An outer bwrap, in this user namespace.
	outer := sleeper("/usr/bin/bwrap", false)
	if err := outer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { outer.Process.Kill(); outer.Wait() })
	// Not a bwrap, orphaned in its own user namespace.
	q, other := parentOf(t, "exit", "metnos-agent", "/usr/bin/python3")
	q.Wait()

	for _, pid := range []int{inner, outer.Process.Pid, other} {
		if !alive(pid) {
			t.Fatalf("helper %d is not running before the sweep", pid)
		}
	}
	// An agent that another package's tests start at the same time, as
	// the same user, sweeps too, and may kill the orphan first: it is
	// what it should do. Make another one then, a few times.
	for try := 0; !alive(orphan) && try < 5; try++ {
		t.Logf("the orphan %d was swept by another agent of this user before this test's sweep; making another", orphan)
		orphan = newOrphan(t)
	}
	if !alive(orphan) {
		t.Fatalf("the orphan %d is not running before the sweep (swept by other agents five times over?)", orphan)
	}
	// Real leftovers of this user may be killed too: at least one.
	n := SweepOrphans(nil)
	for try := 0; n < 1 && !alive(orphan) && try < 5; try++ {
		// Another agent's sweep was first, again.
		orphan = newOrphan(t)
		n = SweepOrphans(nil)
	}
	if n < 1 {
		t.Errorf("SweepOrphans killed %d processes, want the orphan", n)
	}
	for end := time.Now().Add(10 * time.Second); alive(orphan) && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(orphan) {
		t.Error("the orphaned inner bwrap survives the sweep")
	}
	for name, pid := range map[string]int{"a running sandbox's inner bwrap": inner, "an outer bwrap": outer.Process.Pid, "a non-bwrap process": other} {
		if !alive(pid) {
			t.Errorf("the sweep killed %s (%d)", name, pid)
		}
	}
}

// TestSweepOrphansOfDryRuns: a dry run's bwrap (argv[0]
// shim.LayerBwrap) runs its outer process in the layer stage's user
// namespace, a child of the agent's, with the agent as its parent: the
// sweep leaves it alone (it used to kill it, and every dry run running
// beside another agent's sweep with it). Its inner process, orphaned in
// a namespace further down, is killed as an ordinary run's is.
func TestSweepOrphansOfDryRuns(t *testing.T) {
	if !subreaper() {
		t.Skip("cannot become a child subreaper")
	}
	outer := sleeper(shim.LayerBwrap, true)
	if err := outer.Start(); err != nil {
		skipOrFail(t, "this machine does not let this user make a user namespace: "+err.Error())
	}
	t.Cleanup(func() { outer.Process.Kill(); outer.Wait() })
	orphan := newOrphanOf(t, true, shim.LayerBwrap)
	n := SweepOrphans(nil)
	for try := 0; n < 1 && !alive(orphan) && try < 5; try++ {
		// Another agent of this user swept first: it should.
		orphan = newOrphanOf(t, true, shim.LayerBwrap)
		n = SweepOrphans(nil)
	}
	for end := time.Now().Add(10 * time.Second); alive(orphan) && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(orphan) {
		t.Error("a dry run's orphaned inner bwrap survives the sweep")
	}
	if !alive(outer.Process.Pid) {
		t.Error("the sweep killed a running dry run's outer bwrap")
	}
}
