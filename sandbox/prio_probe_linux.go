package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ProbePriority says what this machine gives a run's priority: it makes
// a cgroup for a run as Run does (and removes it) to see which weights
// it carries, and reads the disks' schedulers and the autogroup switch.
// It changes nothing. The shim applies the priority with the sandbox's
// layers off too (Options.Disabled).
func ProbePriority(Options) PriorityCaps {
	c := PriorityCaps{
		Nice:    "yes: nice 10 (low) or 19 and SCHED_IDLE (background) on the process that executes the command, inherited by all it starts; RLIMIT_NICE 0 keeps them from undoing it",
		IOClass: "yes: best-effort 7 (low) or idle; " + ioSchedulers(),
		CPUTime: "yes: RLIMIT_CPU on each process of the run (SIGXCPU, SIGKILL a second later)",
	}
	pl := priorityPlan(DefaultPriority(), 0, 1)
	cg := newRunCgroup(DefaultLimits().MaxProcs, DefaultLimits().MemoryBytes, weightsOf(pl))
	var r PriorityReport
	cg.weightsReport(&r, pl)
	cg.remove()
	c.CgroupCPU, c.CgroupIO = "no: "+cgroupWhyNot(cg, "cpu"), "no: "+cgroupWhyNot(cg, "io")
	for _, a := range r.Applied {
		switch {
		case strings.Contains(a, "cpu."):
			c.CgroupCPU = "yes: " + strings.TrimPrefix(a, "cgroup ") + " on each run's cgroup (against the cgroups beside it)"
		case strings.Contains(a, "io."):
			c.CgroupIO = "yes: " + strings.TrimPrefix(a, "cgroup ") + " on each run's cgroup (iocost's io.weight counts only where io.cost.qos enables it; BFQ's io.bfq.weight is written too where it exists)"
		}
	}
	g := ownSchedGroup()
	inGroup := cg != nil && cg.cpu
	switch {
	case !autogroupsOn():
		c.Autogroup = "off (kernel.sched_autogroup_enabled is 0, or the kernel has none): the nice values compete with every process's"
	case !g.root:
		c.Autogroup = "on, but the agent is in a cgroup of the cpu controller, where autogroups do not apply: the nice values compete within that cgroup"
	case inGroup:
		c.Autogroup = "on; not needed: each run's cgroup holds its CPU share"
	default:
		c.Autogroup = "on: each run's session is a scheduling group of its own, whose nice value the run gets (the kernel allows ten such settings a second without CAP_SYS_ADMIN; a run refused one gets it as soon as the kernel allows, and says when)"
	}
	return c
}

// ioSchedulers says, per disk, what its I/O scheduler makes of the I/O
// classes: BFQ honours classes and levels, mq-deadline the classes only
// (an idle request waits for the others, at most its aging time), none
// and kyber neither.
func ioSchedulers() string {
	devs, _ := filepath.Glob("/sys/block/*/queue/scheduler")
	var out []string
	for _, d := range devs {
		name := filepath.Base(filepath.Dir(filepath.Dir(d)))
		if strings.HasPrefix(name, "loop") || strings.HasPrefix(name, "ram") || strings.HasPrefix(name, "zram") {
			continue
		}
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		sched := "none"
		if i, j := strings.IndexByte(string(b), '['), strings.IndexByte(string(b), ']'); i >= 0 && j > i {
			sched = string(b)[i+1 : j]
		}
		what := "ignores the classes"
		switch sched {
		case "bfq":
			what = "honours the classes and levels"
		case "mq-deadline":
			what = "honours the idle class, not the best-effort levels"
		}
		out = append(out, fmt.Sprintf("%s: %s %s", name, sched, what))
	}
	if len(out) == 0 {
		return "no disk's scheduler found"
	}
	return strings.Join(out, "; ")
}
