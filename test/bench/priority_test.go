//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/testkit/testbin"
)

// TestPriority measures issue 29's promise, executors never make the
// laptop sluggish: how much of its speed alone a foreground workload of
// this test process keeps while busy executors run beside it through the
// real sandbox.Run, with the executors at normal priority (cpu normal,
// io normal: what every run had before) and at the owner's default
// priority (cpu low, io low), and at the strongest (cpu background, io
// idle), all measured in the same run:
//
//   - cpu: one foreground thread per processor, each pinned to its own,
//     counting a busy loop's turns; beside them as many executors as
//     processors, each a Python busy loop.
//   - io: the same, and with the executors' I/O class alone lowered
//     (cpu normal): one foreground thread reading 4 KiB at random places of a
//     file with O_DIRECT (from the disk, not the page cache), counting
//     the reads; beside it as many executors as processors, each reading
//     1 MiB at random places of a file of its own the same way, in a
//     folder granted to it on the same disk. (Reads, because a write's
//     fdatasync waits for the file system's journal, which a kernel
//     thread of its own commits whatever the writer's I/O class.)
//
// Each variant's figure is the foreground's rate over METNOS_PRIO_SECONDS
// (default 3) against its rate alone, measured for half as long just
// before and again just after (the mean of the two: the machine may be
// shared, and its load change meanwhile), and the executors' own rate
// against theirs at normal priority. It also prints the runs' priority
// reports: what was applied here. Information only: nothing fails on a
// number. It takes about 45 s.
//
//	go test ./test/bench -run Priority -count=1 -v
func TestPriority(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short")
	}
	requireBwrap(t)
	if _, err := os.Stat(python); err != nil {
		t.Skipf("the executors are %s: %v", python, err)
	}
	secs := envInt(t, "METNOS_PRIO_SECONDS", 3)
	window := time.Duration(secs) * time.Second
	opts := testbin.SandboxOptions()
	opts.Shim = leanShim(t)
	cores := runtime.NumCPU()

	type variant struct {
		name string
		p    sandbox.Priority
	}
	normal := variant{"normal (cpu normal, io normal)", sandbox.Priority{CPU: sandbox.CPUNormal, IO: sandbox.IONormal}}
	dflt := variant{"default (cpu low, io low)", sandbox.DefaultPriority()}
	variants := map[string][]variant{
		"cpu": {normal, dflt, {"background (cpu background, io idle)", sandbox.Priority{CPU: sandbox.CPUBackground, IO: sandbox.IOIdle}}},
		// The I/O classes alone too: the executors' processor share
		// bounds their reads as well.
		"io": {normal, dflt, {"cpu normal, io low", sandbox.Priority{CPU: sandbox.CPUNormal, IO: sandbox.IOLow}}, {"cpu normal, io idle", sandbox.Priority{CPU: sandbox.CPUNormal, IO: sandbox.IOIdle}}},
	}
	var report strings.Builder
	fmt.Fprintf(&report, "\nload average at the start: %s", loadAverage())
	fmt.Fprintf(&report, "\npriority (issue 29): %d processors, %s windows; the foreground's rate beside %d busy executors, as a share of its rate alone (the mean of %s just before and just after)\n", cores, window, cores, window/2)

	for _, kind := range []string{"cpu", "io"} {
		work := t.TempDir()
		os.Chmod(work, 0o755)
		pol := priorityPolicy(t, work)
		fg := cpuForeground
		script := cpuExecutor
		unit, execUnit, scale := "busy-loop turns/s, all threads", "M turns/s", 1e-6
		if kind == "io" {
			fg = ioForeground(t, work, cores)
			script = ioExecutor
			unit, execUnit, scale = "4 KiB O_DIRECT random reads/s", "MiB/s read", 1
		}
		fmt.Fprintf(&report, "\n%s: foreground %s; executors in %s, summed\n", kind, unit, execUnit)
		fmt.Fprintf(&report, "  %-38s %10s %10s %6s %10s %9s\n", "executors at", "alone", "beside", "kept", "executors", "vs normal")
		var normalExec float64
		after := fg(cores, window/2)
		for _, v := range variants[kind] {
			before := after
			beside, execRate, prio := runBeside(t, kind, cores, window, fg, script, pol, opts, v.p, work)
			after = fg(cores, window/2)
			alone := (before + after) / 2
			if v == normal {
				normalExec = execRate
			}
			vs := "-"
			if normalExec > 0 {
				vs = fmt.Sprintf("%.2f", execRate/normalExec)
			}
			fmt.Fprintf(&report, "  %-38s %10.0f %10.0f %5.0f%% %10.1f %9s\n", v.name, alone, beside, 100*beside/alone, execRate*scale, vs)
			fmt.Fprintf(&report, "    applied: %s\n", prio)
		}
	}
	fmt.Fprintf(&report, "\nload average at the end: %s (the machine's other work shares these processors and this disk)\n", loadAverage())
	t.Log(report.String())
}

// loadAverage is /proc/loadavg's first three figures.
func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// priorityPolicy is the CLI's default policy with work writable.
func priorityPolicy(t *testing.T, work string) policy.Policy {
	t.Helper()
	h, err := testbin.Host()
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.ForProfile(policy.ProfileInput{Profile: policy.ProfileSupervised, Write: []string{work}, Host: h})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// cpuExecutor is a Python busy loop that prints how many turns it made,
// every quarter of a second.
const cpuExecutor = `import sys, time
n, t0 = 0, time.monotonic()
while True:
    for _ in range(100000):
        pass
    n += 100000
    if time.monotonic() - t0 > 0.25:
        print(n, time.monotonic(), flush=True)
        n, t0 = 0, time.monotonic()
`

// ioExecutor reads 1 MiB at random places of the file argv[2] with
// O_DIRECT, over and over, and prints how many MiB it read every
// quarter of a second.
const ioExecutor = `import mmap, os, random, sys, time
f = os.open(sys.argv[2], os.O_RDONLY | os.O_DIRECT)
blocks = os.fstat(f).st_size >> 20
b = mmap.mmap(-1, 1 << 20)
n, t0 = 0, time.monotonic()
while True:
    os.preadv(f, [b], random.randrange(blocks) << 20)
    n += 1
    if time.monotonic() - t0 > 0.25:
        print(n, time.monotonic(), flush=True)
        n, t0 = 0, time.monotonic()
`

// runBeside starts cores executors at priority p, lets them get going,
// measures the foreground for window, stops them, and returns the
// foreground's rate, the executors' summed rate over the window, and
// what the first run's report says was applied.
func runBeside(t *testing.T, kind string, cores int, window time.Duration, fg func(int, time.Duration) float64, script string, pol policy.Policy, opts sandbox.Options, p sandbox.Priority, work string) (float64, float64, string) {
	t.Helper()
	opts.Priority = p
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outs := make([]sandbox.Output, cores)
	errs := make([]error, cores)
	var wg sync.WaitGroup
	for i := range cores {
		wg.Go(func() {
			outs[i], errs[i] = sandbox.Run(ctx, sandbox.Request{
				Argv:    []string{python, "-c", script, work, filepath.Join(work, fmt.Sprintf("data-%d", i))},
				Env:     []string{"PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"},
				Policy:  pol,
				Limits:  sandbox.Limits{Timeout: 5 * window},
				Options: opts,
			})
		})
	}
	// Python's start, and the first writes, before the window.
	time.Sleep(time.Second)
	from := time.Now()
	rate := fg(cores, window)
	to := time.Now()
	cancel()
	wg.Wait()
	var execRate float64
	for i, out := range outs {
		if errs[i] != nil && !strings.Contains(errs[i].Error(), "context canceled") {
			t.Fatalf("%s executor %d: %v", kind, i, errs[i])
		}
		if len(out.Stdout) == 0 && errs[i] == nil {
			// Stopped before the window ended (a starved executor, still
			// starting, is stopped by the cancel: its rate is 0).
			t.Fatalf("%s executor %d printed nothing: exit %d %s, stderr %s", kind, i, out.ExitCode, out.Signal, bytes.TrimSpace(out.Stderr))
		}
		execRate += windowRate(out.Stdout, from, to)
	}
	return rate, execRate, outs[0].Priority.String()
}

// windowRate sums an executor's counts printed within [from, to] (its
// lines are "count monotonic-seconds"; the first line within sets the
// clock's offset) and returns them per second.
func windowRate(stdout []byte, from, to time.Time) float64 {
	type line struct {
		n  float64
		at float64
	}
	var lines []line
	for _, l := range strings.Split(strings.TrimSpace(string(stdout)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		n, err1 := strconv.ParseFloat(f[0], 64)
		at, err2 := strconv.ParseFloat(f[1], 64)
		if err1 == nil && err2 == nil {
			lines = append(lines, line{n, at})
		}
	}
	if len(lines) < 2 {
		return 0
	}
	// Python's monotonic clock is CLOCK_MONOTONIC, as is Go's reading
	// of it: the same seconds since boot.
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	now := float64(ts.Sec) + float64(ts.Nsec)/1e9
	lo := now - time.Since(from).Seconds()
	hi := now - time.Since(to).Seconds()
	var sum float64
	for _, l := range lines {
		if l.at > lo && l.at <= hi {
			sum += l.n
		}
	}
	return sum / to.Sub(from).Seconds()
}

// cpuForeground runs one busy loop per processor, each on a thread
// pinned to its own, for d, and returns their summed turns per second.
func cpuForeground(cores int, d time.Duration) float64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for c := range cores {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			set.Set(c)
			_ = unix.SchedSetaffinity(0, &set)
			var n int64
			x := uint64(c + 1)
			for time.Now().Before(stop) {
				for range 10000 {
					x = x*6364136223846793005 + 1442695040888963407
				}
				n++
			}
			sink.Add(x)
			total.Add(n)
		})
	}
	wg.Wait()
	return float64(total.Load()) / d.Seconds()
}

// sink keeps the busy loop's arithmetic from being optimized away.
var sink atomic.Uint64

// ioFileSize is the size of the files the io part reads.
const ioFileSize = 128 << 20

// ioForeground makes the files the io part reads in dir: its own and
// one per executor (data-<i>), written and synced beforehand. The
// foreground it returns reads 4 KiB at random places of its own with
// O_DIRECT, for d, and returns the reads per second (cores is unused:
// one reader).
func ioForeground(t *testing.T, dir string, cores int) func(int, time.Duration) float64 {
	name := filepath.Join(dir, "foreground")
	chunk := bytes.Repeat([]byte{'x'}, 1<<20)
	for _, f := range append([]string{name}, dataFiles(dir, cores)...) {
		w, err := os.Create(f)
		if err != nil {
			t.Fatal(err)
		}
		for range ioFileSize >> 20 {
			if _, err := w.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		os.Chmod(f, 0o644)
	}
	return func(_ int, d time.Duration) float64 {
		fd, err := unix.Open(name, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			panic(err)
		}
		defer unix.Close(fd)
		// O_DIRECT wants an aligned buffer: a page of its own.
		b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			panic(err)
		}
		defer unix.Munmap(b)
		rng := rand.New(rand.NewPCG(1, 2))
		n := 0
		stop := time.Now().Add(d)
		for time.Now().Before(stop) {
			if _, err := unix.Pread(fd, b, int64(rng.IntN(ioFileSize/4096))*4096); err != nil {
				panic(err)
			}
			n++
		}
		return float64(n) / d.Seconds()
	}
}

// dataFiles are the executors' files of the io part in dir.
func dataFiles(dir string, cores int) []string {
	var fs []string
	for i := range cores {
		fs = append(fs, filepath.Join(dir, fmt.Sprintf("data-%d", i)))
	}
	return fs
}

// leanShim is the metnos-shim of $METNOS_E2E_BIN, or one built for the
// test (this test binary is not a shim).
func leanShim(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("METNOS_E2E_BIN"); d != "" {
		return filepath.Join(d, "metnos-shim")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", dir+"/", "github.com/metnos/agent/cmd/metnos-shim")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building metnos-shim: %v\n%s", err, out)
	}
	return filepath.Join(dir, "metnos-shim")
}
