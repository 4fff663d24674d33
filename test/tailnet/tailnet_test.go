//go:build linux

package tailnet

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"tailscale.com/derp/derpserver"
	"tailscale.com/envknob"
	"tailscale.com/ipn/store/mem"
	"tailscale.com/net/netns"
	"tailscale.com/net/stun/stuntest"
	"tailscale.com/tailcfg"
	"tailscale.com/tsnet"
	"tailscale.com/tstest/integration/testcontrol"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"
	"tailscale.com/types/nettype"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/tailnet"
)

var binDir string

// knobs keep every node off the LAN, the port mappers and log upload.
var knobs = []string{"TS_DEBUG_OMIT_LOCAL_ADDRS=true", "TS_DISABLE_PORTMAPPER=true", "TS_NO_LOGS_NO_SUPPORT=true", "TS_ASSUME_NETWORK_UP_FOR_TEST=true"}

func TestMain(m *testing.M) {
	for _, kv := range knobs {
		k, v, _ := strings.Cut(kv, "=")
		envknob.Setenv(k, v)
	}
	switch os.Getenv("METNOS_TAILNET_NETNS") {
	case "":
		// Again, in a network namespace that holds only loopback.
		cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), "METNOS_TAILNET_NETNS=inside")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
		if os.Geteuid() != 0 {
			cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
			cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
			cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
		}
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			os.Exit(ee.ExitCode())
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "no network namespace for the tailnet tests: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "inside":
		if err := loopbackUp(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	dir, err := os.MkdirTemp("", "metnos-tailnet-bin-")
	if err != nil {
		panic(err)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if d := os.Getenv("METNOS_E2E_BIN"); d != "" {
			binDir = d
			return m.Run()
		}
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		for _, c := range []string{"metnos-agent", "metnos-shim"} {
			cmd := exec.Command(goTool, "build", "-o", filepath.Join(dir, c), "../../cmd/"+c)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "building %s: %v\n%s", c, err, out)
				return 1
			}
		}
		binDir = dir
		return m.Run()
	}()
	os.Exit(code)
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// startTailnet runs DERP (TLS), STUN and a control server on loopback.
// (testcontrol asks for the auth key at every start of a node when it
// requires one, which real control servers do not: the tests run it
// open, and check the auth key handling on the agent's side.)
func startTailnet(t *testing.T) *testcontrol.Server {
	netns.SetEnabled(false)
	d := derpserver.New(key.NewNode(), logger.Discard)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	derp := httptest.NewUnstartedServer(derpserver.Handler(d))
	derp.Listener.Close()
	derp.Listener = ln
	derp.Config.ErrorLog = logger.StdLogger(logger.Discard)
	derp.Config.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	derp.StartTLS()
	stunAddr, stunStop := stuntest.ServeWithPacketListener(t, nettype.Std{})
	t.Cleanup(func() { derp.CloseClientConnections(); derp.Close(); d.Close(); stunStop() })
	c := &testcontrol.Server{
		DERPMap: &tailcfg.DERPMap{Regions: map[int]*tailcfg.DERPRegion{1: {
			RegionID: 1, RegionCode: "test", Nodes: []*tailcfg.DERPNode{{
				Name: "t1", RegionID: 1, HostName: "127.0.0.1", IPv4: "127.0.0.1", IPv6: "none",
				STUNPort: stunAddr.Port, DERPPort: ln.Addr().(*net.TCPAddr).Port,
				InsecureForTests: true, STUNTestIP: "127.0.0.1",
			}},
		}}},
		DNSConfig:      &tailcfg.DNSConfig{Proxied: true},
		MagicDNSDomain: "tail.test",
		Logf:           logger.Discard,
	}
	c.HTTPTestServer = httptest.NewServer(c)
	t.Cleanup(c.HTTPTestServer.Close)
	return c
}

// serverNode runs the reference server on a tsnet node named "metnos",
// listening on the tailnet only.
func serverNode(t *testing.T, ctx context.Context, control string, srv *refserver.Server) {
	s := &tsnet.Server{Dir: t.TempDir(), ControlURL: control, Hostname: "metnos", Store: new(mem.Store), Ephemeral: true,
		AuthKey: "tskey-test", UserLogf: func(string, ...any) {}, Logf: func(string, ...any) {}}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Up(ctx); err != nil {
		t.Fatal(err)
	}
	ln, err := s.Listen("tcp", ":8765")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
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
	tc := startTailnet(t)
	control := tc.HTTPTestServer.URL
	srv, err := refserver.New(refserver.Config{Executors: examples.Executors, Shim: examples.Shim, PollCheck: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	serverNode(t, ctx, control, srv)

	home := t.TempDir()
	os.Chmod(home, 0o755)
	env := append(os.Environ(), "HOME="+home, "METNOS_LOG=debug")
	env = append(env, knobs...)
	keyFile := filepath.Join(home, "authkey")
	os.WriteFile(keyFile, []byte("tskey-test\n"), 0o644)
	cli := func(args ...string) (int, string) {
		cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		return 0, string(out)
	}
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
		if !strings.Contains(string(info.ResultBody), `"sandbox":"`+sandbox.PlanFor(sandbox.Policy{}, sandbox.LevelNone).Best+`"`) {
			t.Errorf("run %d: %s", run, info.ResultBody)
		}
		if l := listeningTCP(t, cmd.Process.Pid); len(l) != 0 {
			t.Errorf("the agent listens: %v", l)
		}
		time.Sleep(300 * time.Millisecond)
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logf.Close()
		st, ok := tailnet.LastStatus(dataDir)
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
	if code != 0 || !strings.Contains(out, "tailnet node:        laptop") || !strings.Contains(out, "connected, IPs [100.") {
		t.Fatalf("whoami:\n%s", out)
	}
}
