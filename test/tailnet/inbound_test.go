//go:build linux

package tailnet

import (
	"bufio"
	"context"
	"fmt"
	"hash/crc32"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tailscale.com/tailcfg"

	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/testkit/tailnettest"
)

// TestNoInboundOnTailnet: no peer of the tailnet can open a connection
// to the agent. A second node tries TCP to every port the agent's node
// advertises (its Hostinfo services: the peer API's), to port 1 (where
// the peer API answers when it may not listen(2)) and to the port the
// peer API would have chosen, on each of the agent's tailnet addresses:
// all fail. The same peer does reach the server's node, so a failure
// here is the agent refusing, not a broken tailnet. What control saw
// advertised is exactly the peer API's three services, as package
// tailnet's doc says (tailscale offers no way to drop them): a
// tailscale.com that adds one, or lets them go, fails here, so that
// the doc is looked at again.
func TestNoInboundOnTailnet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, refserver.Config{PollCheck: 20 * time.Millisecond}, 0o600)
	tok, _ := w.srv.IssueToken("laptop", 10*time.Minute)
	if code, out := w.cli("register", "--server", "http://metnos:8765", "--token", tok, "--tailnet-control-url", w.control, "--tailnet-authkey-file", w.keyFile, "--name", "laptop"); code != 0 {
		t.Fatalf("register over the tailnet: exit %d\n%s", code, out)
	}
	cmd := exec.Command(filepath.Join(binDir, "metnos-agent"), "run")
	cmd.Env = w.env
	logf, _ := os.Create(filepath.Join(w.home, "run.log"))
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	// The agent is up and served an invocation over the tailnet.
	id, _ := w.srv.Enqueue(w.srv.Devices()[0].ID, "echo_args", map[string]any{}, refserver.EnqueueOptions{})
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	info, err := w.srv.Wait(wctx, id)
	wcancel()
	if err != nil || info.State != "done" {
		b, _ := os.ReadFile(logf.Name())
		t.Fatalf("the agent did not serve over the tailnet: %v %s\n%s", err, info.ResultBody, b)
	}

	// The agent's node, once it has told control its services.
	var agentNode, serverNode *tailcfg.Node
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		for _, n := range w.tc.AllNodes() {
			switch n.Hostinfo.Hostname() {
			case "laptop":
				agentNode = n
			case "metnos":
				serverNode = n
			}
		}
		if agentNode != nil && agentNode.Hostinfo.Services().Len() > 1 {
			break
		}
	}
	if agentNode == nil || serverNode == nil || len(agentNode.Addresses) == 0 || len(serverNode.Addresses) == 0 {
		t.Fatalf("control does not know both nodes with addresses: agent %v, server %v", agentNode, serverNode)
	}
	var protos []string
	for _, s := range agentNode.Hostinfo.Services().All() {
		protos = append(protos, string(s.Proto))
	}
	sort.Strings(protos)
	if got, want := strings.Join(protos, " "), "peerapi-dns-proxy peerapi4 peerapi6"; got != want {
		t.Errorf("the agent's node advertises the services %q, want %q (and package tailnet's doc to say so): %v", got, want, agentNode.Hostinfo.Services().AsSlice())
	}
	ports := map[int][]string{1: {"port 1, the peer API's without listen(2)"}}
	for _, s := range agentNode.Hostinfo.Services().All() {
		ports[int(s.Port)] = append(ports[int(s.Port)], "advertised "+string(s.Proto))
	}
	for _, a := range agentNode.Addresses {
		// The port the peer API picks first (ipnlocal's peerAPIServer.listen).
		a16 := a.Addr().As16()
		p := int(32<<10 | uint16(crc32.ChecksumIEEE(a16[len(a16)-3:])))
		ports[p] = append(ports[p], "the peer API's own port")
	}

	prober := tailnettest.Node(t, ctx, w.control, "prober")
	dial := func(addr string) (net.Conn, error) {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		return prober.Dial(dctx, "tcp", addr)
	}
	// The peer reaches a node that serves: the probes below can succeed.
	serverAddr := net.JoinHostPort(serverNode.Addresses[0].Addr().String(), "8765")
	c, err := dial(serverAddr)
	if err != nil {
		t.Fatalf("the probing peer cannot reach the server's node at %s: %v", serverAddr, err)
	}
	c.Close()

	var (
		mu      sync.Mutex
		reached []string
		wg      sync.WaitGroup
	)
	for _, a := range agentNode.Addresses {
		for port, what := range ports {
			addr := net.JoinHostPort(a.Addr().String(), strconv.Itoa(port))
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := dial(addr)
				if err != nil {
					return
				}
				defer c.Close()
				got := "accepted the connection"
				c.SetDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", addr)
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					got = "answered HTTP " + resp.Status
				}
				mu.Lock()
				reached = append(reached, fmt.Sprintf("%s (%s): %s", addr, strings.Join(what, ", "), got))
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	sort.Strings(reached)
	if len(reached) > 0 {
		t.Errorf("a tailnet peer connected to the agent (services advertised: %v):\n%s", agentNode.Hostinfo.Services().AsSlice(), strings.Join(reached, "\n"))
	}
}
