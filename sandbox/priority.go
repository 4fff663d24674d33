package sandbox

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// CPUPriority is how a run's processes compete for the processors with
// the owner's programs.
type CPUPriority string

const (
	// CPULow, the default, runs every process of the run below the
	// owner's programs: nice 10 (a tenth of a normal program's share of
	// a busy processor, never nothing), with the run's scheduling group
	// lowered to match where one holds it (see [Priority]).
	CPULow CPUPriority = "low"
	// CPUNormal changes nothing: the run competes as the agent does.
	CPUNormal CPUPriority = "normal"
	// CPUBackground runs the run on what the owner's programs leave:
	// nice 19 and SCHED_IDLE on Linux, the idle priority class on
	// Windows, darwin background on macOS. A busy machine can starve it
	// until its deadline.
	CPUBackground CPUPriority = "background"
)

// IOPriority is how a run's processes compete for the disks.
type IOPriority string

const (
	// IOLow, the default: the best-effort class at its lowest level (7)
	// on Linux, with the run's cgroup I/O weight lowered where one
	// holds it; the utility I/O policy on macOS.
	IOLow IOPriority = "low"
	// IONormal changes nothing.
	IONormal IOPriority = "normal"
	// IOIdle: the idle class on Linux (the disk serves the run only
	// when nobody else wants it), the throttle I/O policy on macOS.
	IOIdle IOPriority = "idle"
)

// Priority is how much of the machine a run may take from the owner's
// programs: the owner's file sets it (cpu, io, cpu_time_s), the agent
// passes it in [Options]. The zero Priority is [DefaultPriority].
//
// It is applied to the command and to every process it starts, before
// the command executes anything, and never to a process outside the run.
// What was applied, and what was not and why, is in [Output].Priority:
// nothing is reported that did not take.
type Priority struct {
	// CPU is the processor priority; "" is CPULow.
	CPU CPUPriority `json:"cpu,omitempty"`
	// IO is the disk priority; "" is IOLow.
	IO IOPriority `json:"io,omitempty"`
	// CPUTime bounds the processor time of each process of the run
	// (RLIMIT_CPU on Linux and macOS) or of the whole run (the job's user
	// time on Windows), in whole seconds (rounded up). 0 is the default:
	// the run's deadline times this machine's processors, which no
	// process can reach before the deadline, so it only ends a run whose
	// deadline could not (the agent stopped or frozen). A run it ends
	// says so ([Output].CPUTimeExceeded).
	CPUTime time.Duration `json:"cpu_time,omitempty"`
}

// DefaultPriority is the priority of a run whose owner set none: CPU
// and I/O low, the default CPU-time limit.
func DefaultPriority() Priority { return Priority{CPU: CPULow, IO: IOLow} }

// ParsePriority makes a Priority from the words of the owner's file:
// cpu is "background", "low" or "normal", io is "idle", "low" (also
// written "best-effort-low") or "normal" ("" for either is its default,
// low), and cpuTimeS is the CPU-time limit in seconds (0: the default;
// negative is an error).
func ParsePriority(cpu, io string, cpuTimeS int64) (Priority, error) {
	p := DefaultPriority()
	switch c := CPUPriority(cpu); c {
	case "":
	case CPULow, CPUNormal, CPUBackground:
		p.CPU = c
	default:
		return Priority{}, fmt.Errorf("cpu priority %q: want %q, %q or %q", cpu, CPUBackground, CPULow, CPUNormal)
	}
	switch i := IOPriority(io); i {
	case "":
	case "best-effort-low":
		p.IO = IOLow
	case IOLow, IONormal, IOIdle:
		p.IO = i
	default:
		return Priority{}, fmt.Errorf("io priority %q: want %q, %q or %q", io, IOIdle, IOLow, IONormal)
	}
	if cpuTimeS < 0 {
		return Priority{}, fmt.Errorf("cpu_time_s %d: want a number of seconds, 0 for the default", cpuTimeS)
	}
	p.CPUTime = time.Duration(cpuTimeS) * time.Second
	return p, nil
}

// String is the priority as the owner's file writes it.
func (p Priority) String() string {
	p = p.normalized()
	s := fmt.Sprintf("cpu %s, io %s", p.CPU, p.IO)
	if p.CPUTime > 0 {
		s += fmt.Sprintf(", cpu time %s", p.CPUTime)
	}
	return s
}

// normalized is p with its unset or unknown words at their default.
func (p Priority) normalized() Priority {
	switch p.CPU {
	case CPULow, CPUNormal, CPUBackground:
	default:
		p.CPU = CPULow
	}
	switch p.IO {
	case IOLow, IONormal, IOIdle:
	default:
		p.IO = IOLow
	}
	if p.CPUTime < 0 {
		p.CPUTime = 0
	}
	return p
}

// PriorityReport says what of a run's [Priority] was applied, and what
// was asked and not applied, and why. It names only what took.
type PriorityReport struct {
	// Applied lists each setting in force for the run, as "nice 10",
	// "io best-effort 7", "cgroup cpu.weight 20", "autogroup nice 10",
	// "RLIMIT_CPU 120 s per process", "priority class below normal"...
	Applied []string `json:"applied,omitempty"`
	// Missing lists each setting the priority asked for that is not in
	// force, with why ("cgroup io.weight: no io controller delegated to
	// the agent's cgroup").
	Missing []string `json:"missing,omitempty"`
	// CPUTime is the CPU-time limit in force (per process on Linux and
	// macOS, for the whole run on Windows); 0 when none is.
	CPUTime time.Duration `json:"cpu_time_ns,omitempty"`
}

// String is the report in one line: what applied, then what did not.
func (r *PriorityReport) String() string {
	if r == nil {
		return ""
	}
	s := strings.Join(r.Applied, ", ")
	if s == "" {
		s = "nothing"
	}
	if len(r.Missing) > 0 {
		s += "; not applied: " + strings.Join(r.Missing, "; ")
	}
	return s
}

func (r *PriorityReport) applied(format string, a ...any) {
	r.Applied = append(r.Applied, fmt.Sprintf(format, a...))
}

func (r *PriorityReport) missing(format string, a ...any) {
	r.Missing = append(r.Missing, fmt.Sprintf(format, a...))
}

// PriorityCaps is what this machine gives a run's [Priority], each
// mechanism with "yes" or "no" and what it depends on: what doctor
// prints. A field is "" where the system has no such mechanism.
type PriorityCaps struct {
	// Nice is the processor priority of each process (Linux, macOS) or
	// the priority class (Windows).
	Nice string `json:"nice,omitempty"`
	// IOClass is the I/O class of each process (Linux), with what each
	// disk's scheduler makes of it; on macOS the disk I/O policy.
	IOClass string `json:"io_class,omitempty"`
	// Autogroup is whether the kernel schedules each session as a group
	// of its own, and what a run then gets (Linux).
	Autogroup string `json:"autogroup,omitempty"`
	// CgroupCPU and CgroupIO are the run's cgroup CPU and I/O weights
	// (Linux), or the job's CPU weight (Windows): delegated or not, and
	// why.
	CgroupCPU string `json:"cgroup_cpu,omitempty"`
	CgroupIO  string `json:"cgroup_io,omitempty"`
	// CPUTime is the CPU-time limit.
	CPUTime string `json:"cpu_time,omitempty"`
}

// Linux I/O priority classes (ioprio_set(2)).
const (
	ioprioClassBE   = 2
	ioprioClassIdle = 3
	ioprioLowLevel  = 7 // the best-effort level of IOLow
)

// Windows priority classes (GetPriorityClass) and the job's CPU rate
// control weights (1 to 9, 5 being a job's default).
const (
	winBelowNormalClass = 0x00004000
	winIdleClass        = 0x00000040
)

// prioPlan is what a Priority means for one run on each system: pure,
// so that every system tests every backend's share.
type prioPlan struct {
	p Priority // normalized
	// Linux and macOS: the nice value of every process (0: unchanged).
	nice int
	// Linux: SCHED_IDLE for every process.
	schedIdle bool
	// Linux: the ioprio_set(2) class and level (class 0: unchanged).
	ioClass, ioLevel int
	// Linux, the run's cgroup: cpu.weight, cpu.idle and io.weight on v2,
	// cpu.shares (and cpu.idle) on v1. Normal writes the defaults, so
	// that a reused cgroup carries no earlier run's weights.
	cpuWeight, ioWeight, cpuShares int
	cpuIdle                        bool
	// cpuTime is the CPU-time limit, whole seconds.
	cpuTime time.Duration
	// Windows: the job's priority class (0: unchanged) and CPU rate
	// control weight (0: none).
	winClass, winWeight uint32
	// macOS: the programs the command is run through, each with its
	// arguments (nice, taskpolicy), before sandbox-exec.
	darwin [][]string
}

// priorityPlan is the plan of p for a run with deadline timeout on a
// machine with cores processors.
func priorityPlan(p Priority, timeout time.Duration, cores int) prioPlan {
	p = p.normalized()
	pl := prioPlan{p: p, cpuWeight: 100, ioWeight: 100, cpuShares: 1024}
	switch p.CPU {
	case CPULow:
		pl.nice, pl.cpuWeight, pl.cpuShares = 10, 20, 1024*20/100
		pl.winClass, pl.winWeight = winBelowNormalClass, 3
		pl.darwin = append(pl.darwin, []string{"/usr/bin/nice", "-n", "10"})
	case CPUBackground:
		pl.nice, pl.schedIdle, pl.cpuWeight, pl.cpuShares, pl.cpuIdle = 19, true, 1, 2, true
		pl.winClass, pl.winWeight = winIdleClass, 1
	}
	var tp []string
	if p.CPU == CPUBackground {
		// PRIO_DARWIN_BG: the lowest CPU priority, and throttled disk
		// and network I/O, for the process and what it starts.
		tp = append(tp, "-b")
	}
	switch p.IO {
	case IOLow:
		pl.ioClass, pl.ioLevel, pl.ioWeight = ioprioClassBE, ioprioLowLevel, 20
		tp = append(tp, "-d", "utility")
	case IOIdle:
		pl.ioClass, pl.ioWeight = ioprioClassIdle, 1
		tp = append(tp, "-d", "throttle")
	}
	if len(tp) > 0 {
		pl.darwin = append(pl.darwin, append([]string{"/usr/sbin/taskpolicy"}, tp...))
	}
	pl.cpuTime = p.CPUTime
	if pl.cpuTime == 0 {
		pl.cpuTime = timeout * time.Duration(max(cores, 1))
	}
	pl.cpuTime = time.Duration(math.Ceil(pl.cpuTime.Seconds())) * time.Second
	return pl
}

// darwinArgv is argv run through the plan's macOS programs (nice, then
// taskpolicy: each sets its priority and executes the next, so that the
// command starts with it), with the report of what they apply. A
// program that does not exist (exists says) is left out, and the report
// says what is missing for it. Pure, so that every system tests the
// macOS backend's share.
func (pl prioPlan) darwinArgv(argv []string, exists func(string) bool) ([]string, *PriorityReport) {
	r := &PriorityReport{}
	var prefix []string
	for _, prog := range pl.darwin {
		var what []string
		for k := 1; k < len(prog); k++ {
			switch prog[k] {
			case "-n":
				what = append(what, "nice "+prog[k+1])
				k++
			case "-b":
				what = append(what, "darwin background (PRIO_DARWIN_BG)")
			case "-d":
				what = append(what, "disk I/O policy "+prog[k+1])
				k++
			}
		}
		if exists(prog[0]) {
			prefix = append(prefix, prog...)
			r.Applied = append(r.Applied, what...)
		} else {
			r.missing("%s: %s is missing", strings.Join(what, ", "), prog[0])
		}
	}
	return append(prefix, argv...), r
}

// ioprio is the ioprio_set(2) value of the plan, 0 for none.
func (pl prioPlan) ioprio() int {
	if pl.ioClass == 0 {
		return 0
	}
	return pl.ioClass<<13 | pl.ioLevel
}

// ioWord names the plan's I/O class as the report says it.
func (pl prioPlan) ioWord() string {
	switch pl.ioClass {
	case ioprioClassBE:
		return fmt.Sprintf("io best-effort %d", pl.ioLevel)
	case ioprioClassIdle:
		return "io idle"
	}
	return ""
}

// winClassName names a Windows priority class.
func winClassName(c uint32) string {
	switch c {
	case winBelowNormalClass:
		return "below normal"
	case winIdleClass:
		return "idle"
	case 0x20:
		return "normal"
	}
	return fmt.Sprintf("0x%x", c)
}

// seconds writes d in whole seconds, as limits are given.
func seconds(d time.Duration) string {
	return fmt.Sprintf("%d s", int64(math.Ceil(d.Seconds())))
}
