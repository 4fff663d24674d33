//go:build linux

package hostile

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// The sandbox side of system:read processes/health (Policy.HostPIDs):
// the run shares the host's PID namespace, so a process list is the
// host's, and nothing else of those processes is within reach.

// victimArgv is the command line of the host process the probes look
// for, as get_processes would be asked about it.
var victimArgv = []string{"/bin/sleep", "1234.5"}

// hostPIDs is pf with the host's PID namespace shared, as
// system:read processes derives it.
func hostPIDs(pf policyFunc) policyFunc {
	return func(t *testing.T, fx *fixture) policy.Policy {
		p := pf(t, fx)
		p.HostPIDs = true
		return p
	}
}

// startSleeper starts victimArgv on the host with a secret in its
// environment and stores its pid as the fixture's {{PID}}.
func startSleeper(t *testing.T, fx *fixture, envTok string) *hostProc {
	t.Helper()
	cmd := exec.Command(victimArgv[0], victimArgv[1:]...)
	cmd.Env = append(fx.env(), "METNOS_HOSTILE_ENV_SECRET="+envTok)
	cmd.Dir = fx.Home
	p := startCmd(t, cmd)
	fx.set("PID", strconv.Itoa(p.pid()))
	return p
}

// listsProcess reports whether ps output (pid, args) has the process pid
// with victimArgv as its command line.
func listsProcess(out string, pid int) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == strconv.Itoa(pid) && strings.Join(f[1:], " ") == strings.Join(victimArgv, " ") {
			return true
		}
	}
	return false
}

// TestHostPIDsProcessList: with HostPIDs, ps inside the sandbox lists a
// process the test started on the host, found by its command line, and
// the run says it shares the host's PID namespace; without it (bwrap's
// own PID namespace), the same ps does not see the process.
func TestHostPIDsProcessList(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		victim := startSleeper(t, fx, token("METNOS-ENV-SECRET"))
		probe := shArgv("ps -eo pid,args --no-headers")

		out := runOutside(t, fx, probe, 0)
		if !listsProcess(out.stdout, victim.pid()) {
			t.Fatalf("ps outside the sandbox does not list %d %q, so this test proves nothing\n%s", victim.pid(), victimArgv, out)
		}

		base := supervised(nil, []string{"{{WORK}}"})
		r := runInside(t, fx, m, hostPIDs(base)(t, fx), probe, sandbox.Limits{})
		if !listsProcess(r.stdout, victim.pid()) {
			t.Errorf("with HostPIDs, ps inside the sandbox does not list the host process %d %q\n%s", victim.pid(), victimArgv, r)
		}
		if n := strings.Count(r.stdout, "\n"); n < 5 {
			t.Errorf("with HostPIDs, ps inside the sandbox lists %d processes; the host runs more\n%s", n, r)
		}
		if !strings.Contains(r.out.Reason, "shares the host's PID namespace") {
			t.Errorf("a run in the host's PID namespace gave the reason %q, which does not say so", r.out.Reason)
		}

		r = runInside(t, fx, m, base(t, fx), probe, sandbox.Limits{})
		if strings.Contains(r.out.Reason, "PID namespace") {
			t.Errorf("a run without HostPIDs speaks of the PID namespace: %q", r.out.Reason)
		}
		switch {
		case m.bwrap && listsProcess(r.stdout, victim.pid()):
			t.Errorf("without HostPIDs, ps inside bwrap lists the host process %d: the run is not in a PID namespace of its own\n%s", victim.pid(), r)
		case !m.bwrap:
			t.Logf("without bwrap there is no PID namespace to have: the list is the host's either way")
		}
	})
}

// TestHostPIDsAttacks: with HostPIDs, the command that can list a host
// process of the same user still cannot read its environment or memory,
// stop, kill or trace it. Each attack works outside the sandbox.
func TestHostPIDsAttacks(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		envTok := token("METNOS-ENV-SECRET")
		var victim *hostProc
		setup := func(t *testing.T, fx *fixture) { victim = startSleeper(t, fx, envTok) }
		cleanup := func(t *testing.T, fx *fixture) { victim.stop() }
		// The probe first finds the process by its command line, as
		// get_processes does, and attacks what it found: an attack
		// that did not find it would prove nothing.
		find := `
import subprocess
ps = subprocess.run(["ps", "-eo", "pid,args", "--no-headers"], capture_output=True, text=True).stdout
found = [int(l.split()[0]) for l in ps.splitlines() if l.split()[1:] == ["` + strings.Join(victimArgv, `", "`) + `"]]
if {{PID}} not in found:
    print("METNOS-PROBE-NOT-FOUND: ps does not list {{PID}}", flush=True)
    sys.exit(3)
P = {{PID}}
print("found", P, flush=True)
`
		gone := func(t *testing.T, fx *fixture, r result) []string {
			if !victim.alive() {
				return []string{fmt.Sprintf("host process %d was killed from inside", victim.pid())}
			}
			return nil
		}
		stopped := func(t *testing.T, fx *fixture, r result) []string {
			if !victim.alive() {
				return []string{fmt.Sprintf("host process %d was killed from inside", victim.pid())}
			}
			if state := procState(victim.pid()); state == "T" || state == "t" {
				return []string{fmt.Sprintf("host process %d was stopped from inside (state %s)", victim.pid(), state)}
			}
			return nil
		}
		pol := hostPIDs(supervised(nil, []string{"{{WORK}}"}))
		for _, c := range []attackCase{
			{
				name:    "read-environ-of-listed-process",
				py:      find + `print(open("/proc/%d/environ" % P, "rb").read().replace(b"\0", b"\n").decode())`,
				secrets: []string{envTok},
			},
			{
				name: "read-memory-of-listed-process",
				py: find + `
try:
    addr = int(open("/proc/%d/maps" % P).readline().split("-")[0], 16)
except OSError as e:
    print("maps:", e)
    addr = 0x400000
f = open("/proc/%d/mem" % P, "rb", buffering=0)
f.seek(addr)
b = f.read(16)
print("mem: read", len(b), "bytes at", hex(addr))
sys.exit(0 if len(b) == 16 else 1)
`,
			},
			{
				name:   "sigstop-listed-process",
				py:     find + `os.kill(P, 19); print("SIGSTOP sent")`,
				landed: stopped,
			},
			{
				name:   "kill-listed-process",
				py:     find + `os.kill(P, 9); print("SIGKILL sent")`,
				landed: gone,
			},
			{
				name: "pidfd-kill-listed-process",
				py: find + `
fd, e = sc(434, P, 0)  # pidfd_open
print("pidfd_open:", fd, ename(e) if fd < 0 else "")
r, e = sc(424, fd, 9, None, 0)  # pidfd_send_signal(SIGKILL)
print("pidfd_send_signal:", r, ename(e) if r < 0 else "")
`,
				landed: gone,
			},
			{
				name: "ptrace-attach-listed-process",
				py: find + `
r, e = sc(101, 16, P, 0, 0)  # ptrace(PTRACE_ATTACH)
print("ptrace attach:", r, ename(e) if r < 0 else "")
if r == 0:
    os.waitpid(P, 0x40000000)  # __WALL
    sc(101, 17, P, 0, 0)  # PTRACE_DETACH
sys.exit(0 if r == 0 else 1)
`,
			},
		} {
			c.policy, c.setup, c.cleanup = pol, setup, cleanup
			c.landed = afterFinding(c.landed, c.landed == nil && len(c.secrets) == 0)
			attack(t, fx, m, c)
		}
		// As root every root process is a kill away too, PID 1 above
		// all; and the host's /proc, which bwrap binds without a PID
		// namespace, has sysctls root may write by their mode bits alone
		// (the probe writes back the value it read).
		if isRoot() {
			attack(t, fx, m, attackCase{
				name:   "signal-pid-1",
				policy: pol,
				py:     `os.kill(1, 0); print("signal 0 to pid 1 allowed")`,
			})
			attack(t, fx, m, attackCase{
				name:   "write-host-sysctl",
				policy: pol,
				py: `
p = "/proc/sys/kernel/printk_ratelimit"
v = open(p).read()
with open(p, "w") as f:
    f.write(v)
print("wrote", p, v.strip())
`,
			})
		}
	})
}

// afterFinding wraps an attack's evidence: a probe that did not find its
// target in the process list says so and exits 3, which is no evidence
// of an attack but fails the test (the list must be the host's). Then
// landed's evidence, or, with byExit, the script's exit 0 (it exits 0
// only when the attack succeeded).
func afterFinding(landed func(*testing.T, *fixture, result) []string, byExit bool) func(*testing.T, *fixture, result) []string {
	return func(t *testing.T, fx *fixture, r result) []string {
		if strings.Contains(r.stdout, "METNOS-PROBE-NOT-FOUND") || !strings.Contains(r.stdout, "found ") {
			t.Errorf("%s: the probe did not find the host process in the process list, so the attack was not tried:\n%s", r.where, r)
		}
		var ev []string
		if landed != nil {
			ev = landed(t, fx, r)
		}
		if byExit && r.exit == 0 {
			ev = append(ev, "the attack script exited 0")
		}
		return ev
	}
}

// procState is the state letter of /proc/<pid>/stat ("" when gone).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// TestHostPIDsDaemonKilled: without a PID namespace to die with bwrap, a
// daemonized grandchild of a HostPIDs run still dies with the run, at
// the deadline and when the command exits at once (the supervising
// shim). TestDaemonKilled shows that such a daemon survives outside.
func TestHostPIDsDaemonKilled(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		for _, c := range []struct {
			name    string
			tail    string
			timeout time.Duration
		}{
			{"killed-at-deadline", "sleep 100\n", time.Second},
			{"command-exits-at-once", "exit 0\n", 10 * time.Second},
		} {
			t.Run(c.name, func(t *testing.T) {
				fx.reset(t)
				pol := hostPIDs(supervised(nil, []string{"{{WORK}}"}))(t, fx)
				r := runInside(t, fx, m, pol, shArgv(fx.expand(beatDaemon+c.tail)), sandbox.Limits{Timeout: c.timeout})
				t.Cleanup(func() { killDaemon(t, fx) })
				if fileSize(fx.Work+"/beat") <= 0 {
					t.Fatalf("the daemon never ran inside the sandbox, so this test proves nothing\n%s", r)
				}
				time.Sleep(100 * time.Millisecond) // let a kill in flight land
				if grows, a, b := beating(fx); grows {
					t.Errorf("a daemon started inside a HostPIDs run outlived it: %s/beat grew %d -> %d bytes after Run returned\n%s", fx.Work, a, b, r)
				}
			})
		}
	})
}
