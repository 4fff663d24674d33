//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
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

// TestTailnet: enqueue → done latency of the echo executor with the
// agent reaching the reference server through its embedded tailnet
// node, against the same over plain loopback, interleaved in the same
// run (30 rounds after 5 warm-ups; medians, p95, ratio), and each
// agent's resident memory when idle (VmRSS after 3 s without work).
// The goal is ≤ 40 MB idle with the node. Information only.
//
//	go test ./test/bench -run Tailnet -count=1 -v
func TestTailnet(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
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
	loopURL, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tc := tailnettest.Start(t)
	tailnettest.ServeNode(t, ctx, tc.HTTPTestServer.URL, srv.Handler())

	type agentRun struct {
		name, device string
		cmd          *exec.Cmd
		log          *bytes.Buffer
	}
	start := func(name, url string, extra ...string) *agentRun {
		home := filepath.Join(dir, name)
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		env := append(os.Environ(), "HOME="+home, "METNOS_LOG=warn")
		env = append(env, tailnettest.Knobs...)
		tok, _ := srv.IssueToken(name, time.Minute)
		reg := exec.Command(filepath.Join(dir, "metnos-agent"), append([]string{"register", "--server", url, "--token", tok, "--name", name}, extra...)...)
		reg.Env = env
		if out, err := reg.CombinedOutput(); err != nil {
			t.Fatalf("register %s: %v\n%s", name, err, out)
		}
		st, _ := pairing.LoadState(layout.Layout{Data: filepath.Join(home, ".local", "share", "metnos")})
		a := &agentRun{name: name, device: *st.DeviceID, log: &bytes.Buffer{}}
		a.cmd = exec.Command(filepath.Join(dir, "metnos-agent"), "run")
		a.cmd.Env = env
		a.cmd.Stderr = a.log
		if err := a.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.cmd.Process.Signal(syscall.SIGTERM); a.cmd.Wait() })
		return a
	}
	viaTailnet := start("tailnet", "http://metnos:8765", "--tailnet-control-url", tc.HTTPTestServer.URL)
	viaLoop := start("loopback", loopURL)

	once := func(a *agentRun) time.Duration {
		t0 := time.Now()
		id, err := srv.Enqueue(a.device, "echo_args", map[string]any{"q": 1}, refserver.EnqueueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		defer wcancel()
		if info, err := srv.Wait(wctx, id); err != nil || info.State != "done" {
			t.Fatalf("%s: %v %s\n%s", a.name, err, info.ResultBody, a.log)
		}
		return time.Since(t0)
	}
	var tt, tl []time.Duration
	for i := 0; i < 35; i++ {
		a, b := once(viaTailnet), once(viaLoop)
		if i >= 5 {
			tt, tl = append(tt, a), append(tl, b)
		}
	}
	time.Sleep(3 * time.Second)
	rss := func(a *agentRun) float64 {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
		return 0
	}
	mt, ml := median(tt), median(tl)
	pct95 := func(d []time.Duration) time.Duration {
		s := append([]time.Duration(nil), d...)
		for i := range s {
			for j := i + 1; j < len(s); j++ {
				if s[j] < s[i] {
					s[i], s[j] = s[j], s[i]
				}
			}
		}
		return s[len(s)*95/100]
	}
	t.Logf("\nenqueue → done of echo_args, 30 interleaved rounds:\n  over the tailnet  p50 %v  p95 %v\n  over loopback     p50 %v  p95 %v\n  tailnet / loopback: %.2f×\nidle resident memory: with the embedded node %.1f MB (goal ≤ 40 MB), without %.1f MB",
		mt.Round(100*time.Microsecond), pct95(tt).Round(100*time.Microsecond), ml.Round(100*time.Microsecond), pct95(tl).Round(100*time.Microsecond),
		float64(mt)/float64(ml), rss(viaTailnet), rss(viaLoop))
}
