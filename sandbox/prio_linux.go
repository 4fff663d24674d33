package sandbox

import (
	"time"

	"github.com/metnos/agent/sandbox/shim"
)

// prioritySpec asks the shim for the run's priority (ln.prio): nice,
// SCHED_IDLE and the I/O class on the thread that executes the command,
// RLIMIT_NICE 0 so that the command cannot undo the nice value (it has
// no capability left), RLIMIT_CPU, and the nice value of the run's
// autogroup where the kernel schedules sessions as groups and the run's
// cgroup does not already hold its CPU share.
func (ln *launch) prioritySpec(spec *shim.Spec) {
	pl := ln.prio
	spec.Nice, spec.SchedIdle, spec.IOPrio = pl.nice, pl.schedIdle, pl.ioprio()
	if pl.nice > 0 {
		spec.Rlimits["nice"] = 0
	}
	if pl.cpuTime > 0 {
		spec.Rlimits["cpu"] = uint64(pl.cpuTime / time.Second)
	}
	// A run in a cgroup of the CPU controller (v2 with cpu delegated, or
	// v1's cpu hierarchy) is scheduled as that group, not as its
	// session's autogroup.
	inGroup := ln.cg != nil && ln.cg.cpu && (ln.cg.v2 || pl.p.CPU != CPUNormal)
	if pl.nice > 0 && !inGroup && autogroupsOn() && ownSchedGroup().root {
		ln.autogroup = pl.nice
		spec.Autogroup, spec.AgentAutogroup = pl.nice, ownSchedGroup().autogroup
		// A supervising shim keeps at it itself; otherwise bwrap's
		// child, which shares the command's session, is set from here.
		ln.keepAutogroup = ln.bwrap && !spec.Supervise
	}
}

// priorityReport is what the run applied of its priority: what the
// shim reported on its ready line (nil: the command did not start),
// the cgroup's weights, and the autogroup's nice value when it could
// only be set after the start (by this process or by the supervisor,
// whose exit line is final).
func (ln *launch) priorityReport(ready, final *shim.Status, ex executed) *PriorityReport {
	if ready == nil {
		return nil
	}
	pl := ln.prio
	r := &PriorityReport{}
	p := ready.Prio
	if p == nil {
		p = &shim.Prio{}
	}
	if p.Nice > 0 {
		r.applied("nice %d", p.Nice)
	}
	if p.SchedIdle {
		r.applied("SCHED_IDLE")
	}
	if p.IOPrio != 0 && p.IOPrio == pl.ioprio() {
		r.applied("%s", pl.ioWord())
	}
	if ln.autogroup > 0 {
		late := ex.autogroupAt
		if final != nil && final.AutogroupAt > 0 {
			late = time.Unix(0, final.AutogroupAt)
		}
		switch {
		case p.Autogroup > 0:
			r.applied("autogroup nice %d", p.Autogroup)
		case p.AutogroupDeferred && !late.IsZero():
			r.applied("autogroup nice %d from %s after the start (the kernel's rate limit held it until then)", ln.autogroup, late.Sub(ex.started).Round(time.Millisecond))
		case p.AutogroupDeferred:
			r.missing("autogroup nice %d: the kernel's rate limit (ten a second, machine-wide, without CAP_SYS_ADMIN) refused it until the run ended", ln.autogroup)
		}
	}
	ln.cg.weightsReport(r, pl)
	if p.CPUTime > 0 {
		r.CPUTime = time.Duration(p.CPUTime) * time.Second
		r.applied("RLIMIT_CPU %s per process", seconds(r.CPUTime))
	} else if pl.cpuTime > 0 {
		r.missing("RLIMIT_CPU %s: not in force", seconds(pl.cpuTime))
	}
	r.Missing = append(r.Missing, p.Failed...)
	return r
}
