package sandbox

import "time"

// Limits bound a run. A zero field is unset: the backend applies its own
// default for this system, [DefaultLimits] on Linux and macOS; on
// Windows 512 MiB of memory per process and at most 8 processes (a set
// MaxProcs only lowers that). No backend reads the environment.
type Limits struct {
	// Timeout is the wall-clock deadline; the whole process tree is
	// killed when it passes.
	Timeout time.Duration `json:"timeout"`
	// MemoryBytes caps memory (address space under rlimits, memory.max
	// under a cgroup, committed memory per process in a Windows job).
	MemoryBytes int64 `json:"memory_bytes"`
	// MaxProcs caps how many processes and threads the command may run
	// at once, itself included.
	MaxProcs int `json:"max_procs"`
	// OutputBytes caps stdout and stderr, each; the rest is drained
	// and dropped and the Output says it was truncated.
	OutputBytes int `json:"output_bytes"`
	// FileBytes caps the size of any single file the command writes.
	FileBytes int64 `json:"file_bytes"`
}

// DefaultLimits returns the limits the Linux and macOS backends use for
// unset fields, sensible for a small Python executor. Each call returns
// a fresh value.
func DefaultLimits() Limits {
	return Limits{
		Timeout:     60 * time.Second,
		MemoryBytes: 1 << 30,
		MaxProcs:    64,
		OutputBytes: 8 << 20,
		FileBytes:   4 << 30,
	}
}

const (
	// jobProcessLimit is the most processes a run may have alive at
	// once on Windows (docs/protocol.md §12.4, §16).
	jobProcessLimit = 8
	// jobDefaultMemory is the per-process memory limit on Windows when
	// the Request sets none (docs/protocol.md §12.4).
	jobDefaultMemory = 512 << 20
)

// limitsFor returns l with its unset fields set to the defaults of the
// backend of goos (runtime.GOOS): on Windows, jobDefaultMemory and at
// most jobProcessLimit processes; elsewhere, DefaultLimits. It is pure,
// so that every system tests every backend's defaults.
func limitsFor(goos string, l Limits) Limits {
	d := DefaultLimits()
	if goos == "windows" {
		d.MemoryBytes, d.MaxProcs = jobDefaultMemory, jobProcessLimit
	}
	if l.Timeout <= 0 {
		l.Timeout = d.Timeout
	}
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.MaxProcs <= 0 {
		l.MaxProcs = d.MaxProcs
	}
	if l.OutputBytes <= 0 {
		l.OutputBytes = d.OutputBytes
	}
	if l.FileBytes <= 0 {
		l.FileBytes = d.FileBytes
	}
	if goos == "windows" {
		l.MaxProcs = min(l.MaxProcs, jobProcessLimit)
	}
	return l
}

// jobLimits are the limits a run's Windows job object enforces.
type jobLimits struct {
	// memory bounds the committed memory of each process, in bytes.
	memory uint64
	// processes bounds how many processes are alive at once.
	processes uint32
	// priorityClass is every process's priority class (0: unchanged),
	// cpuWeight the job's CPU rate control weight (1 to 9; 0: none), and
	// userTime the user-mode processor time of the whole job, in 100 ns
	// units (0: none): the run's priority (see prioPlan).
	priorityClass, cpuWeight uint32
	userTime                 int64
}

// withPriority is l with the job's share of pl.
func (l jobLimits) withPriority(pl prioPlan) jobLimits {
	l.priorityClass, l.cpuWeight = pl.winClass, pl.winWeight
	l.userTime = int64(pl.cpuTime / 100)
	return l
}

// jobLimitsFor is the job object's share of l, whose unset fields
// limitsFor("windows", ...) has filled.
func jobLimitsFor(l Limits) jobLimits {
	return jobLimits{memory: uint64(l.MemoryBytes), processes: uint32(l.MaxProcs)}
}
