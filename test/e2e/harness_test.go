//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/testkit/testbin"
	"github.com/metnos/agent/testkit/testexec"
	"github.com/metnos/agent/wire"
)

// binDir holds the agent and its shim, built once for the package
// (or given in $METNOS_E2E_BIN).
var binDir string

func TestMain(m *testing.M) {
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

// executorsFS is the sample executors and the test ones, as one tree.
func executorsFS(t *testing.T) fs.FS {
	t.Helper()
	return testexec.Merge(t, examples.Executors, os.DirFS("testdata/executors"), testexec.Hold)
}

// world is one reference server, a switchable proxy in front of it, and
// the home of one device.
type world struct {
	t      *testing.T
	dir    string
	home   string
	work   string // a folder executors are pointed at
	srv    *refserver.Server
	url    string // the proxy's URL: what the agent talks to
	proxy  *proxy
	device string
	runs   int
}

func newWorld(t *testing.T, mods ...func(*refserver.Config)) *world {
	t.Helper()
	requireSandbox(t)
	dir, err := os.MkdirTemp("", "metnos-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, dir: dir, home: filepath.Join(dir, "home"), work: filepath.Join(dir, "work")}
	t.Cleanup(func() {
		if t.Failed() {
			w.dumpLogs()
		}
		os.RemoveAll(dir)
	})
	for _, d := range []string{w.home, w.work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The server's own log goes to a file next to the agents', so a
	// failure shows what it delivered to whom.
	serverLog, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { serverLog.Close() })
	cfg := refserver.Config{Executors: executorsFS(t), Shim: examples.Shim, PollCheck: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(serverLog, nil))}
	for _, m := range mods {
		m(&cfg)
	}
	srv, err := refserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	w.srv = srv
	w.proxy = newProxy(t, strings.TrimPrefix(base, "http://"))
	w.url = "http://" + w.proxy.addr
	return w
}

// requireSandbox skips (or, with METNOS_REQUIRE_SANDBOX=1, fails) where
// this machine gives no full sandbox: the results' sandbox word is
// checked against it.
func requireSandbox(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("the end-to-end tests need python3: %v", err)
	}
	if best := bestSandbox(); best != fullSandbox {
		msg := "this machine gives only " + best
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatal(msg + " (METNOS_REQUIRE_SANDBOX=1 makes this a failure)")
		}
		t.Log(msg + "; results are checked against it")
	}
}

// needFull skips a test that needs bubblewrap's layer itself, saying
// why, where this machine gives less (with METNOS_REQUIRE_SANDBOX=1,
// newWorld has already failed such a machine).
func needFull(t *testing.T, why string) {
	t.Helper()
	if best := bestSandbox(); best != fullSandbox {
		t.Skipf("this machine gives only %s, and %s", best, why)
	}
}

// fullSandbox is the word of a run with every Linux layer.
const fullSandbox = "bwrap+landlock+seccomp"

func bestSandbox() string {
	return sandbox.PlanFor(testbin.SandboxOptions(), policy.Policy{}, policy.LevelNone).Best
}

func (w *world) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "METNOS_DATA_DIR", "METNOS_CACHE_DIR", "METNOS_PYTHON":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+w.home, "METNOS_LOG=debug")
}

// dataDir and cacheDir are the agent's, under the fake home.
func (w *world) dataDir() string  { return filepath.Join(w.home, ".local", "share", "metnos") }
func (w *world) cacheDir() string { return filepath.Join(w.home, ".cache", "metnos") }

// cli runs one agent command and returns its exit status and output.
func (w *world) cli(args ...string) (int, string) {
	w.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), args...)
	cmd.Env = w.env()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		w.t.Fatalf("running metnos-agent %v: %v", args, err)
	}
	return 0, string(out)
}

// pair registers the device with a fresh token.
func (w *world) pair() {
	w.t.Helper()
	tok, err := w.srv.IssueToken("e2e-laptop", 10*time.Minute)
	if err != nil {
		w.t.Fatal(err)
	}
	code, out := w.cli("register", "--server", w.url, "--token", tok)
	if code != 0 {
		w.t.Fatalf("register: exit %d\n%s", code, out)
	}
	devs := w.srv.Devices()
	if len(devs) != 1 {
		w.t.Fatalf("the server knows %d devices after pairing, want 1", len(devs))
	}
	w.device = devs[0].ID
}

// agentProc is a running `metnos-agent run`.
type agentProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// start runs the agent.
func (w *world) start(extra ...string) *agentProc {
	w.t.Helper()
	return w.startExe(filepath.Join(binDir, "metnos-agent"), nil, extra...)
}

// startExe runs `exe run`, with env added to the agent's environment.
func (w *world) startExe(exe string, env []string, extra ...string) *agentProc {
	w.t.Helper()
	w.runs++
	logPath := filepath.Join(w.dir, fmt.Sprintf("agent-%d.log", w.runs))
	f, err := os.Create(logPath)
	if err != nil {
		w.t.Fatal(err)
	}
	cmd := exec.Command(exe, append([]string{"run"}, extra...)...)
	cmd.Env = append(w.env(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	p := &agentProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	w.t.Cleanup(func() { p.kill9() })
	return p
}

// stop asks the agent to stop and waits.
func (p *agentProc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not stop within 30 s of SIGTERM")
	}
}

// kill9 kills the agent and everything it started, at once.
func (p *agentProc) kill9() {
	select {
	case <-p.done:
		return
	default:
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// exitCode waits for the agent to end by itself.
func (p *agentProc) exitCode(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("the agent did not exit within %s", within)
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return 0
}

// enqueue queues an invocation for the device.
func (w *world) enqueue(executor string, args any, o refserver.EnqueueOptions) string {
	w.t.Helper()
	id, err := w.srv.Enqueue(w.device, executor, args, o)
	if err != nil {
		w.t.Fatal(err)
	}
	return id
}

// wait waits until the invocation has a result.
func (w *world) wait(id string) refserver.InvocationInfo {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	info, err := w.srv.Wait(ctx, id)
	if err != nil {
		w.t.Fatalf("invocation %s got no result: %v", id, err)
	}
	return info
}

// result decodes an invocation's result body.
func result(t *testing.T, info refserver.InvocationInfo) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(info.ResultBody, &m); err != nil {
		t.Fatalf("result of %s is not JSON: %v\n%s", info.ID, err, info.ResultBody)
	}
	return m
}

// waitFile waits for a file to appear.
func waitFile(t *testing.T, p string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(p); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not appear within %s", p, within)
}

// lines reads a file's lines.
func lines(t *testing.T, p string) []string {
	t.Helper()
	f, err := os.Open(p)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// logHas reports whether an agent log contains s.
func logHas(p *agentProc, s string) bool {
	b, _ := os.ReadFile(p.log)
	return strings.Contains(string(b), s)
}

func (w *world) dumpLogs() {
	logs, _ := filepath.Glob(filepath.Join(w.dir, "agent-*.log"))
	logs = append(logs, filepath.Join(w.dir, "server.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		w.t.Logf("--- %s (tail):\n%s", filepath.Base(l), b)
	}
}

// proxy is a loopback TCP proxy that can be taken down (its port then
// refuses connections, and open ones are cut) and brought back up on
// the same port: the server going away, as the agent sees it.
type proxy struct {
	t      *testing.T
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
	// sticky keeps the server side of a connection open when the
	// client goes away, as a server that does not notice a dead
	// client's long-poll (docs/protocol.md §6.5).
	sticky bool
	// armed and open are the blackhole's states (see
	// blackholeAtNextPoll); opened is closed when it opens.
	armed, open bool
	opened      chan struct{}
	links       map[*link]bool
}

// link is one connection through the proxy; dead, it forwards nothing
// either way and closes neither side, as a network path that went away.
type link struct{ dead atomic.Bool }

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{t: t, target: target, conns: map[net.Conn]bool{}, links: map[*link]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.down)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
}

func (p *proxy) pipe(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	l := &link{}
	p.mu.Lock()
	p.conns[c], p.conns[s] = true, true
	p.links[l] = true
	l.dead.Store(p.open)
	p.mu.Unlock()
	go func() {
		p.forward(l, s, c)
		p.mu.Lock()
		sticky := p.sticky
		p.mu.Unlock()
		if !sticky {
			s.Close()
		}
	}()
	io.Copy(io.Discard, io.TeeReader(s, writerOrDiscard{deadOr{l, c}}))
	c.Close()
}

// forward copies the client's bytes to the server until the client
// goes away, dropping them while the link is dead; the poll that
// opens an armed blackhole is dropped too.
func (p *proxy) forward(l *link, s, c net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.armed && bytes.Contains(buf[:n], []byte("POST "+wire.PathPoll)) {
				p.armed, p.open = false, true
				for l := range p.links {
					l.dead.Store(true)
				}
				close(p.opened)
			}
			p.mu.Unlock()
			if !l.dead.Load() {
				s.Write(buf[:n])
			}
		}
		if err != nil {
			return
		}
	}
}

// deadOr writes to w unless the link is dead.
type deadOr struct {
	l *link
	w io.Writer
}

func (d deadOr) Write(b []byte) (int, error) {
	if d.l.dead.Load() {
		return len(b), nil
	}
	return d.w.Write(b)
}

// writerOrDiscard writes to w until it fails, then drops what comes.
type writerOrDiscard struct{ w io.Writer }

func (d writerOrDiscard) Write(b []byte) (int, error) {
	if d.w != nil {
		d.w.Write(b)
	}
	return len(b), nil
}

// setSticky sets whether a dead client's server-side connection stays
// open.
func (p *proxy) setSticky(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sticky = v
}

// blackholeAtNextPoll arms a blackhole that opens when the agent sends
// its next poll: that poll and every byte after it, either way, on
// every connection open or opened meanwhile, are dropped, and no
// connection is closed, as when the network path to the server goes
// away. The channel is closed when it opens.
func (p *proxy) blackholeAtNextPoll() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.opened = true, make(chan struct{})
	return p.opened
}

// restore ends the blackhole: new connections go through again; the
// ones it killed stay dead, as after an outage that outlived them.
func (p *proxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = false
}

// down closes the port and cuts every open connection.
func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// up listens on the same port again.
func (p *proxy) up() {
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("the proxy could not listen again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}
