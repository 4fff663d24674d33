//go:build linux

package hostile

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// TestHostProcesses: the command can neither signal, trace nor read
// the memory, environment, files or working directory of a host
// process of the same user.
func TestHostProcesses(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		envTok := token("METNOS-ENV-SECRET")
		var victim *hostProc
		// The victim runs in the home with a secret in its environment
		// and ~/.ssh/id_rsa open on descriptor 3.
		startVictim := func(t *testing.T, fx *fixture) {
			f, err := os.Open(fx.path(fx.Secrets[0].Rel))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd := exec.Command("/bin/sleep", "60")
			cmd.Env = append(fx.env(), "METNOS_HOSTILE_ENV_SECRET="+envTok)
			cmd.Dir = fx.Home
			cmd.ExtraFiles = []*os.File{f}
			victim = startCmd(t, cmd)
			fx.set("PID", strconv.Itoa(victim.pid()))
		}
		stopVictim := func(t *testing.T, fx *fixture) { victim.stop() }
		pols := []readPolicy{{name: "supervised", policy: supervised(nil, []string{"{{WORK}}"})}}
		// system:read processes: the host's PID namespace (sysread_test.go).
		pols = append(pols, readPolicy{name: "host-pids", policy: hostPIDs(supervised(nil, []string{"{{WORK}}"}))})
		if m.bwrap {
			// The one profile that shares the host's PID namespace.
			pols = append(pols, readPolicy{name: "full-fs-no-net", policy: profileOnly(policy.ProfileFullFSNoNet)})
		}
		killed := func(t *testing.T, fx *fixture, r result) []string {
			if !victim.alive() {
				return []string{fmt.Sprintf("host process %d was killed from inside", victim.pid())}
			}
			return nil
		}
		tampered := func(t *testing.T, fx *fixture, r result) []string {
			var ev []string
			var lim unix.Rlimit
			if err := unix.Prlimit(victim.pid(), unix.RLIMIT_NOFILE, nil, &lim); err == nil && lim.Max == 3 {
				ev = append(ev, fmt.Sprintf("RLIMIT_NOFILE of host process %d set to %d from inside", victim.pid(), lim.Max))
			}
			if prio, err := unix.Getpriority(unix.PRIO_PROCESS, victim.pid()); err == nil && 20-prio == 19 {
				ev = append(ev, fmt.Sprintf("host process %d reniced to 19 from inside", victim.pid()))
			}
			if pol, _, e := unix.Syscall(unix.SYS_SCHED_GETSCHEDULER, uintptr(victim.pid()), 0, 0); e == 0 && pol == 5 {
				ev = append(ev, fmt.Sprintf("host process %d moved to SCHED_IDLE from inside", victim.pid()))
			}
			if prio, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, 1, uintptr(victim.pid()), 0); e == 0 && prio>>13 == 3 {
				ev = append(ev, fmt.Sprintf("host process %d moved to the idle I/O class from inside", victim.pid()))
			}
			var set unix.CPUSet
			if runtime.NumCPU() > 1 && unix.SchedGetaffinity(victim.pid(), &set) == nil && set.Count() == 1 {
				ev = append(ev, fmt.Sprintf("host process %d pinned to one CPU from inside", victim.pid()))
			}
			return ev
		}
		for _, c := range []attackCase{
			{name: "kill-host-process", sh: "kill -9 {{PID}}", landed: killed},
			{
				name: "pidfd_send_signal-host-process",
				py: `
fd, e = sc(434, {{PID}}, 0)  # pidfd_open
print("pidfd_open:", fd, ename(e) if fd < 0 else "")
r, e = sc(424, fd, 9, None, 0)  # pidfd_send_signal(SIGKILL)
print("pidfd_send_signal:", r, ename(e) if r < 0 else "")
`,
				landed: killed,
			},
			{
				// Resource limits and priority of a host process of the
				// same user: no signal is involved, so Landlock's signal
				// scope does not apply.
				name: "prlimit-nice-sched-ioprio-affinity-host-process",
				py: `
class rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]
new = rlimit(3, 3)
r, e = sc(302, {{PID}}, 7, ctypes.byref(new), None)  # prlimit64(pid, RLIMIT_NOFILE)
print("prlimit64:", r, ename(e) if r < 0 else "")
r, e = sc(141, 0, {{PID}}, 19)  # setpriority(PRIO_PROCESS, pid, 19)
print("setpriority:", r, ename(e) if r < 0 else "")
param = ctypes.c_int(0)
r, e = sc(144, {{PID}}, 5, ctypes.byref(param))  # sched_setscheduler(pid, SCHED_IDLE)
print("sched_setscheduler:", r, ename(e) if r < 0 else "")
r, e = sc(251, 1, {{PID}}, 3 << 13)  # ioprio_set(IOPRIO_WHO_PROCESS, pid, IDLE)
print("ioprio_set:", r, ename(e) if r < 0 else "")
mask = ctypes.c_ulong(1)
r, e = sc(203, {{PID}}, 8, ctypes.byref(mask))  # sched_setaffinity(pid, CPU 0 only)
print("sched_setaffinity:", r, ename(e) if r < 0 else "")
`,
				landed: tampered,
			},
			{name: "kill-host-process-group", sh: "kill -9 -{{PID}}", landed: killed},
			{
				name: "ptrace-attach-host-process",
				py: `
r, e = sc(101, 16, {{PID}}, 0, 0)  # ptrace(PTRACE_ATTACH)
print("ptrace attach:", r, ename(e) if r < 0 else "")
if r == 0:
    os.waitpid({{PID}}, 0x40000000)  # __WALL
    sc(101, 17, {{PID}}, 0, 0)  # PTRACE_DETACH
sys.exit(0 if r == 0 else 1)
`,
			},
			{
				name: "process_vm_readv-host-process",
				py: `
buf = ctypes.create_string_buffer(16)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
maps = open("/proc/{{PID}}/maps").readline()
addr = int(maps.split("-")[0], 16)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 16)
remote = iovec(addr, 16)
r, e = sc(310, {{PID}}, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
print("process_vm_readv:", r, ename(e) if r < 0 else "")
sys.exit(0 if r == 16 else 1)
`,
			},
			{
				name:    "read-host-process-environ",
				sh:      "tr '\\0' '\\n' < /proc/{{PID}}/environ; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null",
				secrets: []string{envTok},
			},
			{
				name:    "read-secret-through-host-process-fd-cwd-root",
				sh:      "cat /proc/{{PID}}/fd/3; cat /proc/{{PID}}/cwd/.ssh/id_rsa; cat /proc/{{PID}}/root{{HOME}}/.ssh/id_rsa",
				secrets: []string{fx.Secrets[0].Token},
			},
		} {
			for _, rp := range pols {
				c := c
				c.name += "/" + rp.name
				c.policy, c.setup, c.cleanup = rp.policy, startVictim, stopVictim
				attack(t, fx, m, c)
			}
		}

		// A process of the command's own tree cannot be traced either.
		attack(t, fx, m, attackCase{
			name:   "ptrace-attach-sibling-inside",
			policy: pols[0].policy,
			py: `
pid = os.fork()
if pid == 0:
    time.sleep(5)
    os._exit(0)
time.sleep(0.05)
r, e = sc(101, 16, pid, 0, 0)
print("ptrace attach sibling:", r, ename(e) if r < 0 else "")
os.kill(pid, 9)
sys.exit(0 if r == 0 else 1)
`,
		})
	})
}

func startCmd(t *testing.T, cmd *exec.Cmd) *hostProc {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &hostProc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	return p
}

// TestHostEnvironment: no variable of the agent's environment reaches
// the command; only Request.Env does.
func TestHostEnvironment(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		tok := token("METNOS-AGENT-ENV")
		t.Setenv("METNOS_HOSTILE_AGENT_SECRET", tok)
		script := "env; tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/1/environ; tr '\\0' '\\n' < /proc/$PPID/environ; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null; true"
		// Outside, a child that inherits the agent's environment (what
		// a careless runner would do) sees it.
		cmd := exec.Command("/bin/sh", "-c", script)
		outb, err := cmd.Output()
		if err != nil || !strings.Contains(string(outb), tok) {
			t.Fatalf("a host child inheriting the agent's environment does not show %s, so this test proves nothing (err %v)", tok, err)
		}
		r := runInside(t, fx, m, supervised(nil, []string{"{{WORK}}"})(t, fx), shArgv(script), sandbox.Limits{})
		if strings.Contains(r.stdout, tok) {
			t.Errorf("the agent's environment variable METNOS_HOSTILE_AGENT_SECRET is visible inside the sandbox (Request.Env must be the whole environment)\n%s", r)
		}
		for _, want := range []string{"HOME=" + fx.Home, "PATH=/usr/bin:/bin"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("Request.Env entry %q missing inside the sandbox\n%s", want, r)
			}
		}
	})
}

// beatDaemon starts a daemon (its own session, out of the command's
// process group) that appends to ~/work/beat every 50 ms, then either
// sleeps (to be killed at the deadline) or exits at once.
const beatDaemon = `(setsid sh -c 'echo $$ > {{WORK}}/daemon.pid; while :; do date +%s%N >> {{WORK}}/beat; sleep 0.05; done' </dev/null >/dev/null 2>&1 &)
sleep 0.3
`

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return -1
	}
	return fi.Size()
}

// beating reports whether the beat file still grows over 500 ms.
func beating(fx *fixture) (bool, int64, int64) {
	a := fileSize(fx.Work + "/beat")
	time.Sleep(500 * time.Millisecond)
	b := fileSize(fx.Work + "/beat")
	return b != a, a, b
}

func killDaemon(t *testing.T, fx *fixture) {
	b, err := os.ReadFile(fx.Work + "/daemon.pid")
	if err != nil {
		return
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// TestDaemonKilled: a daemonized grandchild dies with the run, both at
// the deadline and when the command exits at once.
func TestDaemonKilled(t *testing.T) {
	requireSandbox(t, false)
	cases := []struct {
		name    string
		tail    string
		timeout time.Duration
	}{
		{"killed-at-deadline", "sleep 100\n", time.Second},
		{"command-exits-at-once", "exit 0\n", 10 * time.Second},
	}
	// Outside, the daemon survives its parent (once for both modes).
	fx := newFixture(t)
	for _, c := range cases {
		fx.reset(t)
		r := runOutside(t, fx, shArgv(fx.expand(beatDaemon+c.tail)), c.timeout)
		grows, a, b := beating(fx)
		killDaemon(t, fx)
		if !grows {
			t.Fatalf("%s: outside the sandbox the daemon did not survive (beat %d -> %d bytes), so this test proves nothing\n%s", c.name, a, b, r)
		}
	}
	forModes(t, func(t *testing.T, m mode) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				fx.reset(t)
				pol := supervised(nil, []string{"{{WORK}}"})(t, fx)
				r := runInside(t, fx, m, pol, shArgv(fx.expand(beatDaemon+c.tail)), sandbox.Limits{Timeout: c.timeout})
				t.Cleanup(func() { killDaemon(t, fx) })
				if c.timeout == time.Second && !r.out.TimedOut {
					t.Errorf("Output.TimedOut is false after the 1s deadline\n%s", r)
				}
				if fileSize(fx.Work+"/beat") <= 0 {
					t.Fatalf("the daemon never ran inside the sandbox, so this test proves nothing\n%s", r)
				}
				time.Sleep(100 * time.Millisecond) // let a kill in flight land
				if grows, a, b := beating(fx); grows {
					t.Errorf("a daemon started inside the sandbox outlived the run: %s/beat grew %d -> %d bytes after Run returned\n%s", fx.Work, a, b, r)
				}
			})
		}
	})
}
