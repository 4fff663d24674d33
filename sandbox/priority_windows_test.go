package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/windows"
)

// prioHelperEnv, set in a process of this test binary, makes it print
// its priority class (and, with the value "tree", a child's) instead of
// running tests.
const prioHelperEnv = "METNOS_WINPRIO_HELPER"

func init() {
	mode := os.Getenv(prioHelperEnv)
	if mode == "" {
		return
	}
	c, err := windows.GetPriorityClass(windows.CurrentProcess())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	fmt.Printf("%#x", c)
	if mode == "tree" {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), prioHelperEnv+"=self")
		out, err := cmd.Output()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(4)
		}
		fmt.Printf(" %s", out)
	}
	os.Exit(0)
}

// TestWindowsJobPriorityLimits: the job's share of each priority: its
// priority class, its user time (100 ns units, for the whole job), and
// its weight-based CPU rate control; normal sets none of them.
func TestWindowsJobPriorityLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		p      Priority
		class  uint32
		weight uint32
		time   int64
	}{
		{"default", Priority{}, windows.BELOW_NORMAL_PRIORITY_CLASS, 3, 120 * 10_000_000},
		{"background", Priority{CPU: CPUBackground, CPUTime: 5 * time.Second}, windows.IDLE_PRIORITY_CLASS, 1, 5 * 10_000_000},
		{"normal", Priority{CPU: CPUNormal, IO: IONormal}, 0, 0, 120 * 10_000_000},
	} {
		jl := jobLimits{memory: 64 << 20, processes: 8}.withPriority(priorityPlan(tc.p, time.Minute, 2))
		b := jl.extendedLimits().BasicLimitInformation
		if (b.LimitFlags&windows.JOB_OBJECT_LIMIT_PRIORITY_CLASS != 0) != (tc.class != 0) || b.PriorityClass != tc.class {
			t.Errorf("%s: flags %#x, priority class %#x, want %#x", tc.name, b.LimitFlags, b.PriorityClass, tc.class)
		}
		if b.LimitFlags&windows.JOB_OBJECT_LIMIT_JOB_TIME == 0 || b.PerJobUserTimeLimit != tc.time {
			t.Errorf("%s: flags %#x, job user time %d, want %d", tc.name, b.LimitFlags, b.PerJobUserTimeLimit, tc.time)
		}
		if b.ActiveProcessLimit != 8 || b.LimitFlags&windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE == 0 {
			t.Errorf("%s: the other limits changed: flags %#x, %d processes", tc.name, b.LimitFlags, b.ActiveProcessLimit)
		}
		rate, ok := jl.cpuRate()
		if ok != (tc.weight != 0) || rate.Weight != tc.weight || (ok && rate.ControlFlags != jobCPURateEnable|jobCPURateWeightBased) {
			t.Errorf("%s: CPU rate %+v %v, want weight %d", tc.name, rate, ok, tc.weight)
		}
	}
}

// TestWindowsRunPriorityClass: a run's process and a child it starts
// have the priority class of the run's priority (the job's, or where
// the job's does not take, as under Wine, the process's own, which the
// child inherits), the report says which, and names nothing Wine does
// not keep; this test process keeps its own class.
func TestWindowsRunPriorityClass(t *testing.T) {
	own, err := windows.GetPriorityClass(windows.CurrentProcess())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    Priority
		want string
	}{
		{"default", Priority{}, "0x4000 0x4000"},
		{"background", Priority{CPU: CPUBackground, IO: IOIdle}, "0x40 0x40"},
		{"normal", Priority{CPU: CPUNormal, IO: IONormal}, "0x20 0x20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			env := []string{prioHelperEnv + "=tree"}
			for _, k := range []string{"SystemRoot", "PATH"} {
				if v, ok := os.LookupEnv(k); ok {
					env = append(env, k+"="+v)
				}
			}
			req := Request{Argv: []string{self}, Env: env, Limits: Limits{Timeout: 20 * time.Second}, Options: Options{jobOnly: true, Priority: tc.p}}
			out := mustRun(t, req)
			t.Logf("classes %q, priority: %s", out.Stdout, out.Priority)
			want := tc.want
			if onWine() {
				// Wine keeps no job class, and gives a child the normal
				// class whatever its parent's: the report says so.
				want = tc.want[:strings.IndexByte(tc.want, ' ')] + " 0x20"
				if tc.p.CPU != CPUNormal && !strings.Contains(out.Priority.String(), "for the command's process only") {
					t.Errorf("under Wine the report claims more than the command's process: %s", out.Priority)
				}
			}
			if out.ExitCode != 0 || string(out.Stdout) != want {
				t.Fatalf("exit %d, classes %q (stderr %q), want %q", out.ExitCode, out.Stdout, out.Stderr, want)
			}
			r := out.Priority
			if r == nil {
				t.Fatal("no priority report")
			}
			hasClass := slices.ContainsFunc(r.Applied, func(a string) bool { return strings.HasPrefix(a, "priority class ") })
			if hasClass != (tc.p.CPU != CPUNormal) {
				t.Errorf("report %s: a priority class %v, want %v", r, hasClass, tc.p.CPU != CPUNormal)
			}
			if onWine() && slices.ContainsFunc(r.Applied, func(a string) bool { return strings.HasPrefix(a, "job ") }) {
				t.Errorf("under Wine the report names a job setting Wine does not keep: %s", r)
			}
		})
	}
	if now, _ := windows.GetPriorityClass(windows.CurrentProcess()); now != own {
		t.Errorf("this process's priority class went from %#x to %#x", own, now)
	}
}
