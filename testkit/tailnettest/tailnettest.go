//go:build linux

// Package tailnettest runs a real tailnet on loopback for tests and
// benchmarks: tailscale's test control server, DERP and STUN in the
// test process, and tsnet nodes, inside a network namespace that holds
// only loopback.
package tailnettest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

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
)

// Knobs keep every node off the LAN, the port mappers and log upload;
// child processes (the agent) get them in their environment.
var Knobs = []string{"TS_DEBUG_OMIT_LOCAL_ADDRS=true", "TS_DISABLE_PORTMAPPER=true", "TS_NO_LOGS_NO_SUPPORT=true", "TS_ASSUME_NETWORK_UP_FOR_TEST=true"}

// Main sets the knobs and re-executes the test binary in a new network
// namespace holding only loopback (with a user namespace when not
// root); it returns only inside it, and exits with the child's status
// outside.
func Main() {
	for _, kv := range Knobs {
		k, v, _ := strings.Cut(kv, "=")
		envknob.Setenv(k, v)
	}
	switch os.Getenv("METNOS_TAILNET_NETNS") {
	case "":
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
			fmt.Fprintf(os.Stderr, "no network namespace for the tailnet: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "inside":
		if err := loopbackUp(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
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

// Tailnet is a control server with its DERP relay, on loopback, that a
// test can take down and bring back ([Tailnet.Outage]).
type Tailnet struct {
	*testcontrol.Server
	down  atomic.Bool
	conns *conns
}

// Outage takes the control server and DERP down (every connection to
// them is closed, and new ones are closed as they come) or, with
// down false, brings them back on the same addresses.
func (tn *Tailnet) Outage(down bool) {
	tn.down.Store(down)
	if down {
		tn.conns.closeAll()
	}
}

// Gate is h, or while the tailnet is down ([Tailnet.Outage]), a handler
// that closes the connection without a byte of answer.
func (tn *Tailnet) Gate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tn.down.Load() {
			h.ServeHTTP(w, r)
			return
		}
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	})
}

// conns are the connections a listener accepted, upgraded ones
// included (which httptest forgets).
type conns struct {
	mu sync.Mutex
	m  map[net.Conn]bool
}

func (cs *conns) closeAll() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for c := range cs.m {
		c.Close()
	}
	clear(cs.m)
}

type trackingListener struct {
	net.Listener
	cs *conns
}

func (l trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.cs.mu.Lock()
		l.cs.m[c] = true
		l.cs.mu.Unlock()
	}
	return c, err
}

// Start runs DERP (TLS), STUN and a control server on loopback.
// (testcontrol asks for the auth key at every start of a node when it
// requires one, which real control servers do not: the tests run it
// open, and check the auth key handling on the agent's side.)
func Start(t *testing.T) *Tailnet {
	netns.SetEnabled(false)
	tn := &Tailnet{conns: &conns{m: map[net.Conn]bool{}}}
	d := derpserver.New(key.NewNode(), logger.Discard)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	derp := httptest.NewUnstartedServer(tn.Gate(derpserver.Handler(d)))
	derp.Listener.Close()
	derp.Listener = trackingListener{ln, tn.conns}
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
	tn.Server = c
	c.HTTPTestServer = httptest.NewUnstartedServer(tn.Gate(c))
	c.HTTPTestServer.Listener = trackingListener{c.HTTPTestServer.Listener, tn.conns}
	c.HTTPTestServer.Start()
	t.Cleanup(c.HTTPTestServer.Close)
	return tn
}

// Node brings up a tsnet node named name on the tailnet of control,
// for the test's life (a peer that probes or serves).
func Node(t *testing.T, ctx context.Context, control, name string) *tsnet.Server {
	t.Helper()
	s := &tsnet.Server{Dir: t.TempDir(), ControlURL: control, Hostname: name, Store: new(mem.Store), Ephemeral: true,
		AuthKey: "tskey-test", UserLogf: func(string, ...any) {}, Logf: func(string, ...any) {}}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Up(ctx); err != nil {
		t.Fatalf("tailnet node %s: %v", name, err)
	}
	return s
}

// ServeNode serves h on a tsnet node named "metnos", port 8765,
// listening on the tailnet only.
func ServeNode(t *testing.T, ctx context.Context, control string, h http.Handler) {
	s := Node(t, ctx, control, "metnos")
	ln, err := s.Listen("tcp", ":8765")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
}
