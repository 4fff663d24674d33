package sandbox

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/windows"
)

const (
	// jobKilledExitCode is the exit status TerminateJobObject gives the
	// processes of a run killed at its deadline (docs/protocol.md §12.4).
	jobKilledExitCode = 137
	// jobLimitFlags are the limits every run's job carries. Neither
	// BREAKAWAY_OK nor SILENT_BREAKAWAY_OK is set: no process of the
	// run can leave the job.
	jobLimitFlags = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE |
		windows.JOB_OBJECT_LIMIT_PROCESS_MEMORY |
		windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS |
		windows.JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION
)

// extendedLimits is the JOBOBJECT_EXTENDED_LIMIT_INFORMATION that sets l.
func (l jobLimits) extendedLimits() windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION {
	var info windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
	info.BasicLimitInformation.LimitFlags = jobLimitFlags
	info.BasicLimitInformation.ActiveProcessLimit = l.processes
	info.ProcessMemoryLimit = uintptr(min(l.memory, uint64(^uintptr(0))))
	if l.priorityClass != 0 {
		info.BasicLimitInformation.LimitFlags |= windows.JOB_OBJECT_LIMIT_PRIORITY_CLASS
		info.BasicLimitInformation.PriorityClass = l.priorityClass
	}
	if l.userTime > 0 {
		// Past it every process of the job ends, with exit status
		// ERROR_NOT_ENOUGH_QUOTA (JOB_OBJECT_TERMINATE_AT_END_OF_JOB).
		info.BasicLimitInformation.LimitFlags |= windows.JOB_OBJECT_LIMIT_JOB_TIME
		info.BasicLimitInformation.PerJobUserTimeLimit = l.userTime
	}
	return info
}

// JOBOBJECT_CPU_RATE_CONTROL_INFORMATION's flags.
const (
	jobCPURateEnable      = 0x1
	jobCPURateWeightBased = 0x2
)

// cpuRateControl is JOBOBJECT_CPU_RATE_CONTROL_INFORMATION: the flags,
// then the weight (or the rate, which the job does not use).
type cpuRateControl struct {
	ControlFlags uint32
	Weight       uint32
}

// cpuRate is the weight-based CPU rate control that sets l's weight; ok
// is false when l has none.
func (l jobLimits) cpuRate() (cpuRateControl, bool) {
	if l.cpuWeight == 0 {
		return cpuRateControl{}, false
	}
	return cpuRateControl{ControlFlags: jobCPURateEnable | jobCPURateWeightBased, Weight: l.cpuWeight}, true
}

// setCPURate gives the job l's CPU weight, when l has one.
func (j *job) setCPURate(l jobLimits) error {
	info, ok := l.cpuRate()
	if !ok {
		return nil
	}
	if _, err := windows.SetInformationJobObject(j.h, windows.JobObjectCpuRateControlInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		return fmt.Errorf("setting the job object's CPU weight: %w", err)
	}
	return nil
}

// job is one run's Job Object. Closing its handle kills every process
// still in it (KILL_ON_JOB_CLOSE): so does the agent's death.
type job struct {
	h windows.Handle
}

// newJob creates an anonymous job object with limits l. Its handle is
// not inheritable: no child holds it open.
func newJob(l jobLimits) (*job, error) {
	h, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox: creating a job object: %w", err)
	}
	info := l.extendedLimits()
	if _, err := windows.SetInformationJobObject(h, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		windows.CloseHandle(h)
		return nil, fmt.Errorf("sandbox: setting the job object's limits: %w", err)
	}
	return &job{h: h}, nil
}

// assign puts process in the job and checks that it is there.
func (j *job) assign(process windows.Handle) error {
	if err := windows.AssignProcessToJobObject(j.h, process); err != nil {
		return err
	}
	in, err := isProcessInJob(process, j.h)
	if err != nil {
		return err
	}
	if !in {
		return fmt.Errorf("the process is not in the job after AssignProcessToJobObject")
	}
	return nil
}

// terminate kills every process in the job with exit status code.
func (j *job) terminate(code uint32) error {
	if err := windows.TerminateJobObject(j.h, code); err != nil {
		return fmt.Errorf("sandbox: terminating the job object: %w", err)
	}
	return nil
}

// close closes the job's handle, which kills whatever is still in it.
func (j *job) close() {
	if j != nil && j.h != 0 {
		windows.CloseHandle(j.h)
		j.h = 0
	}
}

// jobAccounting is JOBOBJECT_BASIC_ACCOUNTING_INFORMATION. Wine fills
// only TotalProcesses and ActiveProcesses.
type jobAccounting struct {
	TotalUserTime             int64
	TotalKernelTime           int64
	ThisPeriodTotalUserTime   int64
	ThisPeriodTotalKernelTime int64
	TotalPageFaultCount       uint32
	TotalProcesses            uint32
	ActiveProcesses           uint32
	TotalTerminatedProcesses  uint32
}

// accounting reads the job's basic accounting information.
func (j *job) accounting() (jobAccounting, error) {
	var a jobAccounting
	err := windows.QueryInformationJobObject(j.h, windows.JobObjectBasicAccountingInformation,
		uintptr(unsafe.Pointer(&a)), uint32(unsafe.Sizeof(a)), nil)
	if err != nil {
		return a, fmt.Errorf("sandbox: reading the job object's accounting: %w", err)
	}
	return a, nil
}

var procIsProcessInJob = windows.NewLazySystemDLL("kernel32.dll").NewProc("IsProcessInJob")

// isProcessInJob reports whether process is in job (in any job when job
// is 0).
func isProcessInJob(process, job windows.Handle) (bool, error) {
	if err := procIsProcessInJob.Find(); err != nil {
		return false, err
	}
	var in int32
	r, _, err := procIsProcessInJob.Call(uintptr(process), uintptr(job), uintptr(unsafe.Pointer(&in)))
	if r == 0 {
		return false, os.NewSyscallError("IsProcessInJob", err)
	}
	return in != 0, nil
}
