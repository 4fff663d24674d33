package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
)

// prioProbe is what priorityScript prints, for its own process and for
// a child it starts.
type prioProbe struct {
	Nice      int    `json:"nice"`
	Policy    int    `json:"policy"`
	IOPrio    int    `json:"ioprio"`
	Autogroup string `json:"autogroup"`
	CPUSoft   int64  `json:"cpu_soft"`
	CPUHard   int64  `json:"cpu_hard"`
	NiceLimit int64  `json:"nice_limit"`
	// Raised is what came of trying to undo the priority: lowering the
	// nice value, leaving SCHED_IDLE, writing the autogroup.
	Raised []string `json:"raised"`
}

// priorityScript reports its own priority as JSON: nice (field 19 of
// /proc/self/stat), scheduling policy (field 41), I/O priority
// (ioprio_get), autogroup, RLIMIT_CPU and RLIMIT_NICE, and what came of
// trying to raise them again; then the same for a child of its own,
// after a pause long enough for the kernel's autogroup rate limit
// (100 ms) to let a late setting through.
const priorityScript = `
import ctypes, json, os, platform, resource, subprocess, sys, time
NR_IOPRIO_GET = {"x86_64": 252, "aarch64": 31, "i686": 290}.get(platform.machine(), 0)
libc = ctypes.CDLL(None, use_errno=True)
def probe():
    f = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    nsoft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    raised = []
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
        raised.append("nice 0")
    except OSError:
        pass
    if int(f[38]) == os.SCHED_IDLE:
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            raised.append("SCHED_OTHER")
        except OSError:
            pass
    try:
        open("/proc/self/autogroup", "w").write("0")
        raised.append("autogroup 0")
    except OSError:
        pass
    return {"nice": int(f[16]), "policy": int(f[38]), "ioprio": libc.syscall(NR_IOPRIO_GET, 1, 0) if NR_IOPRIO_GET else -1,
            "autogroup": open("/proc/self/autogroup").read().strip(), "cpu_soft": soft, "cpu_hard": hard,
            "nice_limit": nsoft, "raised": raised}
if sys.argv[1:] == ["child"]:
    time.sleep(0.3)
    print(json.dumps(probe()))
else:
    me = probe()
    child = subprocess.run([sys.executable, "-c", "SCRIPT = " + repr(SCRIPT) + "\n" + SCRIPT, "child"], capture_output=True, text=True)
    print(json.dumps({"self": me, "child": json.loads(child.stdout or "null"), "err": child.stderr}))
`

// runPriorityProbe runs priorityScript in the sandbox with priority p
// and returns the run's output and the two probes.
func runPriorityProbe(t *testing.T, p Priority) (Output, prioProbe, prioProbe) {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	// The script passes itself to its child through SCRIPT.
	script := "SCRIPT = " + strconv.Quote(priorityScript) + "\n" + priorityScript
	// A long deadline: at background priority on a busy machine the
	// probe gets only the processor time nothing else wants.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := Run(ctx, Request{
		Argv:    []string{py, "-c", script},
		Policy:  policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}},
		Limits:  Limits{Timeout: 2 * time.Minute},
		Options: Options{Priority: p},
	})
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("run: %v, exit %d %s, stderr %s", err, out.ExitCode, out.Signal, out.Stderr)
	}
	var got struct {
		Self  prioProbe  `json:"self"`
		Child *prioProbe `json:"child"`
		Err   string     `json:"err"`
	}
	if err := json.Unmarshal(out.Stdout, &got); err != nil || got.Child == nil {
		t.Fatalf("the probe printed %q (%v), stderr %q", out.Stdout, err, out.Stderr)
	}
	return out, got.Self, *got.Child
}

// ownPriority is the calling thread's nice value, scheduling policy and
// I/O priority, and this process's autogroup.
func ownPriority(t *testing.T) string {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	pol, _, _ := unix.Syscall(unix.SYS_SCHED_GETSCHEDULER, 0, 0, 0)
	io, _, _ := unix.Syscall(unix.SYS_IOPRIO_GET, 1, 0, 0)
	ag, _ := os.ReadFile("/proc/self/autogroup")
	stat, _ := os.ReadFile("/proc/self/stat")
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return fmt.Sprintf("thread nice %d, process nice %s, policy %d, ioprio %d, autogroup %s", 20-prio, f[16], pol, io, strings.TrimSpace(string(ag)))
}

// TestPriorityAppliedToTree: a run's command and a child it starts have
// the priority asked for (nice, SCHED_IDLE, I/O class, RLIMIT_CPU with
// a hard limit a second above, RLIMIT_NICE 0), cannot raise it again,
// and the run's autogroup and cgroup weights are what the report says;
// the report names nothing that is not in force; the test process keeps
// its own priority throughout.
func TestPriorityAppliedToTree(t *testing.T) {
	before := ownPriority(t)
	cores := runtime.NumCPU()
	for _, tc := range []struct {
		name      string
		p         Priority
		nice      int
		policy    int
		ioprio    int
		cpuSoft   int64
		applied   []string // each must be in the report
		cgroupCPU string   // the run cgroup's CPU setting: a cpu.weight, or "idle"
	}{
		{"default", Priority{}, 10, unix.SCHED_NORMAL, 2<<13 | 7, int64(120 * cores), []string{"nice 10", "io best-effort 7"}, "20"},
		{"background idle", Priority{CPU: CPUBackground, IO: IOIdle, CPUTime: 7 * time.Second}, 19, unix.SCHED_IDLE, 3 << 13, 7, []string{"nice 19", "SCHED_IDLE", "io idle"}, "idle"},
		{"normal", Priority{CPU: CPUNormal, IO: IONormal}, 0, unix.SCHED_NORMAL, 0, int64(120 * cores), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var weights cgroupWeightsSeen
			stop := weights.watch()
			out, self, child := runPriorityProbe(t, tc.p)
			stop()
			r := out.Priority
			t.Logf("report: %s", r)
			t.Logf("command: %+v", self)
			t.Logf("child:   %+v", child)
			t.Logf("cgroup files seen during the run: %v", weights.files())
			if r == nil {
				t.Fatal("no priority report")
			}
			for _, want := range append(tc.applied, fmt.Sprintf("RLIMIT_CPU %d s per process", tc.cpuSoft)) {
				if !slices.Contains(r.Applied, want) {
					t.Errorf("the report does not say %q: %s", want, r)
				}
			}
			if r.CPUTime != time.Duration(tc.cpuSoft)*time.Second {
				t.Errorf("report CPUTime %v, want %d s", r.CPUTime, tc.cpuSoft)
			}
			for who, pr := range map[string]prioProbe{"command": self, "child": child} {
				if pr.Nice != tc.nice || pr.Policy != tc.policy || (pr.IOPrio != tc.ioprio && pr.IOPrio != -1) {
					t.Errorf("%s: nice %d policy %d ioprio %d, want %d %d %d", who, pr.Nice, pr.Policy, pr.IOPrio, tc.nice, tc.policy, tc.ioprio)
				}
				if pr.CPUSoft != tc.cpuSoft || pr.CPUHard != tc.cpuSoft+1 {
					t.Errorf("%s: RLIMIT_CPU %d/%d, want %d/%d", who, pr.CPUSoft, pr.CPUHard, tc.cpuSoft, tc.cpuSoft+1)
				}
				if tc.nice > 0 && pr.NiceLimit != 0 {
					t.Errorf("%s: RLIMIT_NICE %d, want 0", who, pr.NiceLimit)
				}
				if tc.nice > 0 && len(pr.Raised) > 0 {
					t.Errorf("%s raised its own priority again: %v", who, pr.Raised)
				}
			}
			// The autogroup: what the report says, and nothing else.
			agApplied := false
			for _, a := range r.Applied {
				agApplied = agApplied || strings.HasPrefix(a, "autogroup nice")
			}
			wantAG := fmt.Sprintf("nice %d", tc.nice)
			if agApplied && !strings.HasSuffix(child.Autogroup, wantAG) {
				t.Errorf("the report says %v, and the child's autogroup is %q", r.Applied, child.Autogroup)
			}
			if !agApplied && tc.nice > 0 && strings.HasSuffix(self.Autogroup, wantAG) && strings.HasSuffix(child.Autogroup, wantAG) {
				t.Errorf("the autogroup is at %s and the report does not say so: %s", wantAG, r)
			}
			// The cgroup's CPU weight: seen in the run's cgroup when the
			// report names it, and named when it was there.
			cgApplied := ""
			for _, a := range r.Applied {
				if strings.HasPrefix(a, "cgroup") && strings.Contains(a, "cpu.") {
					cgApplied = a
				}
			}
			seen := weights.files()
			f, want := "cpu.weight", tc.cgroupCPU
			switch {
			case tc.cgroupCPU == "idle":
				f, want = "cpu.idle", "1"
			case strings.Contains(cgApplied, "cpu.shares"):
				f, want = "cpu.shares", "204"
			}
			switch {
			case cgApplied != "" && tc.cgroupCPU == "":
				t.Errorf("a normal run's report names a cgroup weight: %s", r)
			case cgApplied != "" && seen[f] != want:
				t.Errorf("the report says %q; the run's cgroup had %s = %q", cgApplied, f, seen[f])
			case cgApplied == "" && tc.cgroupCPU != "" && (seen["cpu.idle"] == "1" || seen["cpu.shares"] == "204" || seen["cpu.weight"] == "20"):
				t.Errorf("the run's cgroup had %v and the report does not say so: %s", seen, r)
			}
			if after := ownPriority(t); after != before {
				t.Errorf("the test process's priority changed: before %s, after %s", before, after)
			}
		})
	}
}

// cgroupWeightsSeen watches, during a run, the cgroups this process
// makes for its runs (metnos-run-<pid>-*) and records the weights of
// those that hold a task.
type cgroupWeightsSeen struct {
	mu   sync.Mutex
	seen map[string]string
}

func (w *cgroupWeightsSeen) watch() (stop func()) {
	w.seen = map[string]string{}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			for _, m := range readCgroupMounts() {
				dirs, _ := filepath.Glob(filepath.Join(m.point, "*", fmt.Sprintf("metnos-run-%d-*", os.Getpid())))
				more, _ := filepath.Glob(filepath.Join(m.point, fmt.Sprintf("metnos-run-%d-*", os.Getpid())))
				for _, d := range append(dirs, more...) {
					procs, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
					if err != nil || len(strings.TrimSpace(string(procs))) == 0 {
						continue
					}
					for _, f := range []string{"cpu.weight", "cpu.shares", "cpu.idle", "io.weight"} {
						if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
							w.mu.Lock()
							w.seen[f] = strings.TrimSpace(string(b))
							w.mu.Unlock()
						}
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (w *cgroupWeightsSeen) files() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.seen)
}

// TestCPUTimeLimitEndsBusyLoop: a busy loop is ended by its CPU-time
// limit before its deadline, and the run says so; one that
// ignores SIGXCPU is killed a second of processor time later (and, a
// SIGKILL being anyone's, is not said to be the limit's).
func TestCPUTimeLimitEndsBusyLoop(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	for _, tc := range []struct {
		name     string
		script   string
		signal   string
		exceeded bool
	}{
		{"busy loop", "while True: pass", "SIGXCPU", true},
		{"ignores SIGXCPU", "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass", "SIGKILL", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			out, err := Run(ctx, Request{
				Argv:   []string{py, "-c", tc.script},
				Policy: policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}},
				Limits: Limits{Timeout: 2 * time.Minute},
				// At normal priority: on a busy machine a low one may
				// take long to use its second of processor time.
				Options: Options{Priority: Priority{CPU: CPUNormal, CPUTime: time.Second}},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("exit %d, signal %s, wall %v, cpu_time_exceeded %v, timed out %v, priority: %s", out.ExitCode, out.Signal, out.Wall.Round(time.Millisecond), out.CPUTimeExceeded, out.TimedOut, out.Priority)
			if out.TimedOut || out.Signal != tc.signal || out.CPUTimeExceeded != tc.exceeded {
				t.Fatalf("signal %q, cpu_time_exceeded %v, timed out %v; want %s, %v, not timed out", out.Signal, out.CPUTimeExceeded, out.TimedOut, tc.signal, tc.exceeded)
			}
			if out.Priority == nil || out.Priority.CPUTime != time.Second {
				t.Errorf("the report's CPU time: %+v", out.Priority)
			}
		})
	}
}

// TestAutogroupRateLimited: where the run's session is its own
// autogroup (the kernel's autogroups on, no cgroup holding the run's
// CPU share), runs started together still all get their autogroup's
// nice value, before the command starts or, when the kernel's rate limit
// (ten a second without CAP_SYS_ADMIN) refused the shim, from the agent
// (bwrap) or the supervising shim (no bwrap) as soon as it allows; the
// report says which, and the command sees it.
func TestAutogroupRateLimited(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"bwrap", Options{}},
		{"supervised, no bwrap", Options{Bwrap: "/nonexistent/bwrap"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 4
			outs := make([]Output, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					outs[i], errs[i] = Run(ctx, Request{
						Argv:    []string{"/bin/sh", "-c", "sleep 1; cat /proc/self/autogroup"},
						Policy:  policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}},
						Limits:  Limits{Timeout: 30 * time.Second},
						Options: tc.o,
					})
				})
			}
			wg.Wait()
			late := 0
			for i, out := range outs {
				if errs[i] != nil || out.ExitCode != 0 {
					t.Fatalf("run %d: %v, exit %d, stderr %s", i, errs[i], out.ExitCode, out.Stderr)
				}
				t.Logf("run %d (%s): %s; the command saw %s", i, out.Sandbox, out.Priority, strings.TrimSpace(string(out.Stdout)))
				var ag string
				for _, a := range out.Priority.Applied {
					if strings.HasPrefix(a, "autogroup nice 10") {
						ag = a
					}
				}
				if ag == "" {
					if !strings.Contains(out.Priority.String(), "autogroup") {
						t.Skipf("no autogroup here for the runs (%s): their CPU share is held otherwise, or the kernel has no autogroups", out.Priority)
					}
					t.Errorf("run %d: autogroup not applied: %s", i, out.Priority)
					continue
				}
				if strings.Contains(ag, "after the start") {
					late++
				}
				if !strings.HasSuffix(strings.TrimSpace(string(out.Stdout)), "nice 10") {
					t.Errorf("run %d: the report says %q and the command saw %q", i, ag, out.Stdout)
				}
			}
			t.Logf("%d of %d runs had their autogroup set after the start", late, n)
		})
	}
}
