package agent

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/metnos/agent/agent/internal/result"
	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// job is a claimed invocation, prepared: its sandbox request is built,
// and fp says what of the disk it may touch. It waits in the queue
// until no run it conflicts with is under way (see schedule).
type job struct {
	inv     *invocation
	req     sandbox.Request
	shimDir string
	fp      footprint
	// claimed is when the poll brought it; preparing is set until its
	// preparation has sent what it made (req, shimDir and fp are
	// known only then).
	claimed   time.Time
	preparing bool
	// readyAt is when its preparation sent what it made: from then on
	// it waits only for conflicting runs, and that wait is taken from
	// its deadline when it starts (see Agent.start).
	readyAt time.Time
	// ends is how many runs had ended (Agent.ends) when its
	// preparation began: when more have since, what they changed on
	// disk may change its grants, which are derived again before it
	// starts (see refresh).
	ends int
}

// ran is what a job's goroutine sends back to the Run goroutine: the
// result, whether to keep it (see execute), and when the run ended.
type ran struct {
	j     *job
	r     result.Result
	keep  bool
	ended time.Time
}

// footprint is what of the disk a run may touch, as its policy grants
// it: the trees it may write and those it may only read (the agent's
// own read-only folders, its code and the interpreter's, left out:
// no run writes them), and the executor whose own data folder it
// writes ("" when it writes none of it for another run to see).
type footprint struct {
	writes, reads []string
	// all: the whole root is writable; rootRead: the whole root is
	// readable.
	all, rootRead bool
	own           string
	// alone: the run's sandbox is one identity shared by every run of
	// this device (Windows' AppContainer, whose ACL entries name the
	// device's one container): two runs at once would each have the
	// other's grants, so it runs alone.
	alone bool
}

// footprintOf is the footprint of inv's run under policy p. A dry run
// writes nothing on disk: everything it is granted counts as read.
// The agent's data folder (METNOS_USER_DATA), which every executor may
// write, counts as the executor's own: two runs of one executor that
// writes (its manifest declares fs:write) share it, runs of other
// executors do not wait for it.
// shared says the device's sandbox gives all runs one identity (see
// footprint.alone).
func footprintOf(inv *invocation, p policy.Policy, shared bool) footprint {
	dry := inv.dryBy != ""
	fp := footprint{all: p.RootWritable && !dry, rootRead: p.RootReadable || (p.RootWritable && dry), alone: shared}
	for _, g := range p.Grants {
		if g.Own {
			continue
		}
		if g.Access == policy.Write && !dry {
			fp.writes = append(fp.writes, g.Path)
		} else {
			fp.reads = append(fp.reads, g.Path)
		}
	}
	if inv.ex.Manifest.Facts.Writes() && !dry {
		fp.own = inv.ex.Name
	}
	return fp
}

// writes reports whether the run may write anything another run sees.
func (f footprint) writer() bool { return f.all || len(f.writes) > 0 || f.own != "" }

// conflicts reports whether two runs must not run at once: a tree one
// may write contains, or lies inside, a tree the other may read or
// write (a whole writable root conflicts with every run, a whole
// readable one with every writer), or both write the same executor's
// own data, or either runs alone.
func conflicts(a, b footprint) bool {
	if a.all || b.all || a.alone || b.alone {
		return true
	}
	if (a.rootRead && b.writer()) || (b.rootRead && a.writer()) {
		return true
	}
	if a.own != "" && a.own == b.own {
		return true
	}
	return writesInto(a, b) || writesInto(b, a)
}

// writesInto reports whether a tree w may write overlaps one that r
// may read or write. On macOS and Windows, whose file systems ignore
// case by default, paths are compared case-folded (a conflict too many
// on a volume that does not: never one too few).
func writesInto(w, r footprint) bool {
	for _, p := range w.writes {
		p = foldCase(p)
		for _, lists := range [][]string{r.writes, r.reads} {
			for _, q := range lists {
				if q = foldCase(q); fspath.Within(p, q) || fspath.Within(q, p) {
					return true
				}
			}
		}
	}
	return false
}

// ready reports whether the job at queue index i may start now: no run
// under way conflicts with it, nor does a job that came before it and
// still waits (conflicting invocations run in the order they came).
// One still being prepared never starts, and what came after it waits
// for it to be known.
func (a *Agent) ready(i int) bool {
	if a.queue[i].preparing {
		return false
	}
	fp := a.queue[i].fp
	for _, r := range a.running {
		if conflicts(fp, r.fp) {
			return false
		}
	}
	for _, q := range a.queue[:i] {
		if q.preparing || conflicts(fp, q.fp) {
			return false
		}
	}
	return true
}

// prepared takes back what a job's preparation made: the job is ready
// to start when it may (see schedule), or leaves the queue with the
// result that says why it cannot run (none when the agent was asked to
// stop meanwhile: the server hands it out again).
func (a *Agent) prepared(pr prepared) {
	j := pr.j
	j.preparing = false
	if pr.p != nil {
		j.req, j.shimDir, j.fp = pr.p.req, pr.p.shimDir, pr.p.fp
		j.readyAt = time.Now()
		return
	}
	if i := slices.Index(a.queue, j); i >= 0 {
		a.queue = slices.Delete(a.queue, i, i+1)
	}
	if pr.keep {
		a.finish(j.inv, pr.r)
	}
	j.inv.spans.log(j.inv.log, j.inv.timing)
}

// claimed reports whether invocation id waits in the queue or runs.
func (a *Agent) claimed(id string) bool {
	for _, j := range a.queue {
		if j.inv.ID == id {
			return true
		}
	}
	for _, j := range a.running {
		if j.inv.ID == id {
			return true
		}
	}
	return false
}

// schedule starts, in the order they came, the queued jobs that may
// start (see ready). Once the agent is asked to stop, a queued job is
// not started: it has no STARTED marker and no result, and the server
// hands it out again at its deadline.
func (a *Agent) schedule(ctx context.Context, done chan<- ran) {
	for i := 0; i < len(a.queue); {
		j := a.queue[i]
		if j.preparing {
			// Its preparation sends what it made, whatever happens.
			i++
			continue
		}
		if ctx.Err() != nil || a.halt.Err() != nil || a.cut.Err() != nil {
			j.inv.log.Warn("stopping: this invocation waited for a conflicting run and was not started; the server hands it out again")
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			continue
		}
		if time.Since(j.claimed) >= j.inv.limit {
			// Its whole deadline went by waiting for conflicting runs:
			// the server has given up on it, and it is not started
			// late (no STARTED marker: nothing ran).
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			a.finish(j.inv, waitedPastDeadline(j.inv))
			j.inv.spans.log(j.inv.log, nil)
			continue
		}
		if !a.ready(i) {
			i++
			continue
		}
		if j.ends != a.ends {
			// Runs ended since its grants were derived (the paths its
			// arguments name may exist now, or no longer): derive them
			// again, as they are when it starts.
			if err := a.refresh(j); err != nil {
				a.queue = append(a.queue[:i], a.queue[i+1:]...)
				a.finish(j.inv, result.DeviceError(err))
				j.inv.spans.log(j.inv.log, nil)
				continue
			}
			if !a.ready(i) {
				i++
				continue
			}
		}
		a.queue = append(a.queue[:i], a.queue[i+1:]...)
		if i > 0 || len(a.running) > 0 {
			j.inv.log.Debug("starting beside other runs", "in_flight", len(a.running))
		}
		if a.start(ctx, j, done) {
			a.running = append(a.running, j)
			a.inFlight.Store(int32(len(a.running)))
			a.working.Store(true)
		}
	}
}

// waitedPastDeadline is the result of an invocation not started
// because its deadline went by (or all but a second of it) while it
// waited for conflicting runs: the server has given up on it, and it is
// not started late (no STARTED marker: nothing ran).
func waitedPastDeadline(inv *invocation) result.Result {
	r := result.Timeout("none")
	r.Error = fmt.Sprintf("deadline exceeded: not run; the invocation waited its deadline of %s for other runs of this device that write where it reads or writes", inv.limit)
	inv.log.Warn("not started: its deadline went by while it waited for conflicting runs")
	return r
}

// refresh builds a queued job's sandbox request again, and its
// footprint, from the disk as it is now.
func (a *Agent) refresh(j *job) error {
	req, err := a.request(j.inv, j.shimDir, j.inv.limit)
	if err != nil {
		return err
	}
	j.req, j.fp, j.ends = req, footprintOf(j.inv, req.Policy, a.sharedIdentity()), a.ends
	return nil
}

// busyRoots are what the runs still going may write (their write
// grants but the agent's own): what the journal does not credit to a
// run that ended meanwhile (see undo.Outcome.Busy).
func (a *Agent) busyRoots() []string {
	var roots []string
	for _, j := range a.running {
		if j.inv.dryBy == "" {
			roots = append(roots, writeRoots(j.req.Policy)...)
		}
	}
	return roots
}

// nextDeadline fires when the first job waiting in the queue comes to
// its deadline (nil, which never fires, when none waits).
func (a *Agent) nextDeadline() <-chan time.Time {
	var first time.Time
	for _, j := range a.queue {
		if end := j.claimed.Add(j.inv.limit); !j.preparing && (first.IsZero() || end.Before(first)) {
			first = end
		}
	}
	if first.IsZero() {
		return nil
	}
	return time.After(time.Until(first))
}

// ended takes back a job whose run ended: its result is spooled and
// recorded (journal, audit log) here, on the Run goroutine, before any
// run that waited for it starts.
func (a *Agent) ended(d ran) {
	for i, j := range a.running {
		if j == d.j {
			a.running = append(a.running[:i], a.running[i+1:]...)
			break
		}
	}
	a.inFlight.Store(int32(len(a.running)))
	a.runEnded = d.ended
	a.ends++
	if d.keep {
		a.finish(d.j.inv, d.r)
	}
	d.j.inv.spans.log(d.j.inv.log, d.j.inv.timing)
	if len(a.running) == 0 {
		a.workEnded.Store(time.Now().UnixNano())
		a.working.Store(false)
	}
}

// slots is how many invocations may be claimed and not yet ended at
// once: the owner's concurrency, and no more runs of the default (or
// configured) memory limit than half the machine's memory holds.
func (a *Agent) slots() int {
	n := a.lim.Concurrency()
	per := a.cfg.MemoryBytes
	if per <= 0 {
		per = sandbox.DefaultLimits().MemoryBytes
	}
	if total := physicalMemory(); total > 0 {
		n = min(n, max(1, int(total/2/per)))
	}
	a.limit.Store(int32(n))
	return n
}

// InFlight says how many invocations run now, and how many may run at
// once; safe from any goroutine.
func (a *Agent) InFlight() (running, limit int) {
	return int(a.inFlight.Load()), int(a.limit.Load())
}

// sharedIdentity reports whether this device's sandbox runs every
// invocation under one identity whose grants are the union of the runs
// under way: Windows' AppContainer rung, whose file grants are ACL
// entries for the device's one container. Runs there go one at a time.
func (a *Agent) sharedIdentity() bool { return a.best == sandbox.WordAppContainer }

// foldCase is p lower-cased where file systems ignore case by default
// (macOS, Windows), p itself elsewhere.
func foldCase(p string) string {
	if runtime.GOOS == "darwin" || runtime.GOOS == "windows" {
		return strings.ToLower(p)
	}
	return p
}
