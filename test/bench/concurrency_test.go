//go:build linux

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/testkit/testbin"
	"github.com/metnos/agent/testkit/testexec"
)

// TestConcurrency measures what issue 30 is about, with metnos-agent as
// a real process polling the reference server on loopback:
//
//   - claim → done (the server's own times: handed out → result
//     stored) of a short invocation, list_folder of a small folder,
//     while a long executor holding a write grant on another folder
//     runs, against the same invocation on an idle agent, measured in
//     the same run (idle, busy, idle again; METNOS_BENCH_CONC_SHORT
//     each, default 20). The goal is ≤ 1.5×; one at a time it would be
//     the long executor's whole duration.
//   - the throughput of METNOS_BENCH_CONC_N short invocations (echo_args,
//     default 200) queued at once, with concurrency 1 and with the
//     default, each agent started afresh.
//
// Information only: nothing fails on a number.
//
//	go test ./test/bench -run Concurrency -count=1 -v
func TestConcurrency(t *testing.T) {
	if testing.Short() {
		t.Skip("concurrency benchmark skipped under -short")
	}
	nShort := envInt(t, "METNOS_BENCH_CONC_SHORT", 20)
	nQueue := envInt(t, "METNOS_BENCH_CONC_N", 200)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if err := testbin.Build(dir, "-trimpath", "-ldflags=-s -w"); err != nil {
		t.Fatal(err)
	}
	execs := testexec.Merge(t, examples.Executors, testexec.Hold)
	srv, err := refserver.New(refserver.Config{Executors: execs, Shim: examples.Shim, PollCheck: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	long, small := filepath.Join(home, "Photos"), filepath.Join(home, "Desktop")
	for _, d := range []string{long, small} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		os.WriteFile(filepath.Join(small, fmt.Sprintf("note-%d.txt", i)), []byte("x"), 0o644)
	}
	env := append(withoutEnv(withoutEnv(withoutEnv(os.Environ(), "HOME"), "XDG_DATA_HOME"), "XDG_CACHE_HOME"), "HOME="+home)
	env = withoutEnv(env, "METNOS_CONCURRENCY")
	tok, _ := srv.IssueToken("bench", time.Minute)
	reg := exec.Command(filepath.Join(dir, "metnos-agent"), "register", "--server", url, "--token", tok)
	reg.Env = env
	if out, err := reg.CombinedOutput(); err != nil {
		t.Fatalf("register: %v\n%s", err, out)
	}
	st, _ := pairing.LoadState(layout.Layout{Data: filepath.Join(home, ".local", "share", "metnos")})
	device := *st.DeviceID

	var logBuf syncBuffer
	start := func(extra ...string) func() {
		agent := exec.Command(filepath.Join(dir, "metnos-agent"), "run")
		agent.Env = append(env, extra...)
		agent.Stderr = &logBuf
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		return func() { agent.Process.Signal(syscall.SIGTERM); agent.Wait() }
	}
	wait := func(id string) refserver.InvocationInfo {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		info, err := srv.Wait(ctx, id)
		if err != nil {
			t.Fatalf("%s: %v\nagent log (tail):\n%s", id, err, tail(logBuf.String(), 4000))
		}
		if info.State != "done" {
			t.Fatalf("%s (%s) failed: %s", id, info.Executor, info.ResultBody)
		}
		return info
	}
	enqueue := func(executor string, args map[string]any, deadline int64) string {
		id, err := srv.Enqueue(device, executor, args, refserver.EnqueueOptions{DeadlineMS: deadline})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	// claimDone is the server's own claim → done of one short
	// invocation, run alone.
	claimDone := func() time.Duration {
		info := wait(enqueue("list_folder", map[string]any{"path": small}, 0))
		return info.ResultAt.Sub(info.DeliveredAt)
	}
	measure := func(n int) []time.Duration {
		var d []time.Duration
		for range n {
			d = append(d, claimDone())
		}
		return d
	}

	// 1. The short invocation, idle and beside a long one.
	stop := start()
	for range 3 { // warm: the executor fetched, the bytecode compiled
		claimDone()
	}
	os.WriteFile(filepath.Join(long, "release"), nil, 0o644)
	wait(enqueue("hold", map[string]any{"folder": long, "wait_for": "release"}, 600000)) // warm hold
	os.Remove(filepath.Join(long, "started-x"))
	os.Remove(filepath.Join(long, "release"))
	idle := measure(nShort)
	holdID := enqueue("hold", map[string]any{"folder": long, "wait_for": "release"}, 600000)
	for {
		if _, err := os.Stat(filepath.Join(long, "started-x")); err == nil {
			break
		}
		if info, _ := srv.Invocation(holdID); info.ResultBody != nil {
			t.Fatalf("the long executor ended before it was released: %s", info.ResultBody)
		}
		time.Sleep(10 * time.Millisecond)
	}
	busy := measure(nShort)
	if info, _ := srv.Invocation(holdID); info.ResultBody != nil {
		t.Fatal("the long executor ended while the short ones ran: the measure is not beside it")
	}
	os.WriteFile(filepath.Join(long, "release"), nil, 0o644)
	wait(holdID)
	idle = append(idle, measure(nShort)...)

	// 2. Throughput, the default concurrency (this agent) then 1.
	burst := func() (time.Duration, float64) {
		ids := make([]string, nQueue)
		t0 := time.Now()
		for i := range ids {
			ids[i] = enqueue("echo_args", map[string]any{"i": i}, 600000)
		}
		var last time.Time
		for _, id := range ids {
			if at := wait(id).ResultAt; at.After(last) {
				last = at
			}
		}
		d := last.Sub(t0)
		return d, float64(nQueue) / d.Seconds()
	}
	dDef, rDef := burst()
	stop()
	stop = start("METNOS_CONCURRENCY=1")
	claimDone() // warm
	d1, r1 := burst()
	stop()

	slices.Sort(idle)
	slices.Sort(busy)
	var b strings.Builder
	fmt.Fprintf(&b, "issue 30: runs side by side (agent as a process, reference server on loopback, %d CPUs)\n", runtime.NumCPU())
	fmt.Fprintf(&b, "  claim → done of list_folder (server's times), %d beside a long writer, %d idle (before and after):\n", len(busy), len(idle))
	fmt.Fprintf(&b, "    idle agent          p50 %s   p95 %s\n", ms(pct(idle, 50)), ms(pct(idle, 95)))
	fmt.Fprintf(&b, "    beside a long run   p50 %s   p95 %s\n", ms(pct(busy, 50)), ms(pct(busy, 95)))
	fmt.Fprintf(&b, "    ratio (p50): %.2f×   (goal ≤ 1.5×; one at a time it would be the long run's whole duration)\n", ratio(pct(busy, 50), pct(idle, 50)))
	fmt.Fprintf(&b, "  %d echo_args queued at once, enqueue of the first → the last result stored:\n", nQueue)
	fmt.Fprintf(&b, "    concurrency 1       %s   %.1f/s\n", d1.Round(time.Millisecond), r1)
	fmt.Fprintf(&b, "    default (4)         %s   %.1f/s   (%.2f× the throughput of one at a time)\n", dDef.Round(time.Millisecond), rDef, rDef/r1)
	t.Log("\n" + b.String())
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
