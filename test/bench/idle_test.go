//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/testkit/tailnettest"
	"github.com/metnos/agent/testkit/testbin"
)

// TestIdleMemory measures issue 16's memory at idle and start-up of
// the agent binary, built as releases are (CGO_ENABLED=0, -trimpath,
// -ldflags=-s -w), against a minimal Go program built the same way, in
// one run:
//
//   - idle: `metnos-agent run`, paired with the reference server on
//     loopback, long-polling it (server); paired but pointed at a
//     closed loopback port, backing off (unreachable); reaching the
//     server through its embedded tailnet node on a loopback tailnet
//     (tailnet); the same as server after running five echoes, whose
//     VmRSS 10 s after them is printed too (worked); and the minimal
//     program idling. All run side by side
//     for METNOS_IDLE_SECONDS (default 40: past the return of the first
//     25 s long-poll and the first 30 s heartbeat, which a 10 s sample
//     would miss). Each second it samples VmRSS; at the end it prints
//     the last VmRSS, the highest after the first 3 s, RssAnon, RssFile
//     and PSS (smaps_rollup), threads, and VmRSS's ratio to the
//     baseline's. The goals are ≤ 12 MiB without the tailnet node and
//     ≤ 40 MiB with it (the Rust client idles at 5.5 MiB).
//   - start-up: `metnos-agent version` against the minimal program's
//     run, wall time of fork+exec+wait, interleaved, medians of
//     METNOS_BENCH_N (default 30) after 3 warm-ups, and their ratio.
//
// With METNOS_E2E_BIN set, the metnos-agent in that folder is measured
// instead of one built here (build it with CGO_ENABLED=0 -trimpath
// -ldflags='-s -w' for figures comparable to a release).
//
// Information only: nothing fails on a number. It fails when a process
// does not start or stops while it should idle.
//
//	go test ./test/bench -run IdleMemory -count=1 -v
func TestIdleMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short")
	}
	secs := envInt(t, "METNOS_IDLE_SECONDS", 40)
	n := envInt(t, "METNOS_BENCH_N", defaultN)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	agentBin := filepath.Join(dir, "metnos-agent")
	if bin := os.Getenv("METNOS_E2E_BIN"); bin != "" {
		// Built beforehand (as .ci/run does for a user who cannot read
		// the module cache): build it as releases are for these figures.
		agentBin = filepath.Join(bin, "metnos-agent")
		t.Logf("the agent of METNOS_E2E_BIN: %s", agentBin)
	} else if err := testbin.Build(dir, "-trimpath", "-ldflags=-s -w"); err != nil {
		t.Fatal(err)
	}
	hello := buildMinimal(t, dir)

	srv, err := refserver.New(refserver.Config{Executors: examples.Executors, Shim: examples.Shim, PollCheck: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := closedPort(t)

	type proc struct {
		name    string
		cmd     *exec.Cmd
		log     *syncBuffer
		samples []int64 // VmRSS, KiB
		exited  chan struct{}
	}
	var procs []*proc
	launch := func(name string, cmd *exec.Cmd) {
		p := &proc{name: name, cmd: cmd, log: &syncBuffer{}, exited: make(chan struct{})}
		cmd.Stdout, cmd.Stderr = p.log, p.log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { cmd.Wait(); close(p.exited) }()
		t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); <-p.exited })
		procs = append(procs, p)
	}
	pair := func(name, url string, extra ...string) []string {
		home := filepath.Join(dir, name)
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		env := append(withoutEnv(withoutEnv(withoutEnv(withoutEnv(withoutEnv(os.Environ(), "HOME"), "XDG_DATA_HOME"), "XDG_CACHE_HOME"), "METNOS_DATA_DIR"), "METNOS_CACHE_DIR"),
			"HOME="+home, "METNOS_LOG=warn")
		env = append(env, tailnettest.Knobs...)
		tok, err := srv.IssueToken(name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		reg := exec.Command(agentBin, append([]string{"register", "--server", url, "--token", tok, "--name", name}, extra...)...)
		reg.Env = env
		if out, err := reg.CombinedOutput(); err != nil {
			t.Fatalf("register %s: %v\n%s", name, err, out)
		}
		if _, err := pairing.LoadState(layout.Layout{Data: filepath.Join(home, ".local", "share", "metnos")}); err != nil {
			t.Fatalf("the pairing of %s: %v", name, err)
		}
		return env
	}
	env := pair("server", url)
	cmd := exec.Command(agentBin, "run")
	cmd.Env = env
	launch("agent run, server on loopback", cmd)
	env = pair("unreachable", url)
	cmd = exec.Command(agentBin, "run", "--server", "http://"+closed)
	cmd.Env = env
	launch("agent run, unreachable port", cmd)
	tc := tailnettest.Start(t)
	tailnettest.ServeNode(t, ctx, tc.HTTPTestServer.URL, srv.Handler())
	env = pair("tailnet", "http://metnos:8765", "--tailnet-control-url", tc.HTTPTestServer.URL)
	cmd = exec.Command(agentBin, "run")
	cmd.Env = env
	launch("agent run, tailnet node", cmd)
	env = pair("worked", url)
	cmd = exec.Command(agentBin, "run")
	cmd.Env = env
	launch("agent run, after 5 runs", cmd)
	worker := procs[len(procs)-1]
	launch("minimal Go program", exec.Command(hello, "idle"))

	// The worker runs five echoes first; then it idles like the others.
	st, err := pairing.LoadState(layout.Layout{Data: filepath.Join(dir, "worked", ".local", "share", "metnos")})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		id, err := srv.Enqueue(*st.DeviceID, "echo_args", map[string]any{"i": i}, refserver.EnqueueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Wait(ctx, id); err != nil {
			t.Fatalf("echo %d: %v\n%s", i, err, worker.log)
		}
	}
	var afterRuns int64 // the worker's VmRSS 10 s after its runs

	for i := 0; i < secs; i++ {
		time.Sleep(time.Second)
		for _, p := range procs {
			select {
			case <-p.exited:
				t.Fatalf("%s exited while it should idle: %v\n%s", p.name, p.cmd.ProcessState, p.log)
			default:
			}
			st := procStatus(p.cmd.Process.Pid)
			p.samples = append(p.samples, st["VmRSS"])
		}
		if i == 9 {
			afterRuns = worker.samples[i]
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nidle memory after %d s (KiB; peak: the highest VmRSS after the first 3 s):\n", secs)
	fmt.Fprintf(&b, "  %-32s %8s %8s %8s %8s %8s %8s %7s %9s\n", "process", "VmRSS", "peak", "VmHWM", "RssAnon", "RssFile", "PSS", "threads", "÷ minimal")
	base := procStatus(procs[len(procs)-1].cmd.Process.Pid)["VmRSS"]
	vm := map[string]int64{}
	for _, p := range procs {
		st := procStatus(p.cmd.Process.Pid)
		peak := int64(0)
		for _, s := range p.samples[min(3, len(p.samples)-1):] {
			peak = max(peak, s)
		}
		vm[p.name] = max(peak, st["VmRSS"])
		fmt.Fprintf(&b, "  %-32s %8d %8d %8d %8d %8d %8d %7d %8.2f×\n", p.name, st["VmRSS"], peak, st["VmHWM"], st["RssAnon"], st["RssFile"], pss(p.cmd.Process.Pid), st["Threads"], float64(st["VmRSS"])/float64(max(base, 1)))
	}
	fmt.Fprintf(&b, "  (VmHWM is the high-water mark: what the agent held after start-up, before it gave back the executable's pages at idle; PSS splits the pages the agents share)\n")
	goal := func(what string, kib, limit int64) {
		met := "met"
		if kib > limit {
			met = "NOT met"
		}
		fmt.Fprintf(&b, "  goal %s: peak %.1f MiB ≤ %d MiB: %s\n", what, float64(kib)/1024, limit/1024, met)
	}
	goal("without the tailnet node (server)", vm["agent run, server on loopback"], 12<<10)
	goal("without the tailnet node (unreachable)", vm["agent run, unreachable port"], 12<<10)
	goal("with the tailnet node", vm["agent run, tailnet node"], 40<<10)
	fmt.Fprintf(&b, "  agent run, 10 s after 5 runs: VmRSS %.1f MiB (the Rust client: 6.3 MiB on the side-by-side rig)\n", float64(afterRuns)/1024)

	// Start-up, interleaved.
	ver, min0 := command([]string{agentBin, "version"}, nil), command([]string{hello}, nil)
	var tv, th []time.Duration
	for i := 0; i < warmups+n; i++ {
		a, err := ver()
		if err != nil {
			t.Fatalf("metnos-agent version: %v", err)
		}
		h, err := min0()
		if err != nil {
			t.Fatalf("minimal Go program: %v", err)
		}
		if i >= warmups {
			tv, th = append(tv, a), append(th, h)
		}
	}
	mv, mh := median(tv), median(th)
	fmt.Fprintf(&b, "start-up, %d interleaved runs (medians): metnos-agent version %s, minimal Go program %s: %.2f×\n", n, ms(mv), ms(mh), ratio(mv, mh))
	fmt.Fprintf(&b, "package initialisation of metnos-agent version (GODEBUG=inittrace=1, medians of 9): %s\n", initSummary(t, agentBin, 9))
	t.Log(b.String())
}

// closedPort is a loopback address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// procStatus is the numeric fields of /proc/PID/status (KiB for the
// memory ones); empty when the process is gone.
func procStatus(pid int) map[string]int64 {
	m := map[string]int64{}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if f := strings.Fields(v); ok && len(f) > 0 {
			if x, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				m[k] = x
			}
		}
	}
	return m
}

// pss is the process's proportional set size in KiB, from
// smaps_rollup (0 when it cannot be read).
func pss(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pss:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				x, _ := strconv.ParseInt(f[0], 10, 64)
				return x
			}
		}
	}
	return 0
}

// initSummary runs bin version n times with GODEBUG=inittrace=1 and
// says, in medians, how many packages initialise, the time their init
// takes in all, the share of the module's own packages, and when the
// last one ends after the process started.
func initSummary(t *testing.T, bin string, n int) string {
	t.Helper()
	var total, own, last []time.Duration
	var count int
	for range n {
		cmd := exec.Command(bin, "version")
		cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("metnos-agent version: %v\n%s", err, stderr.Bytes())
		}
		var tot, mine, end time.Duration
		count = 0
		for _, l := range strings.Split(stderr.String(), "\n") {
			// init PKG @AT ms, CLOCK ms clock, BYTES bytes, ALLOCS allocs
			f := strings.Fields(l)
			if len(f) < 6 || f[0] != "init" {
				continue
			}
			at, err1 := strconv.ParseFloat(strings.TrimPrefix(f[2], "@"), 64)
			clock, err2 := strconv.ParseFloat(f[4], 64)
			if err1 != nil || err2 != nil {
				continue
			}
			count++
			d := time.Duration(clock * 1e6)
			tot += d
			if strings.HasPrefix(f[1], "github.com/metnos/agent") {
				mine += d
			}
			end = max(end, time.Duration(at*1e6)+d)
		}
		total, own, last = append(total, tot), append(own, mine), append(last, end)
	}
	return fmt.Sprintf("%d packages, %s in all, of which github.com/metnos/agent %s; the last ends %s after start", count, ms(median(total)), ms(median(own)), ms(median(last)))
}
