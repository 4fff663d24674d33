//go:build linux

package tailnet

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/tailnet"
	"github.com/metnos/agent/testkit/tailnettest"
	"github.com/metnos/agent/testkit/testbin"
)

var binDir string

func TestMain(m *testing.M) {
	tailnettest.Main()
	dir, cleanup, err := testbin.Prepare()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// listeningTCP reports the TCP sockets of pid that listen.
func listeningTCP(t *testing.T, pid int) []string {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, f := range []string{"tcp", "tcp6"} {
		fh, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) > 9 && fs[3] == "0A" && inodes[fs[9]] {
				out = append(out, f+" "+fs[1])
			}
		}
		fh.Close()
	}
	return out
}

// TestAgentOverTailnet: the agent pairs with and serves a server that
// is reachable only on the tailnet, through its own embedded node,
// keeps its node identity across restarts, reports the node in whoami,
// and opens no listening port.
func TestAgentOverTailnet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, refserver.Config{PollCheck: 20 * time.Millisecond}, 0o644)
	tc, srv, control, home, env, keyFile, cli := w.tc, w.srv, w.control, w.home, w.env, w.keyFile, w.cli
	tok, _ := srv.IssueToken("laptop", 10*time.Minute)
	reg := []string{"register", "--server", "http://metnos:8765", "--token", tok, "--tailnet-control-url", control, "--tailnet-authkey-file", keyFile, "--name", "laptop"}
	if code, out := cli(reg...); code == 0 || !strings.Contains(out, "chmod 600") {
		t.Fatalf("an auth key file readable by others: exit %d\n%s", code, out)
	}
	os.Chmod(keyFile, 0o600)
	if code, out := cli(reg...); code != 0 {
		t.Fatalf("register over the tailnet: exit %d\n%s", code, out)
	}
	devs := srv.Devices()
	if len(devs) != 1 {
		t.Fatalf("%d devices", len(devs))
	}
	dataDir := filepath.Join(home, ".local", "share", "metnos")
	if _, err := os.Stat(filepath.Join(dataDir, "tailnet")); err != nil {
		t.Fatalf("the node's state is not in the data dir: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dataDir, "tailnet.json")); strings.Contains(string(b), "tskey") {
		t.Fatal("the auth key was written to tailnet.json")
	}

	var firstIPs []string
	for run := 1; run <= 2; run++ {
		// The second run has no auth key: the node's identity is kept.
		cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), "run")
		cmd.Env = env
		logf, _ := os.Create(filepath.Join(home, fmt.Sprintf("run-%d.log", run)))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		id, _ := srv.Enqueue(devs[0].ID, "echo_args", map[string]any{"run": run}, refserver.EnqueueOptions{})
		wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
		info, err := srv.Wait(wctx, id)
		wcancel()
		if err != nil || info.State != "done" {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("run %d: %v %s\n%s", run, err, info.ResultBody, b)
		}
		// Executors still get the full sandbox under an agent that may not
		// listen (no_new_privs and the listen ban are inherited).
		if !strings.Contains(string(info.ResultBody), `"sandbox":"`+sandbox.PlanFor(testbin.SandboxOptions(), policy.Policy{}, policy.LevelNone).Best+`"`) {
			t.Errorf("run %d: %s", run, info.ResultBody)
		}
		if l := listeningTCP(t, cmd.Process.Pid); len(l) != 0 {
			t.Errorf("the agent listens: %v", l)
		}
		time.Sleep(300 * time.Millisecond)
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logf.Close()
		st, ok := tailnet.LastStatus(layout.Layout{Data: dataDir})
		if !ok || len(st.IPs) == 0 {
			t.Fatalf("run %d left no tailnet status", run)
		}
		if run == 1 {
			firstIPs = st.IPs
		} else if fmt.Sprint(st.IPs) != fmt.Sprint(firstIPs) {
			t.Errorf("the node changed identity across restarts: %v then %v", firstIPs, st.IPs)
		}
	}
	// The server's node and the agent's, one each: no new node per start.
	if n := len(tc.AllNodes()); n != 2 {
		t.Errorf("the control server knows %d nodes, want 2", n)
	}
	code, out := cli("whoami")
	if code != 0 || !strings.Contains(out, "tailnet node:        laptop") || !strings.Contains(out, "tailnet:             no agent running (it stopped at ") ||
		!strings.Contains(out, "the server last answered it at") || !strings.Contains(out, "running, IPs [100.") {
		t.Fatalf("whoami:\n%s", out)
	}

	// A run whose network is narrowed to named hosts needs bubblewrap's
	// network namespace (elsewhere it is refused).
	if best := sandbox.PlanFor(testbin.SandboxOptions(), policy.Policy{}, policy.LevelNone).Best; best != "bwrap+landlock+seccomp" {
		msg := "this machine gives only " + best + ", and an executor with network access runs narrowed to its hosts, which needs bubblewrap"
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatal(msg + " (METNOS_REQUIRE_SANDBOX=1 makes this a failure)")
		}
		t.Skip(msg + " (set METNOS_REQUIRE_SANDBOX=1 to fail instead)")
	}
	// Executors never reach the tailnet through the agent: one with
	// network access (loopback named, any public host) reaches a
	// loopback server through the agent's egress proxy, which dials on
	// the OS network, and not the server's tailnet address (a tailnet
	// address is never a public host).
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	var serverIP string
	for _, n := range tc.AllNodes() {
		if n.Hostinfo.Hostname() == "metnos" && len(n.Addresses) > 0 {
			serverIP = n.Addresses[0].Addr().String()
		}
	}
	if serverIP == "" {
		t.Fatal("no tailnet address for the server's node")
	}
	cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), "run")
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tailAddr, loopAddr := serverIP+":8765", strings.TrimPrefix(plain.URL, "http://")
	id, err := srv.Enqueue(devs[0].ID, "net_probe", map[string]any{"addrs": []any{tailAddr, loopAddr}}, refserver.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	info, err := srv.Wait(wctx, id)
	wcancel()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if err != nil {
		t.Fatal(err)
	}
	var probe struct {
		Payload struct{ Probes map[string]string }
	}
	json.Unmarshal(info.ResultBody, &probe)
	if probe.Payload.Probes[loopAddr] != "reached" || probe.Payload.Probes[tailAddr] == "reached" || probe.Payload.Probes[tailAddr] == "" {
		t.Fatalf("an executor with network access: %s", info.ResultBody)
	}

}

// TestLoginURL: a first login without an auth key, on a control server
// that wants one, prints the URL to open and waits.
func TestLoginURL(t *testing.T) {
	tc := tailnettest.Start(t)
	tc.RequireAuth = true
	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home)
	env = append(env, tailnettest.Knobs...)
	cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), "register", "--server", "http://metnos:8765", "--token", "DEV.x.y",
		"--tailnet-control-url", tc.HTTPTestServer.URL, "--name", "laptop")
	cmd.Env = env
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Contains(out.String(), "log this device in") && strings.Contains(out.String(), tc.HTTPTestServer.URL) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no login URL was printed:\n%s", out.String())
}

// syncBuffer is a buffer written by a child's output and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// executorsFS is the sample executors and this package's test ones.
func executorsFS(t *testing.T) fs.FS {
	t.Helper()
	out := fstest.MapFS{}
	for _, fsys := range []fs.FS{examples.Executors, os.DirFS("testdata/executors")} {
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(fsys, p)
			out[p] = &fstest.MapFile{Data: b, Mode: 0o644}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestServerOnlyOverTailnet: every command that talks to the server
// reaches it through the embedded node. With the server reachable only
// on the tailnet, undo's liveness guard finds that it answers (so no
// local undo happens behind its back), and runtime install
// --from-server fetches the signed descriptor and the archive. Over the
// OS network, "metnos" does not even resolve: undo would go ahead
// locally and the install would fail.
func TestServerOnlyOverTailnet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const archive = "cpython-3.99.1+test-x86_64-unknown-linux-gnu-install_only.tar.gz"
	runtimeDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(runtimeDir, archive), fakeRuntime(t, "3.99.1"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, ctx, refserver.Config{RuntimeDir: runtimeDir}, 0o600)
	srv, control, home, keyFile, cli := w.srv, w.control, w.home, w.keyFile, w.cli
	tok, _ := srv.IssueToken("laptop", 10*time.Minute)
	if code, out := cli("register", "--server", "http://metnos:8765", "--token", tok, "--tailnet-control-url", control, "--tailnet-authkey-file", keyFile, "--name", "laptop"); code != 0 {
		t.Fatalf("register over the tailnet: exit %d\n%s", code, out)
	}

	// Later commands have no tailnet flag: tailnet.json says how.
	code, out := cli("undo", "--last")
	if code == 0 || !strings.Contains(out, "the server answers") || strings.Contains(out, "does not answer") {
		t.Errorf("undo without --offline, the server answering over the tailnet: exit %d\n%s", code, out)
	}
	code, out = cli("runtime", "install", "--from-server", archive)
	if code != 0 || !strings.Contains(out, "installed Python 3.99.1") {
		t.Fatalf("runtime install --from-server over the tailnet: exit %d\n%s", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(home, ".cache", "metnos", "runtime", "runtime-descriptor.json")); err != nil || !strings.Contains(string(b), archive) {
		t.Errorf("the signed descriptor was not cached: %v %s", err, b)
	}
}

// world is a reference server reachable only on a tailnet of its own
// on loopback, and a home for the agent with an auth key file of mode
// keyMode; cli runs the agent there.
type world struct {
	srv                    *refserver.Server
	tc                     *tailnettest.Tailnet
	control, home, keyFile string
	env                    []string
	cli                    func(args ...string) (int, string)
}

func newWorld(t *testing.T, ctx context.Context, cfg refserver.Config, keyMode os.FileMode) world {
	t.Helper()
	tc := tailnettest.Start(t)
	w := world{tc: tc, control: tc.HTTPTestServer.URL, home: t.TempDir()}
	cfg.Executors, cfg.Shim = executorsFS(t), examples.Shim
	srv, err := refserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	w.srv = srv
	// The server goes down with control and DERP (tc.Outage).
	tailnettest.ServeNode(t, ctx, w.control, tc.Gate(srv.Handler()))
	os.Chmod(w.home, 0o755)
	w.env = append(os.Environ(), "HOME="+w.home, "METNOS_LOG=debug")
	w.env = append(w.env, tailnettest.Knobs...)
	w.keyFile = filepath.Join(w.home, "authkey")
	os.WriteFile(w.keyFile, []byte("tskey-test\n"), keyMode)
	w.cli = func(args ...string) (int, string) {
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "metnos-agent"), args...)
		cmd.Env = w.env
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		return 0, string(out)
	}
	return w
}

// fakeRuntime is a runtime archive whose interpreter is a shell script
// that prints version.
func fakeRuntime(t *testing.T, version string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range []struct {
		name, body string
		dir        bool
	}{
		{name: "python/", dir: true},
		{name: "python/bin/", dir: true},
		{name: "python/bin/python3", body: "#!/bin/sh\necho " + version + "\n"},
	} {
		h := &tar.Header{Name: e.name, Mode: 0o755, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		if e.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
