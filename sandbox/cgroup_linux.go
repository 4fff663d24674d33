package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A runCgroup is the cgroup (or, on a v1 hierarchy, the cgroups) one
// run is confined to: pids.max bounds the number of tasks of the whole
// tree and the memory limit bounds its total, and the kernel's own OOM
// counter tells when it killed. The shim joins it through descriptors of
// the files the agent opens (cgroup.procs on v2, tasks on v1, see
// joinFile), so even a shim inside bwrap's namespaces lands in it before
// it executes anything.
type runCgroup struct {
	dirs    []string   // created directories, removed afterwards
	procs   []*os.File // joinFile of each, passed to the shim
	pids    bool       // pids.max applies
	memory  bool       // the memory limit applies
	oomFile string     // memory.events (v2) or memory.oom_control (v1)
	// oomBase is the OOM kill count when the run got the cgroup: a
	// cgroup reused from an earlier run (see cgroupPool) keeps its count.
	oomBase int
	v2      bool
	// cpu and io report that the run's scheduling weights apply (see
	// cgWeights): cpu.weight and io.weight on v2, cpu.shares on v1.
	cpu, io bool
	// cpuV1 is the index in procs of the v1 cpu hierarchy's cgroup, -1
	// for none: a run joins it only when its CPU priority is not normal.
	cpuV1 int
}

// cgroupPool keeps the emptied cgroups of finished runs for the next
// runs of this process: making a cgroup (in two hierarchies on a v1
// system) and removing it cost more than setting a reused one's limits.
// A run gets its own limits written afresh, its OOM count is read
// against the count it started with, and a cgroup goes back only when
// no task is left in it. The first cgroup a process releases is removed
// (a one-shot exec keeps nothing), the pool empties itself once no run
// came for cgroupPoolIdle, and its owner empties it when it stops
// (DrainPool); what a killed agent leaves is removed by the next one
// (removeStale).
var cgroupPool struct {
	sync.Mutex
	free     []*runCgroup
	released int
	idle     *time.Timer
}

const (
	cgroupPoolMax  = 4
	cgroupPoolIdle = 30 * time.Second
)

// pooledCgroup takes a cgroup from the pool and sets its limits for
// the run; nil when the pool is empty.
func pooledCgroup(maxProcs int, memBytes int64, w cgWeights) *runCgroup {
	for {
		cgroupPool.Lock()
		n := len(cgroupPool.free)
		if n == 0 {
			cgroupPool.Unlock()
			return nil
		}
		c := cgroupPool.free[n-1]
		cgroupPool.free = cgroupPool.free[:n-1]
		cgroupPool.Unlock()
		if c.setLimits(maxProcs, memBytes, w) == nil {
			c.oomBase = c.oomCount()
			return c
		}
		c.destroy()
	}
}

// setLimits writes the run's limits and weights into every cgroup of c.
func (c *runCgroup) setLimits(maxProcs int, memBytes int64, w cgWeights) error {
	for _, d := range c.dirs {
		var err error
		switch {
		case c.v2:
			err = writeCgroupFile(d, "pids.max", strconv.Itoa(maxProcs))
			if err == nil {
				err = writeCgroupFile(d, "memory.max", strconv.FormatInt(memBytes, 10))
			}
			c.setWeightsV2(d, w)
		case fileExists(filepath.Join(d, "pids.max")):
			err = writeCgroupFile(d, "pids.max", strconv.Itoa(maxProcs))
		case fileExists(filepath.Join(d, "cpu.shares")):
			err = setWeightsV1(d, w)
		default:
			err = setMemoryV1(d, memBytes)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// setMemoryV1 sets a v1 memory cgroup's limit, and with swap accounting
// its memory+swap limit to the same: the first may not exceed the
// second, so whichever order fails first is written again.
func setMemoryV1(dir string, memBytes int64) error {
	v := strconv.FormatInt(memBytes, 10)
	err := writeCgroupFile(dir, "memory.limit_in_bytes", v)
	if writeCgroupFile(dir, "memory.memsw.limit_in_bytes", v) == nil && err != nil {
		err = writeCgroupFile(dir, "memory.limit_in_bytes", v)
	}
	return err
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// cgroupMount is one mounted cgroup hierarchy.
type cgroupMount struct {
	point, root string
	v2          bool
	controllers map[string]bool // v1 only
}

var cgroupSeq atomic.Int64

// newRunCgroup makes a cgroup for one run with pids.max = maxProcs and a
// memory limit of memBytes, wherever this process may create one: a
// cgroup v2 child of its own cgroup whose controllers include pids and
// memory, else children of its own cgroups in the v1 pids and memory
// hierarchies (root only, in practice). It returns nil when neither
// works; then limits fall back to rlimits. The weights w go where the
// cgroup has the controllers for them: cpu and io on v2 (when
// delegated), the cpu hierarchy on v1 (see cgWeights).
func newRunCgroup(maxProcs int, memBytes int64, w cgWeights) *runCgroup {
	if c := pooledCgroup(maxProcs, memBytes, w); c != nil {
		return c
	}
	mounts, self := readCgroupMounts(), readSelfCgroups()
	name := fmt.Sprintf("metnos-run-%d-%d", os.Getpid(), cgroupSeq.Add(1))
	c := &runCgroup{cpuV1: -1}
	for _, m := range mounts {
		if !m.v2 {
			continue
		}
		child, ok := makeChild(m, self[""], name)
		if !ok {
			continue
		}
		ctrl, _ := os.ReadFile(filepath.Join(child, "cgroup.controllers"))
		have := " " + strings.TrimSpace(string(ctrl)) + " "
		if !strings.Contains(have, " pids ") || !strings.Contains(have, " memory ") {
			os.Remove(child)
			continue
		}
		if writeCgroupFile(child, "pids.max", strconv.Itoa(maxProcs)) != nil ||
			writeCgroupFile(child, "memory.max", strconv.FormatInt(memBytes, 10)) != nil ||
			!c.add(child, joinFile(true)) {
			os.Remove(child)
			continue
		}
		_ = writeCgroupFile(child, "memory.swap.max", "0")
		c.pids, c.memory, c.v2 = true, true, true
		c.cpu, c.io = strings.Contains(have, " cpu "), strings.Contains(have, " io ")
		c.setWeightsV2(child, w)
		c.oomFile = filepath.Join(child, "memory.events")
		return c
	}
	for _, m := range mounts {
		if m.v2 {
			continue
		}
		for _, ctrl := range []string{"pids", "memory", "cpu"} {
			if !m.controllers[ctrl] || (ctrl == "pids" && c.pids) || (ctrl == "memory" && c.memory) || (ctrl == "cpu" && c.cpu) {
				continue
			}
			child, ok := makeChild(m, self[ctrl], name)
			if !ok {
				continue
			}
			var err error
			switch ctrl {
			case "pids":
				err = writeCgroupFile(child, "pids.max", strconv.Itoa(maxProcs))
			case "cpu":
				err = setWeightsV1(child, w)
			default:
				// With swap accounting, the limit covers swap too.
				err = setMemoryV1(child, memBytes)
			}
			if err != nil || !c.add(child, joinFile(false)) {
				os.Remove(child)
				continue
			}
			switch ctrl {
			case "pids":
				c.pids = true
			case "cpu":
				c.cpu, c.cpuV1 = true, len(c.procs)-1
			default:
				c.memory = true
				c.oomFile = filepath.Join(child, "memory.oom_control")
			}
		}
	}
	if len(c.dirs) == 0 {
		return nil
	}
	return c
}

// makeChild creates the run's cgroup name below this process's cgroup
// path in mount m, after removing what killed agents left there.
func makeChild(m cgroupMount, path, name string) (string, bool) {
	dir, ok := cgroupDir(m, path)
	if !ok {
		return "", false
	}
	removeStale(dir)
	child := filepath.Join(dir, name)
	if os.Mkdir(child, 0o755) != nil {
		return "", false
	}
	return child, true
}

// joinFile is the file of a cgroup that the shim writes "0" into to
// join it. On a v1 hierarchy it is tasks, which moves the writing thread
// alone: cgroup.procs, which moves a whole process, takes a global lock
// for writing, and that waits for an RCU grace period whenever no other
// cgroup write came in the last few milliseconds, which is every run
// (5 to 15 ms here, more than bwrap's whole start). The shim writes from
// the thread that executes the command, so the command and all it starts
// are in the cgroup. v2 allows no thread to move alone into a domain
// cgroup: there it is cgroup.procs.
func joinFile(v2 bool) string {
	if v2 {
		return "cgroup.procs"
	}
	return "tasks"
}

func (c *runCgroup) add(dir, join string) bool {
	f, err := os.OpenFile(filepath.Join(dir, join), os.O_WRONLY, 0)
	if err != nil {
		return false
	}
	c.dirs = append(c.dirs, dir)
	c.procs = append(c.procs, f)
	return true
}

// by says which limits the cgroup enforces, for Output.LimitsBy.
func (c *runCgroup) by() string {
	switch {
	case c == nil || !c.pids && !c.memory:
		return "rlimit"
	case c.pids && c.memory:
		return "cgroup"
	case c.pids:
		return "cgroup(pids)+rlimit"
	default:
		return "cgroup(memory)+rlimit"
	}
}

// oomKilled reports whether the kernel OOM-killed a task of the run.
func (c *runCgroup) oomKilled() bool {
	return c != nil && c.oomCount() > c.oomBase
}

// oomCount is how many tasks the kernel OOM-killed in c since it was
// made.
func (c *runCgroup) oomCount() int {
	if c == nil || c.oomFile == "" {
		return 0
	}
	f, err := os.Open(c.oomFile)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "oom_kill" {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// remove ends the run's use of c: back to the pool when no task is
// left in it (see cgroupPool), else destroyed.
func (c *runCgroup) remove() {
	if c == nil {
		return
	}
	if c.empty() && c.pool() {
		return
	}
	c.destroy()
}

// empty reports whether no task is left in any cgroup of c.
func (c *runCgroup) empty() bool {
	for _, d := range c.dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(b))) != 0 {
			return false
		}
	}
	return true
}

// pool puts c in the pool, and reports whether it did.
func (c *runCgroup) pool() bool {
	cgroupPool.Lock()
	defer cgroupPool.Unlock()
	cgroupPool.released++
	if cgroupPool.released == 1 || len(cgroupPool.free) >= cgroupPoolMax {
		return false
	}
	cgroupPool.free = append(cgroupPool.free, c)
	if cgroupPool.idle == nil {
		cgroupPool.idle = time.AfterFunc(cgroupPoolIdle, drainCgroupPool)
	} else {
		cgroupPool.idle.Reset(cgroupPoolIdle)
	}
	return true
}

// drainCgroupPool removes the pooled cgroups.
func drainCgroupPool() {
	cgroupPool.Lock()
	free := cgroupPool.free
	cgroupPool.free = nil
	cgroupPool.Unlock()
	for _, c := range free {
		c.destroy()
	}
}

// DrainPool removes the emptied cgroups this process keeps for its next
// runs (see cgroupPool): what the owner of the runs calls as it stops,
// once its runs have ended, so that a stopped agent leaves no run
// cgroup behind. It does nothing when nothing is pooled, and may be
// called more than once; a run after it pools again, and the pool then
// empties itself when idle as before.
//
// A pooled cgroup is empty, but nothing is removed by force: one that
// holds a task again (something else moved it there) is not killed, its
// rmdir fails (EBUSY), and it is logged to log and left.
func DrainPool(log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cgroupPool.Lock()
	free := cgroupPool.free
	cgroupPool.free = nil
	if cgroupPool.idle != nil {
		cgroupPool.idle.Stop()
	}
	cgroupPool.Unlock()
	for _, c := range free {
		for _, f := range c.procs {
			f.Close()
		}
		for _, d := range c.dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				log.Warn("sandbox: a pooled run cgroup could not be removed (a task is in it?); it is left as it is", "cgroup", d, "err", err)
			}
		}
	}
}

// destroy closes the descriptors and removes the run's cgroups; the tree
// is dead by then, but the last tasks may take a moment to leave.
func (c *runCgroup) destroy() {
	for _, f := range c.procs {
		f.Close()
	}
	for _, d := range c.dirs {
		for i := 0; i < 50; i++ {
			if err := os.Remove(d); err == nil || os.IsNotExist(err) {
				break
			}
			if c.v2 {
				_ = writeCgroupFile(d, "cgroup.kill", "1")
			} else {
				killCgroupTasks(d)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func writeCgroupFile(dir, name, val string) error {
	return os.WriteFile(filepath.Join(dir, name), []byte(val), 0)
}

// cgroupDir maps a cgroup path of /proc/self/cgroup to its directory
// under the mount.
func cgroupDir(m cgroupMount, path string) (string, bool) {
	if path == "" {
		return "", false
	}
	rel := path
	if m.root != "/" {
		if !within(path, m.root) {
			return "", false
		}
		rel = strings.TrimPrefix(path, m.root)
	}
	return filepath.Join(m.point, rel), true
}

// readSelfCgroups maps each v1 controller (and "" for v2) to this
// process's cgroup path.
func readSelfCgroups() map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			out[ctrl] = parts[2]
		}
	}
	return out
}

// readCgroupMounts lists the cgroup hierarchies in /proc/self/mountinfo.
func readCgroupMounts() []cgroupMount {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []cgroupMount
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		switch g[0] {
		case "cgroup2":
			out = append(out, cgroupMount{point: f[4], root: f[3], v2: true})
		case "cgroup":
			m := cgroupMount{point: f[4], root: f[3], controllers: map[string]bool{}}
			for _, o := range strings.Split(g[2], ",") {
				m.controllers[o] = true
			}
			out = append(out, m)
		}
	}
	return out
}

// killCgroupTasks SIGKILLs whatever is still in a v1 cgroup (v1 has no
// cgroup.kill): by the time the run's cgroup is removed nothing of the
// run may be left.
func killCgroupTasks(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

var staleOnce sync.Map // dir -> struct{}

// removeStale removes, once per directory and process, the run cgroups
// that an agent killed mid-run (kill -9) left behind: those named after
// a process that no longer exists.
func removeStale(dir string) {
	if _, done := staleOnce.LoadOrStore(dir, struct{}{}); done {
		return
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "metnos-run-")
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		stale := filepath.Join(dir, e.Name())
		killCgroupTasks(stale)
		_ = writeCgroupFile(stale, "cgroup.kill", "1")
		time.Sleep(10 * time.Millisecond)
		_ = os.Remove(stale)
	}
}
