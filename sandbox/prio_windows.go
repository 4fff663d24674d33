package sandbox

import (
	"sync"

	"golang.org/x/sys/windows"
)

// onWine reports whether this is Wine, whose job objects accept limits
// and keep none (ntdll.dll exports wine_get_version, Windows' does not).
var onWine = sync.OnceValue(func() bool {
	return windows.NewLazySystemDLL("ntdll.dll").NewProc("wine_get_version").Find() == nil
})

// jobPriority gives the job j its CPU weight and reports the job's
// share of the run's priority: the CPU weight, the job's user time, and
// the I/O priority, which a job does not carry. The priority class is
// checked on the process (processPriority).
func jobPriority(j *job, jl jobLimits, pp prioPlan, r *PriorityReport) {
	if err := j.setCPURate(jl); err != nil {
		r.missing("job CPU weight %d of 9: %v", jl.cpuWeight, err)
	} else if jl.cpuWeight > 0 && !onWine() {
		r.applied("job CPU weight %d of 9", jl.cpuWeight)
	} else if jl.cpuWeight > 0 {
		r.missing("job CPU weight %d of 9: Wine's job objects accept it and keep none", jl.cpuWeight)
	}
	if jl.userTime > 0 {
		if onWine() {
			r.missing("job user time %s: Wine's job objects accept it and keep none", seconds(pp.cpuTime))
		} else {
			r.CPUTime = pp.cpuTime
			r.applied("job user time %s for the whole run", seconds(pp.cpuTime))
		}
	}
	if pp.p.IO != IONormal {
		r.missing("io %s: a Windows job carries no I/O priority; not applied", pp.p.IO)
	}
}

// processPriority checks that the run's process, still suspended, has
// the priority class jl asks for: the job's (inJob), which every process
// of the run then has; where it did not take (Wine) or there is no job,
// it sets the process's own, which the processes it starts inherit
// (Windows passes the idle and below-normal classes on; Wine does not).
func processPriority(process windows.Handle, inJob bool, jl jobLimits, r *PriorityReport) {
	if jl.priorityClass == 0 {
		return
	}
	want := winClassName(jl.priorityClass)
	if got, err := windows.GetPriorityClass(process); err == nil && got == jl.priorityClass && inJob {
		r.applied("priority class %s, the job's", want)
		return
	}
	if err := windows.SetPriorityClass(process, jl.priorityClass); err != nil {
		r.missing("priority class %s: %v", want, err)
		return
	}
	got, err := windows.GetPriorityClass(process)
	if err != nil || got != jl.priorityClass {
		r.missing("priority class %s: the process has %s after setting it (%v)", want, winClassName(got), err)
		return
	}
	if onWine() {
		// Wine starts every process at the normal class.
		r.applied("priority class %s, for the command's process only (under Wine the processes it starts have the normal class)", want)
		return
	}
	r.applied("priority class %s, the command's process's (the processes it starts inherit it)", want)
}

// jobTimeUsedUp reports whether the job's user-time limit ended the run:
// its main process ended with ERROR_NOT_ENOUGH_QUOTA, which the job
// gives every process when its time is up, and the job's accounting
// says the time was used.
func jobTimeUsedUp(j *job, jl jobLimits, code uint32) bool {
	if j == nil || jl.userTime <= 0 || code != uint32(windows.ERROR_NOT_ENOUGH_QUOTA) {
		return false
	}
	a, err := j.accounting()
	return err == nil && a.TotalUserTime >= jl.userTime
}

// ProbePriority says what this machine gives a run's priority: the
// job's priority class, CPU weight and user time; no I/O priority.
func ProbePriority(Options) PriorityCaps {
	c := PriorityCaps{
		Nice:      "yes: the job's priority class, below normal (low) or idle (background), for every process of the run",
		IOClass:   "no: a Windows job carries no I/O priority",
		CgroupCPU: "yes: the job's weight-based CPU rate control, 3 (low) or 1 (background) of 9",
		CPUTime:   "yes: the job's user time, for the whole run",
	}
	if onWine() {
		c.Nice = "partly: Wine keeps no job priority class; the command's process gets the class, the processes it starts the normal one"
		c.CgroupCPU = "no: Wine's job objects keep no CPU rate control"
		c.CPUTime = "no: Wine's job objects accept a user-time limit and keep none"
	}
	return c
}
