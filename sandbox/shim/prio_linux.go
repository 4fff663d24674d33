package shim

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ioprioWhoProcess is ioprio_set(2)'s IOPRIO_WHO_PROCESS.
const ioprioWhoProcess = 1

// applyPriority lowers the calling thread, the one that executes the
// command, as spec asks: nice, scheduling policy and I/O priority are
// per thread on Linux, execve keeps them, and every process the command
// starts inherits them. The run's autogroup gets its nice value too. A
// setting that fails is reported in the returned Prio, not faked, and
// does not stop the run.
func applyPriority(spec Spec) *Prio {
	p := &Prio{}
	if spec.Nice > 0 {
		if err := unix.Setpriority(unix.PRIO_PROCESS, 0, spec.Nice); err != nil {
			p.Failed = append(p.Failed, fmt.Sprintf("nice %d: %v", spec.Nice, err))
		} else {
			p.Nice = spec.Nice
		}
	}
	if spec.SchedIdle {
		// SCHED_IDLE keeps the nice value it is given; no capability is
		// needed to take it, and RLIMIT_NICE 0 keeps the command from
		// leaving it.
		attr := unix.SchedAttr{Policy: unix.SCHED_IDLE, Nice: int32(spec.Nice)}
		if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
			p.Failed = append(p.Failed, fmt.Sprintf("SCHED_IDLE: %v", err))
		} else {
			p.SchedIdle = true
		}
	}
	if spec.IOPrio != 0 {
		if _, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, uintptr(spec.IOPrio)); errno != 0 {
			p.Failed = append(p.Failed, fmt.Sprintf("I/O priority class %d level %d: %v", spec.IOPrio>>13, spec.IOPrio&0x1fff, errno))
		} else {
			p.IOPrio = spec.IOPrio
		}
	}
	if spec.Autogroup > 0 {
		switch err := SetAutogroupNice(0, spec.Autogroup, spec.AgentAutogroup); {
		case err == nil:
			p.Autogroup = spec.Autogroup
		case errors.Is(err, unix.EAGAIN):
			p.AutogroupDeferred = true
		default:
			p.Failed = append(p.Failed, fmt.Sprintf("autogroup nice %d: %v", spec.Autogroup, err))
		}
	}
	return p
}

// Autogroup reads the autogroup of process pid (0: this process): its
// name and nice value.
func Autogroup(pid int) (name string, nice int, err error) {
	b, err := os.ReadFile(autogroupFile(pid))
	if err != nil {
		return "", 0, fmt.Errorf("reading the autogroup: %w", err)
	}
	// "/autogroup-123 nice 10"
	f := strings.Fields(string(b))
	if len(f) != 3 || f[1] != "nice" {
		return "", 0, fmt.Errorf("reading the autogroup: unexpected %q", b)
	}
	nice, err = strconv.Atoi(f[2])
	if err != nil {
		return "", 0, fmt.Errorf("reading the autogroup: unexpected %q", b)
	}
	return f[0], nice, nil
}

// SetAutogroupNice gives the autogroup of process pid (0: this process)
// the nice value nice, unless it is the autogroup named agent (the
// caller's own, which holds the caller's session). Without
// CAP_SYS_ADMIN the kernel allows this ten times a second,
// machine-wide, and refuses with EAGAIN meanwhile.
func SetAutogroupNice(pid, nice int, agent string) error {
	name, _, err := Autogroup(pid)
	if err != nil {
		return err
	}
	if agent != "" && name == agent {
		return fmt.Errorf("the run is in the agent's own autogroup %s, which is left as it is", name)
	}
	f, err := os.OpenFile(autogroupFile(pid), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("setting the autogroup's nice value: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(strconv.Itoa(nice)); err != nil {
		return fmt.Errorf("setting the autogroup's nice value: %w", err)
	}
	return nil
}

// KeepAutogroup sets the nice value of process pid's autogroup to nice
// (never the autogroup agent) until it holds, trying again every 10 ms
// while the kernel's rate limit refuses, until stop is closed or alive
// (nil: always) says the process is gone. It returns when the autogroup
// was seen at nice, or zero when it never was.
func KeepAutogroup(pid, nice int, agent string, stop <-chan struct{}, alive func() bool) time.Time {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if alive != nil && !alive() {
			return time.Time{}
		}
		name, now, err := Autogroup(pid)
		switch {
		case err != nil || (agent != "" && name == agent):
			return time.Time{}
		case now == nice:
			return time.Now()
		}
		err = SetAutogroupNice(pid, nice, agent)
		if err == nil {
			return time.Now()
		}
		if !errors.Is(err, unix.EAGAIN) {
			return time.Time{}
		}
		select {
		case <-stop:
			return time.Time{}
		case <-tick.C:
		}
	}
}

func autogroupFile(pid int) string {
	if pid == 0 {
		return "/proc/self/autogroup"
	}
	return "/proc/" + strconv.Itoa(pid) + "/autogroup"
}
