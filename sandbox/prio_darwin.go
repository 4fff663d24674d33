package sandbox

import "os"

// ProbePriority says what this Mac gives a run's priority: nice and
// taskpolicy (darwin background, disk I/O policy), each present or not,
// and RLIMIT_CPU.
func ProbePriority(Options) PriorityCaps {
	has := func(p string) bool { fi, err := os.Stat(p); return err == nil && fi.Mode().IsRegular() }
	c := PriorityCaps{
		Nice:    "no: /usr/bin/nice is missing",
		IOClass: "no: /usr/sbin/taskpolicy is missing",
		CPUTime: "yes: RLIMIT_CPU's soft limit on each process (SIGXCPU), while the agent itself has used less processor time than the limit",
	}
	if has("/usr/bin/nice") {
		c.Nice = "yes: nice 10 (low); darwin background (background) where taskpolicy is"
	}
	if has("/usr/sbin/taskpolicy") {
		c.IOClass = "yes: taskpolicy's disk I/O policy, utility (low) or throttle (idle)"
	}
	return c
}
