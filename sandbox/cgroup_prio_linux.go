package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// cgWeights are the scheduling weights of a run's cgroup (see
// prioPlan): they set the run's share against the other cgroups beside
// it, whatever the nice values inside.
type cgWeights struct {
	// cpuWeight and ioWeight are cgroup v2's cpu.weight and io.weight
	// (1 to 10000, 100 the default); cpuShares is v1's cpu.shares (1024
	// the default); cpuIdle sets cpu.idle (Linux 5.15+), which schedules
	// the whole group as SCHED_IDLE against its siblings.
	cpuWeight, ioWeight, cpuShares int
	cpuIdle                        bool
}

// weightsOf is the cgroup's share of pl.
func weightsOf(pl prioPlan) cgWeights {
	return cgWeights{cpuWeight: pl.cpuWeight, ioWeight: pl.ioWeight, cpuShares: pl.cpuShares, cpuIdle: pl.cpuIdle}
}

// setWeightsV2 writes w into the v2 cgroup dir, for the controllers c
// has there; a controller whose file cannot be written is dropped from
// c (the run's report then says it was not applied).
func (c *runCgroup) setWeightsV2(dir string, w cgWeights) {
	if c.cpu {
		c.cpu = writeCgroupFile(dir, "cpu.weight", strconv.Itoa(w.cpuWeight)) == nil
		if c.cpu && fileExists(filepath.Join(dir, "cpu.idle")) {
			c.cpu = writeCgroupFile(dir, "cpu.idle", boolFile(w.cpuIdle)) == nil
		}
	}
	if c.io {
		// io.weight is iocost's; BFQ reads its own io.bfq.weight.
		c.io = writeCgroupFile(dir, "io.weight", "default "+strconv.Itoa(w.ioWeight)) == nil
		if c.io && fileExists(filepath.Join(dir, "io.bfq.weight")) {
			c.io = writeCgroupFile(dir, "io.bfq.weight", strconv.Itoa(w.ioWeight)) == nil
		}
	}
}

// setWeightsV1 writes w into a cgroup dir of the v1 cpu hierarchy.
func setWeightsV1(dir string, w cgWeights) error {
	if err := writeCgroupFile(dir, "cpu.shares", strconv.Itoa(w.cpuShares)); err != nil {
		return err
	}
	if fileExists(filepath.Join(dir, "cpu.idle")) {
		return writeCgroupFile(dir, "cpu.idle", boolFile(w.cpuIdle))
	}
	return nil
}

func boolFile(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// cpuIdleFile reports whether dir has cpu.idle.
func cpuIdleFile(dir string) bool { return fileExists(filepath.Join(dir, "cpu.idle")) }

// weightsReport adds to r what c applies of pl's weights, and why not
// what it does not.
func (c *runCgroup) weightsReport(r *PriorityReport, pl prioPlan) {
	cpuAsked, ioAsked := pl.p.CPU != CPUNormal, pl.p.IO != IONormal
	if c == nil && cpuAsked && ioAsked {
		r.missing("cgroup cpu and io weights: %s", cgroupWhyNot(c, "cpu"))
		return
	}
	switch {
	case !cpuAsked:
	// cpu.idle gives the group the weight of a SCHED_IDLE task, whatever
	// its cpu.weight or cpu.shares says.
	case c != nil && c.cpu && c.v2 && pl.cpuIdle && cpuIdleFile(c.dirs[0]):
		r.applied("cgroup cpu.idle")
	case c != nil && c.cpu && c.v2:
		r.applied("cgroup cpu.weight %d", pl.cpuWeight)
	case c != nil && c.cpu && c.cpuV1 >= 0 && pl.cpuIdle && cpuIdleFile(c.dirs[c.cpuV1]):
		r.applied("cgroup v1 cpu.idle")
	case c != nil && c.cpu && c.cpuV1 >= 0:
		r.applied("cgroup v1 cpu.shares %d", pl.cpuShares)
	default:
		r.missing("cgroup cpu weight: %s", cgroupWhyNot(c, "cpu"))
	}
	switch {
	case !ioAsked:
	case c != nil && c.io:
		r.applied("cgroup io.weight %d", pl.ioWeight)
	default:
		r.missing("cgroup io weight: %s", cgroupWhyNot(c, "io"))
	}
}

// cgroupWhyNot says why a run's cgroup c does not carry the weight of
// controller ctrl ("cpu" or "io").
func cgroupWhyNot(c *runCgroup, ctrl string) string {
	switch {
	case c == nil:
		return "the agent may create no cgroup for its runs here (no delegated cgroup v2, and not root for the v1 hierarchies)"
	case c.v2:
		return "the agent's cgroup v2 does not delegate the " + ctrl + " controller to its children (" + ctrl + " is not in its cgroup.subtree_control)"
	case ctrl == "io":
		return "no cgroup v2 io controller here (cgroup v1's blkio weights need the CFQ or BFQ scheduler; not used)"
	}
	return "no cgroup v1 cpu hierarchy this process may create a cgroup in"
}

// schedGroup is where this process's tasks are scheduled: whether in
// the root task group, where the kernel's autogroups (one per session)
// apply, and the name of its own autogroup.
type schedGroup struct {
	root      bool
	autogroup string
}

// ownSchedGroup reads this process's schedGroup once.
var ownSchedGroup = sync.OnceValue(func() schedGroup {
	g := schedGroup{root: inRootCPUGroup(readCgroupMounts(), readSelfCgroups())}
	if b, err := os.ReadFile("/proc/self/autogroup"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			g.autogroup = f[0]
		}
	}
	return g
})

// inRootCPUGroup reports whether a process in the cgroups self is in
// the CPU scheduler's root task group: its cgroup in a v1 cpu hierarchy
// is the root, or (without one) its v2 cgroup is the root or has no cpu
// controller.
func inRootCPUGroup(mounts []cgroupMount, self map[string]string) bool {
	for _, m := range mounts {
		if !m.v2 && m.controllers["cpu"] {
			return self["cpu"] == "/" || self["cpu"] == ""
		}
	}
	path := self[""]
	if path == "/" || path == "" {
		return true
	}
	for _, m := range mounts {
		if !m.v2 {
			continue
		}
		if dir, ok := cgroupDir(m, path); ok {
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
			return err == nil && !strings.Contains(" "+strings.TrimSpace(string(b))+" ", " cpu ")
		}
	}
	return true
}

// autogroupsOn reports whether the kernel schedules each session as a
// group of its own (CONFIG_SCHED_AUTOGROUP, kernel.sched_autogroup_enabled).
func autogroupsOn() bool {
	b, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}
