package sandbox

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParsePriority: the owner's words, their defaults, and every other
// word refused with what is accepted.
func TestParsePriority(t *testing.T) {
	for _, tc := range []struct {
		cpu, io string
		cpuTime int64
		want    Priority
		err     string
	}{
		{"", "", 0, Priority{CPU: CPULow, IO: IOLow}, ""},
		{"low", "low", 0, Priority{CPU: CPULow, IO: IOLow}, ""},
		{"background", "idle", 30, Priority{CPU: CPUBackground, IO: IOIdle, CPUTime: 30 * time.Second}, ""},
		{"normal", "normal", 0, Priority{CPU: CPUNormal, IO: IONormal}, ""},
		{"normal", "", 0, Priority{CPU: CPUNormal, IO: IOLow}, ""},
		{"", "idle", 0, Priority{CPU: CPULow, IO: IOIdle}, ""},
		{"background", "best-effort-low", 600, Priority{CPU: CPUBackground, IO: IOLow, CPUTime: 600 * time.Second}, ""},
		{"high", "", 0, Priority{}, `cpu priority "high": want "background", "low" or "normal"`},
		{"Low", "", 0, Priority{}, `cpu priority "Low"`},
		{"", "realtime", 0, Priority{}, `io priority "realtime": want "idle", "low" or "normal"`},
		{"", "", -1, Priority{}, "cpu_time_s -1"},
	} {
		got, err := ParsePriority(tc.cpu, tc.io, tc.cpuTime)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParsePriority(%q, %q, %d): error %v, want %q", tc.cpu, tc.io, tc.cpuTime, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParsePriority(%q, %q, %d) = %+v, %v; want %+v", tc.cpu, tc.io, tc.cpuTime, got, err, tc.want)
		}
	}
	if DefaultPriority() != (Priority{CPU: CPULow, IO: IOLow}) {
		t.Errorf("DefaultPriority() = %+v", DefaultPriority())
	}
	if s := (Priority{}).String(); s != "cpu low, io low" {
		t.Errorf("the zero Priority reads %q, want the default", s)
	}
}

// TestPriorityPlan: what each priority means on each system, from one
// pure plan: Linux's nice, SCHED_IDLE, I/O class and cgroup weights,
// Windows' priority class and CPU weight, macOS's nice and taskpolicy,
// and the CPU-time limit (the deadline times the processors unless
// set, whole seconds).
func TestPriorityPlan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       Priority
		timeout time.Duration
		cores   int
		want    prioPlan
	}{
		{"zero is low/low", Priority{}, 60 * time.Second, 2, prioPlan{
			nice: 10, ioClass: 2, ioLevel: 7, cpuWeight: 20, ioWeight: 20, cpuShares: 204, cpuTime: 120 * time.Second,
			winClass: winBelowNormalClass, winWeight: 3,
			darwin: [][]string{{"/usr/bin/nice", "-n", "10"}, {"/usr/sbin/taskpolicy", "-d", "utility"}}}},
		{"background idle", Priority{CPU: CPUBackground, IO: IOIdle}, 10 * time.Second, 4, prioPlan{
			nice: 19, schedIdle: true, ioClass: 3, cpuWeight: 1, ioWeight: 1, cpuShares: 2, cpuIdle: true, cpuTime: 40 * time.Second,
			winClass: winIdleClass, winWeight: 1,
			darwin: [][]string{{"/usr/sbin/taskpolicy", "-b", "-d", "throttle"}}}},
		{"normal changes nothing but the backstop", Priority{CPU: CPUNormal, IO: IONormal}, 1500 * time.Millisecond, 1, prioPlan{
			cpuWeight: 100, ioWeight: 100, cpuShares: 1024, cpuTime: 2 * time.Second}},
		{"cpu time set, rounded up", Priority{CPU: CPUNormal, IO: IOLow, CPUTime: 2500 * time.Millisecond}, time.Hour, 8, prioPlan{
			ioClass: 2, ioLevel: 7, cpuWeight: 100, ioWeight: 20, cpuShares: 1024, cpuTime: 3 * time.Second,
			darwin: [][]string{{"/usr/sbin/taskpolicy", "-d", "utility"}}}},
		{"unknown words are the default", Priority{CPU: "turbo", IO: "fast"}, time.Second, 0, prioPlan{
			nice: 10, ioClass: 2, ioLevel: 7, cpuWeight: 20, ioWeight: 20, cpuShares: 204, cpuTime: time.Second,
			winClass: winBelowNormalClass, winWeight: 3,
			darwin: [][]string{{"/usr/bin/nice", "-n", "10"}, {"/usr/sbin/taskpolicy", "-d", "utility"}}}},
	} {
		got := priorityPlan(tc.p, tc.timeout, tc.cores)
		tc.want.p = tc.p.normalized()
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
	if v := priorityPlan(Priority{}, time.Second, 1).ioprio(); v != 2<<13|7 {
		t.Errorf("ioprio of low: %d", v)
	}
	if v := priorityPlan(Priority{IO: IOIdle}, time.Second, 1).ioprio(); v != 3<<13 {
		t.Errorf("ioprio of idle: %d", v)
	}
	if v := priorityPlan(Priority{IO: IONormal}, time.Second, 1).ioprio(); v != 0 {
		t.Errorf("ioprio of normal: %d", v)
	}
}

// TestPriorityReportString: what applied, then what did not; nothing
// said for a run with no report.
func TestPriorityReportString(t *testing.T) {
	var none *PriorityReport
	if none.String() != "" {
		t.Errorf("nil report: %q", none.String())
	}
	r := &PriorityReport{}
	if r.String() != "nothing" {
		t.Errorf("empty report: %q", r.String())
	}
	r.applied("nice %d", 10)
	r.applied("io best-effort 7")
	r.missing("cgroup io weight: %s", "none here")
	if got, want := r.String(), "nice 10, io best-effort 7; not applied: cgroup io weight: none here"; got != want {
		t.Errorf("report %q, want %q", got, want)
	}
}

// TestDarwinPriorityArgv: on macOS the command runs through nice and
// taskpolicy, each executing the next, so that it starts at its
// priority; a program the Mac lacks is left out and reported missing,
// never claimed.
func TestDarwinPriorityArgv(t *testing.T) {
	cmd := []string{"/usr/bin/sandbox-exec", "-p", "(version 1)", "--", "/usr/bin/python3", "x.py"}
	all := func(string) bool { return true }
	for _, tc := range []struct {
		name    string
		p       Priority
		exists  func(string) bool
		prefix  []string
		applied []string
		missing int
	}{
		{"default", Priority{}, all, []string{"/usr/bin/nice", "-n", "10", "/usr/sbin/taskpolicy", "-d", "utility"}, []string{"nice 10", "disk I/O policy utility"}, 0},
		{"background idle", Priority{CPU: CPUBackground, IO: IOIdle}, all, []string{"/usr/sbin/taskpolicy", "-b", "-d", "throttle"}, []string{"darwin background (PRIO_DARWIN_BG)", "disk I/O policy throttle"}, 0},
		{"normal", Priority{CPU: CPUNormal, IO: IONormal}, all, nil, nil, 0},
		{"no taskpolicy", Priority{}, func(p string) bool { return p != "/usr/sbin/taskpolicy" }, []string{"/usr/bin/nice", "-n", "10"}, []string{"nice 10"}, 1},
	} {
		argv, r := priorityPlan(tc.p, time.Minute, 8).darwinArgv(cmd, tc.exists)
		if want := append(append([]string(nil), tc.prefix...), cmd...); !slices.Equal(argv, want) {
			t.Errorf("%s: argv %q, want %q", tc.name, argv, want)
		}
		if !slices.Equal(r.Applied, tc.applied) || len(r.Missing) != tc.missing {
			t.Errorf("%s: report %s, want applied %q and %d missing", tc.name, r, tc.applied, tc.missing)
		}
	}
}
