package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/testkit/testbin"
)

// TestLatency measures what a user waits for: enqueue → done of the
// echo executor, with metnos-agent as a real process polling the
// reference server on loopback, over METNOS_BENCH_LAT_N invocations
// (default 60) after 5 warm-ups. It prints p50 and p95 of that latency,
// the median of the run inside the sandbox as the result reports it
// (elapsed_ms: sandbox start + Python + the executor), and, measured in
// the same run and interleaved, the baseline: the same executor run
// bare (python3 entry.py, same stdin and PYTHONPATH). The share of the
// latency spent starting the sandbox is (sandboxed run − bare run) /
// latency, at the medians. The agent runs at METNOS_LOG=debug, and the
// medians of the steps its timing lines name (verification, executor
// cache, request, journal, sandbox stages, spool, journal and audit
// fsyncs...) are printed too, as is a delivery step measured from the
// agent's log: from the timing line to "result delivered". Information
// only: nothing fails on a number.
//
//	go test ./test/bench -run Latency -count=1 -v
func TestLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("latency benchmark skipped under -short")
	}
	n := 60
	if s := os.Getenv("METNOS_BENCH_LAT_N"); s != "" {
		fmt.Sscan(s, &n)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if err := testbin.Build(dir, "-trimpath", "-ldflags=-s -w"); err != nil {
		t.Fatal(err)
	}
	srv, err := refserver.New(refserver.Config{Executors: examples.Executors, Shim: examples.Shim, PollCheck: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	env := append(withoutEnv(withoutEnv(withoutEnv(os.Environ(), "HOME"), "XDG_DATA_HOME"), "XDG_CACHE_HOME"), "HOME="+home)
	tok, _ := srv.IssueToken("bench", time.Minute)
	reg := exec.Command(filepath.Join(dir, "metnos-agent"), "register", "--server", url, "--token", tok)
	reg.Env = env
	if out, err := reg.CombinedOutput(); err != nil {
		t.Fatalf("register: %v\n%s", err, out)
	}
	st, _ := pairing.LoadState(layout.Layout{Data: filepath.Join(home, ".local", "share", "metnos")})
	agent := exec.Command(filepath.Join(dir, "metnos-agent"), "run")
	agent.Env = append(env, "METNOS_LOG=debug")
	var logBuf syncBuffer
	agent.Stderr = &logBuf
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { agent.Process.Signal(syscall.SIGTERM); agent.Wait() }()

	// The bare baseline: the executor the agent caches, run directly.
	shimDir := t.TempDir()
	exDir := t.TempDir()
	copyFS(t, examples.Shim, ".", shimDir)
	copyFS(t, examples.Executors, "echo_args", exDir)
	args := map[string]any{"greeting": "ciao", "n": 3}
	stdin, _ := json.Marshal(args)
	bare := func() (time.Duration, error) {
		cmd := exec.Command("/usr/bin/python3", filepath.Join(exDir, "echo_args.py"))
		cmd.Env = []string{"PATH=/usr/bin:/bin", "PYTHONPATH=" + shimDir + ":" + exDir, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUTF8=1"}
		cmd.Stdin = bytes.NewReader(stdin)
		start := time.Now()
		out, err := cmd.Output()
		d := time.Since(start)
		if err != nil || !bytes.Contains(out, []byte(`"ok": true`)) && !bytes.Contains(out, []byte(`"ok":true`)) {
			return d, fmt.Errorf("bare run: %v %s", err, out)
		}
		return d, nil
	}
	invoke := func() (total, inside time.Duration, word string, err error) {
		start := time.Now()
		id, err := srv.Enqueue(*st.DeviceID, "echo_args", args, refserver.EnqueueOptions{})
		if err != nil {
			return 0, 0, "", err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		info, err := srv.Wait(ctx, id)
		total = time.Since(start)
		if err != nil {
			return 0, 0, "", fmt.Errorf("%w\nagent log:\n%s", err, logBuf.String())
		}
		var r struct {
			OK      bool   `json:"ok"`
			Elapsed int64  `json:"elapsed_ms"`
			Sandbox string `json:"sandbox"`
		}
		json.Unmarshal(info.ResultBody, &r)
		if !r.OK {
			return 0, 0, "", fmt.Errorf("the echo failed: %s", info.ResultBody)
		}
		return total, time.Duration(r.Elapsed) * time.Millisecond, r.Sandbox, nil
	}
	var totals, insides, bares []time.Duration
	var word string
	for i := 0; i < 5+n; i++ {
		tt, in, w, err := invoke()
		if err != nil {
			t.Fatal(err)
		}
		b, err := bare()
		if err != nil {
			t.Fatal(err)
		}
		if i >= 5 {
			totals, insides, bares, word = append(totals, tt), append(insides, in), append(bares, b), w
		}
	}
	for _, d := range [][]time.Duration{totals, insides, bares} {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	}
	p50, p95 := pct(totals, 50), pct(totals, 95)
	in50, bare50 := pct(insides, 50), pct(bares, 50)
	var b strings.Builder
	fmt.Fprintf(&b, "enqueue → done, echo_args, %d invocations, agent as a process, sandbox %s\n", n, word)
	fmt.Fprintf(&b, "  latency          p50 %s   p95 %s\n", ms(p50), ms(p95))
	fmt.Fprintf(&b, "  run in sandbox   p50 %s   (result elapsed_ms, ms resolution)\n", ms(in50))
	fmt.Fprintf(&b, "  bare python run  p50 %s   (baseline, same run, interleaved)\n", ms(bare50))
	fmt.Fprintf(&b, "  latency / bare run: %.2f×   sandboxed run / bare run: %.2f×\n", ratio(p50, bare50), ratio(in50, bare50))
	fmt.Fprintf(&b, "  share of the latency spent starting the sandbox: %.0f%%   (the rest: python %.0f%%, poll, verification, spool and delivery %.0f%%)\n",
		100*float64(in50-bare50)/float64(p50), 100*float64(bare50)/float64(p50), 100*float64(p50-in50)/float64(p50))
	b.WriteString(stepMedians(logBuf.String(), 5))
	t.Log("\n" + b.String())
}

// stepMedians reads the agent's debug log (slog's text format) and
// returns, for the steps its "timing" lines name, the median of each
// in order, skipping the first warm invocations; and the delivery: the
// time from each timing line to the "result delivered" line of the
// same invocation.
func stepMedians(log string, warm int) string {
	var order []string
	steps := map[string][]float64{}
	timed := map[string]time.Time{}
	var deliver []float64
	seen := 0
	for _, line := range strings.Split(log, "\n") {
		fields := map[string]string{}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				fields[k] = strings.Trim(v, `"`)
			}
		}
		at, _ := time.Parse(time.RFC3339Nano, fields["time"])
		switch {
		case strings.Contains(line, "msg=timing"):
			seen++
			timed[fields["invocation"]] = at
			if seen <= warm {
				continue
			}
			for _, f := range strings.Fields(line) {
				k, v, ok := strings.Cut(f, "=")
				if !ok || !strings.HasSuffix(k, "_ms") {
					continue
				}
				var x float64
				if _, err := fmt.Sscan(v, &x); err != nil {
					continue
				}
				if _, ok := steps[k]; !ok {
					order = append(order, k)
				}
				steps[k] = append(steps[k], x)
			}
		case strings.Contains(line, `msg="result delivered"`):
			if t0, ok := timed[fields["invocation"]]; ok && seen > warm && !at.IsZero() {
				deliver = append(deliver, float64(at.Sub(t0).Microseconds())/1000)
			}
		}
	}
	if len(order) == 0 {
		return "  (the agent logged no timing lines)\n"
	}
	var b strings.Builder
	b.WriteString("  the agent's steps, medians in ms (its METNOS_LOG=debug timing lines):\n   ")
	for _, k := range order {
		fmt.Fprintf(&b, " %s %.2f", strings.TrimSuffix(k, "_ms"), medianF(steps[k]))
	}
	if len(deliver) > 0 {
		fmt.Fprintf(&b, "\n    then deliver (timing line → result delivered) %.2f", medianF(deliver))
	}
	b.WriteString("\n")
	return b.String()
}

func medianF(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

// copyFS copies the tree sub of fsys into dir.
func copyFS(t *testing.T, fsys fs.FS, sub, dir string) {
	t.Helper()
	s, err := fs.Sub(fsys, sub)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dir, s); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
}
