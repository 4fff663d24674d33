//go:build linux

package hostile

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/sandbox/egress"
	"github.com/metnos/agent/testkit/testbin"
)

// The egress proxy of issue 14: a run whose Policy has Egress (and no
// Network) has an empty network namespace where 127.0.0.1:3128 is its
// proxy, which the agent serves from outside. These tests attack it
// from inside: around the proxy (direct sockets of every kind), through
// it (denied ports, non-public addresses, DNS rebinding, smuggled
// hosts), at it (killing what the command can see, taking its port,
// exhausting it), and check that what the manifest allows works from
// Python's own clients. Every refusal is shown allowed when the rule
// allows it, so that no test passes because nothing works at all.

// web is an HTTP or HTTPS test server on the host that counts the
// connections it accepts and answers every request with its own token.
type web struct {
	srv  *httptest.Server
	body string
	mu   sync.Mutex
	// conns counts the connections accepted since the last hits; seen
	// holds their client addresses; changed is closed at each one.
	conns   int64
	seen    map[string]bool
	changed chan struct{}
}

// startWeb starts a web on addr ("" for 127.0.0.1 on a free port); a
// nil cert with tls uses httptest's own.
func startWeb(t *testing.T, addr string, useTLS bool, cert *tls.Certificate) *web {
	t.Helper()
	w := &web{body: token("METNOS-EGRESS-BODY"), seen: map[string]bool{}, changed: make(chan struct{})}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.WriteString(rw, w.body)
	}))
	if addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listening on %s: %v", addr, err)
		}
		srv.Listener.Close()
		srv.Listener = l
	}
	// The mark connections of hits end no TLS handshake.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s != http.StateNew {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.conns++
		w.seen[c.RemoteAddr().String()] = true
		close(w.changed)
		w.changed = make(chan struct{})
	}
	if useTLS {
		if cert != nil {
			srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
		}
		srv.StartTLS()
	} else {
		srv.Start()
	}
	w.srv = srv
	t.Cleanup(srv.Close)
	return w
}

func (w *web) port() string {
	_, p, _ := net.SplitHostPort(w.srv.Listener.Addr().String())
	return p
}

func (w *web) portNum() uint16 {
	n, _ := strconv.Atoi(w.port())
	return uint16(n)
}

func (w *web) addr() string { return w.srv.Listener.Addr().String() }

// hits is the number of connections the server accepted since the last
// call, other than its own marks. It first makes a mark connection and
// waits for the server to accept it: the server accepts in order, so
// every connection that reached it before is counted by then.
func (w *web) hits(t *testing.T) int64 {
	t.Helper()
	c, err := net.Dial("tcp", w.addr())
	if err != nil {
		t.Fatalf("the mark connection to %s: %v", w.addr(), err)
	}
	defer c.Close()
	mark := c.LocalAddr().String()
	safety := time.After(10 * time.Second)
	for {
		w.mu.Lock()
		if w.seen[mark] {
			n := w.conns - 1
			w.conns = 0
			clear(w.seen)
			w.mu.Unlock()
			return n
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-safety:
			t.Fatalf("the server at %s never accepted the mark connection", w.addr())
		}
	}
}

// caFile writes the server's certificate where the sandbox may read it.
func (w *web) caFile(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "ca-"+w.port()+".pem")
	writeFile(t, p, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.srv.Certificate().Raw})), 0o644)
	return p
}

// dest is a literal Allow or Deny entry.
func dest(host string, port uint16) policy.Dest {
	return policy.Dest{Host: host, Port: port, Why: "hostile test"}
}

// egressPolicy is the supervised profile (reading ~/docs, writing
// ~/work) with its network narrowed to allow, under the default deny
// list.
func egressPolicy(allow ...policy.Dest) policyFunc {
	return func(t *testing.T, fx *fixture) policy.Policy {
		p := fx.profile(t, policy.ProfileSupervised, []string{fx.Docs}, []string{fx.Work}, false)
		p.Egress = &policy.Egress{Allow: allow, Deny: policy.DefaultDeny()}
		return p
	}
}

// lockDir, when set, is the runs' Options.LockDir: in a user namespace
// that maps this user to root, the default is root's, in /run.
var lockDir string

// standIns, when set, is the runs' Options.EgressStandIns: addresses of
// the test's own network namespace its proxy takes for public hosts.
var standIns []netip.Prefix

// runEgress runs argv in bwrap mode under pol, whose proxy resolves
// names with res (nil: the system's), and checks that the run had every
// layer, got to its script and went through a proxy.
func runEgress(t *testing.T, fx *fixture, pol policy.Policy, argv []string, res *net.Resolver) result {
	t.Helper()
	opt := testbin.SandboxOptions()
	opt.EgressResolver = res
	opt.EgressStandIns = standIns
	if lockDir != "" {
		opt.LockDir = lockDir
	}
	out, err := sandbox.Run(context.Background(), sandbox.Request{
		Argv:    argv,
		Env:     fx.env(),
		Policy:  pol,
		Limits:  sandbox.Limits{Timeout: 60 * time.Second},
		Options: opt,
	})
	r := result{where: "inside the sandbox (bwrap)", stdout: string(out.Stdout), stderr: string(out.Stderr), exit: out.ExitCode, out: out}
	if err != nil {
		t.Fatalf("sandbox.Run failed, so nothing was tried: %v\n%s", err, r)
	}
	if out.Sandbox != modeBwrap.word() {
		t.Fatalf("the run reported sandbox %q, want %q (reason: %s)", out.Sandbox, modeBwrap.word(), out.Reason)
	}
	if !strings.Contains(r.stdout, startedMark) {
		t.Fatalf("the command never started inside the sandbox:\n%s", r)
	}
	if out.Network == nil {
		t.Fatalf("a run with Egress reported no Network:\n%s", r)
	}
	return r
}

// pyRequests sends each of {{REQS}} (a JSON list of raw requests) to
// the proxy on its own connection and prints, per request, "RESP i"
// and the status and X-Proxy-Error of the answer as JSON.
const pyRequests = `
import json
reqs = json.loads({{REQS}})
for i, req in enumerate(reqs):
    out = {"status": 0}
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        s.sendall(req.encode())
        data = b""
        while b"\r\n\r\n" not in data:
            b = s.recv(4096)
            if not b:
                break
            data += b
        lines = data.partition(b"\r\n\r\n")[0].decode(errors="replace").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) > 1 and parts[1].isdigit():
            out["status"] = int(parts[1])
        for l in lines[1:]:
            k, _, v = l.partition(":")
            if k.strip().lower() == "x-proxy-error":
                out["xerr"] = v.strip()
        s.close()
    except OSError as e:
        out["error"] = str(e)
    print("RESP", i, json.dumps(out), flush=True)
`

// proxyResp is one answer pyRequests printed.
type proxyResp struct {
	Status int    `json:"status"`
	XErr   string `json:"xerr"`
	Error  string `json:"error"`
}

// request is one raw request to the proxy and what must come back.
type request struct {
	name   string
	raw    string
	status int      // the status the answer must have; 0: any refusal (4xx/5xx)
	xerr   []string // X-Proxy-Error values accepted; nil: not checked
}

func get(target, host string) string {
	return "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"
}

func connect(authority string) string {
	return "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n"
}

// send runs pyRequests for reqs under pol and checks every answer.
func send(t *testing.T, fx *fixture, pol policy.Policy, res *net.Resolver, reqs []request) result {
	t.Helper()
	var raws []string
	for _, q := range reqs {
		raws = append(raws, q.raw)
	}
	js, _ := json.Marshal(raws)
	fx.set("REQS", strconv.Quote(string(js)))
	r := runEgress(t, fx, pol, pyArgv(fx.expand(pyRequests)), res)
	got := map[int]proxyResp{}
	for _, line := range strings.Split(r.stdout, "\n") {
		var i int
		var js string
		if rest, ok := strings.CutPrefix(line, "RESP "); ok {
			n, j, _ := strings.Cut(rest, " ")
			i, _ = strconv.Atoi(n)
			js = j
			var pr proxyResp
			if err := json.Unmarshal([]byte(js), &pr); err != nil {
				t.Fatalf("the script printed %q: %v", line, err)
			}
			got[i] = pr
		}
	}
	for i, q := range reqs {
		pr, ok := got[i]
		switch {
		case !ok:
			t.Errorf("%s: no answer printed\n%s", q.name, r)
		case q.status != 0 && pr.Status != q.status:
			t.Errorf("%s: %q got status %d (X-Proxy-Error %q, error %q), want %d", q.name, firstLine(q.raw), pr.Status, pr.XErr, pr.Error, q.status)
		case q.status == 0 && pr.Status < 400:
			t.Errorf("%s: %q got status %d (error %q), want a refusal", q.name, firstLine(q.raw), pr.Status, pr.Error)
		case q.xerr != nil && !contains(q.xerr, pr.XErr):
			t.Errorf("%s: %q got X-Proxy-Error %q (status %d), want one of %q", q.name, firstLine(q.raw), pr.XErr, pr.Status, q.xerr)
		default:
			t.Logf("%s: %q -> %d %s", q.name, firstLine(q.raw), pr.Status, pr.XErr)
		}
	}
	return r
}

// pySocks makes a SOCKS5 CONNECT (no authentication) to each of
// {{SOCKS}} (a JSON list of [host, port]; an IPv4 literal goes as one,
// anything else as a domain name) on its own connection and prints,
// per request, "SOCKS i" and the reply code as JSON.
const pySocks = `
import json, struct
reqs = json.loads({{SOCKS}})
for i, (host, port) in enumerate(reqs):
    out = {"rep": -1}
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        s.sendall(b"\x05\x01\x00")
        m = s.recv(2)
        if m == b"\x05\x00":
            try:
                req = b"\x05\x01\x00\x01" + socket.inet_aton(host)
            except OSError:
                req = b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode()
            s.sendall(req + struct.pack(">H", port))
            r = s.recv(4)
            if len(r) > 1:
                out["rep"] = r[1]
        else:
            out["error"] = "method reply " + m.hex()
        s.close()
    except OSError as e:
        out["error"] = str(e)
    print("SOCKS", i, json.dumps(out), flush=True)
`

// socksReq is one SOCKS5 CONNECT and the reply code it must get.
type socksReq struct {
	name string
	host string
	port uint16
	rep  int // 0 succeeded, 2 not allowed by the ruleset
}

// socks runs pySocks for reqs under pol and checks every reply.
func socks(t *testing.T, fx *fixture, pol policy.Policy, res *net.Resolver, reqs []socksReq) result {
	t.Helper()
	var list [][]any
	for _, q := range reqs {
		list = append(list, []any{q.host, q.port})
	}
	js, _ := json.Marshal(list)
	fx.set("SOCKS", strconv.Quote(string(js)))
	r := runEgress(t, fx, pol, pyArgv(fx.expand(pySocks)), res)
	got := map[int]struct {
		Rep   int    `json:"rep"`
		Error string `json:"error"`
	}{}
	for _, line := range strings.Split(r.stdout, "\n") {
		rest, ok := strings.CutPrefix(line, "SOCKS ")
		if !ok {
			continue
		}
		n, j, _ := strings.Cut(rest, " ")
		i, _ := strconv.Atoi(n)
		v := got[i]
		if err := json.Unmarshal([]byte(j), &v); err != nil {
			t.Fatalf("the script printed %q: %v", line, err)
		}
		got[i] = v
	}
	for i, q := range reqs {
		v, ok := got[i]
		switch {
		case !ok:
			t.Errorf("SOCKS5 %s: no reply printed\n%s", q.name, r)
		case v.Rep != q.rep:
			t.Errorf("SOCKS5 %s: CONNECT %s:%d got reply %d (error %q), want %d", q.name, q.host, q.port, v.Rep, v.Error, q.rep)
		default:
			t.Logf("SOCKS5 %s: CONNECT %s:%d -> reply %d", q.name, q.host, q.port, v.Rep)
		}
	}
	return r
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\r\n"); return l }

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// wantHits checks how many connections reached w since the last check.
func wantHits(t *testing.T, w *web, what string, want int64) {
	t.Helper()
	if got := w.hits(t); got != want {
		t.Errorf("%s: the server at %s accepted %d connection(s), want %d", what, w.addr(), got, want)
	}
}

// record finds the proxy's record of a connection to host:port.
func records(out sandbox.Output, host string, port uint16) []egress.Record {
	var rs []egress.Record
	for _, c := range out.Network.Conns {
		if c.Host == host && c.Port == port {
			rs = append(rs, c)
		}
	}
	return rs
}

// TestEgressRefusedWithoutBwrap: without bubblewrap (no network
// namespace of its own) a run narrowed to named hosts is refused and
// nothing runs; the same command without the narrowing runs there, and
// with bubblewrap the narrowed one runs.
func TestEgressRefusedWithoutBwrap(t *testing.T) {
	argv := shArgv("touch {{WORK}}/ran")
	t.Run("landlock-only", func(t *testing.T) {
		modeLandlock.use(t)
		fx := newFixture(t)
		pol := egressPolicy(dest("127.0.0.1", 0))(t, fx)
		_, err := tryInside(fx, pol, fx.expandAll(argv), sandbox.Limits{})
		var re *sandbox.RefusedError
		if !errors.As(err, &re) {
			t.Fatalf("a narrowed network in landlock-only mode gave %v, want a *sandbox.RefusedError", err)
		}
		if !strings.Contains(re.Why, "network namespace") {
			t.Errorf("the refusal does not name the network namespace: %v", err)
		}
		if exists(filepath.Join(fx.Work, "ran")) {
			t.Errorf("the refused run ran its command")
		}
		pol.Egress = nil
		r := runInside(t, fx, modeLandlock, pol, fx.expandAll(argv), sandbox.Limits{})
		if !exists(filepath.Join(fx.Work, "ran")) {
			t.Fatalf("without Egress the same command did not run in landlock-only mode, so the refusal proves nothing\n%s", r)
		}
	})
	t.Run("bwrap", func(t *testing.T) {
		modeBwrap.use(t)
		fx := newFixture(t)
		runEgress(t, fx, egressPolicy(dest("127.0.0.1", 0))(t, fx), fx.expandAll(argv), nil)
		if !exists(filepath.Join(fx.Work, "ran")) {
			t.Errorf("the narrowed run did not run its command under bwrap")
		}
	})
}

// hostAddr is one of the host's own non-loopback addresses, "" if it
// has none.
func hostAddr() string {
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() && n.IP.To4() != nil {
				return n.IP.String()
			}
		}
	}
	return ""
}

// pyTCPTo is pyTCP to {{HOST}}.
var pyTCPTo = strings.Replace(pyTCP, `"127.0.0.1"`, `{{HOST}}`, 1)

// TestEgressDirect: with the network narrowed to a host, the command
// cannot reach it (or anything else) around the proxy: a direct TCP
// connection to the allowed host's address, to another loopback port,
// to the host's own non-loopback address (named in Allow too), UDP, a
// raw, packet or netlink socket. Each works outside the sandbox.
func TestEgressDirect(t *testing.T) {
	modeBwrap.use(t)
	m := modeBwrap
	fx := newFixture(t)
	allowed := listenSink(t, "tcp", "127.0.0.1:0")
	other := listenSink(t, "tcp", "127.0.0.1:0")
	udp := listenSink(t, "udp", "127.0.0.1:0")
	port := func(s *sink) uint16 { n, _ := strconv.Atoi(s.port()); return uint16(n) }
	pol := egressPolicy(dest("127.0.0.1", port(allowed)), dest("127.0.0.1", port(udp)))

	fx.set("HOST", strconv.Quote("127.0.0.1"))
	fx.set("PORT", allowed.port())
	attack(t, fx, m, attackCase{name: "tcp-to-allowed-host-port", policy: pol, py: pyTCPTo,
		landed: func(t *testing.T, fx *fixture, r result) []string { return allowed.reached(r) }})
	fx.set("PORT", other.port())
	attack(t, fx, m, attackCase{name: "tcp-to-loopback-other-port", policy: pol, py: pyTCPTo,
		landed: func(t *testing.T, fx *fixture, r result) []string { return other.reached(r) }})
	t.Run("tcp-to-host-address", func(t *testing.T) {
		a := hostAddr()
		if a == "" {
			t.Skip("the host has no non-loopback IPv4 address")
		}
		lan := listenSink(t, "tcp", net.JoinHostPort(a, "0"))
		fx.set("HOST", strconv.Quote(a))
		fx.set("PORT", lan.port())
		attack(t, fx, m, attackCase{name: a, policy: egressPolicy(dest(a, 0), dest("127.0.0.1", 0)), py: pyTCPTo,
			landed: func(t *testing.T, fx *fixture, r result) []string { return lan.reached(r) }})
	})
	fx.set("PORT", udp.port())
	attack(t, fx, m, attackCase{name: "udp-sendto-allowed-host-port", policy: pol, py: pyUDP,
		landed: func(t *testing.T, fx *fixture, r result) []string { return udp.reached(r) }})
	attack(t, fx, m, attackCase{name: "raw-socket", policy: pol, py: `
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
print("METNOS-RAW-SOCKET-MADE")
`, secrets: []string{"METNOS-RAW-SOCKET-MADE"}, outsideFails: ifNotRoot("a raw socket needs CAP_NET_RAW")})
	attack(t, fx, m, attackCase{name: "packet-socket", policy: pol, py: `
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
print("METNOS-PACKET-SOCKET-MADE")
`, secrets: []string{"METNOS-PACKET-SOCKET-MADE"}, outsideFails: ifNotRoot("AF_PACKET needs CAP_NET_RAW")})
	attack(t, fx, m, attackCase{name: "netlink-route-socket", policy: pol, py: `
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
print("METNOS-NETLINK-SOCKET-MADE")
`, secrets: []string{"METNOS-NETLINK-SOCKET-MADE"}})
	us := listenNetlink(t, 2) // NETLINK_USERSOCK
	fx.set("NLPROTO", "2")
	fx.set("NLPID", strconv.FormatUint(uint64(us.pid), 10))
	attack(t, fx, m, attackCase{name: "netlink-usersock-to-host-process", policy: pol, py: pyNetlinkTo,
		landed: func(t *testing.T, fx *fixture, r result) []string { return us.reached(r) }})
}

// TestEgressDenyPort: a CONNECT to an allowed host on port 25 is
// refused by the default deny list, while the same rule lets the same
// host through on another port; as root, with a server on 127.0.0.1:25,
// the same CONNECT without the deny list reaches it.
func TestEgressDenyPort(t *testing.T) {
	modeBwrap.use(t)
	fx := newFixture(t)
	ok := startWeb(t, "", false, nil)
	pol := egressPolicy(dest("127.0.0.1", 0))(t, fx)
	r := send(t, fx, pol, nil, []request{
		{name: "port 25 of an allowed host", raw: connect("127.0.0.1:25"), status: 403, xerr: []string{"blocked-by-denylist"}},
		{name: "port 465", raw: connect("127.0.0.1:465"), status: 403, xerr: []string{"blocked-by-denylist"}},
		{name: "another port of the same host", raw: connect(ok.addr()), status: 200},
	})
	wantHits(t, ok, "the allowed CONNECT", 1)
	if r.out.Network.Refused < 2 || r.out.Network.FirstRefused != "127.0.0.1:25" {
		t.Errorf("the report says %d refused, first %q; want at least 2, first 127.0.0.1:25", r.out.Network.Refused, r.out.Network.FirstRefused)
	}

	if !isRoot() {
		t.Log("not root: no server on port 25 to show the CONNECT reaching it without the deny list")
		return
	}
	l, err := net.Listen("tcp", "127.0.0.1:25")
	if err != nil {
		t.Logf("no server on 127.0.0.1:25 to show the CONNECT reaching it without the deny list: %v", err)
		return
	}
	l.Close()
	smtp := startWeb(t, "127.0.0.1:25", false, nil)
	noDeny := pol
	noDeny.Egress = &policy.Egress{Allow: pol.Egress.Allow}
	send(t, fx, noDeny, nil, []request{{name: "port 25 without the deny list", raw: connect("127.0.0.1:25"), status: 200}})
	wantHits(t, smtp, "port 25 without the deny list", 1)
	send(t, fx, pol, nil, []request{{name: "port 25 with the deny list", raw: connect("127.0.0.1:25"), status: 403, xerr: []string{"blocked-by-denylist"}}})
	wantHits(t, smtp, "port 25 with the deny list", 0)
}

// blockedLiteral is what a refused non-public IP literal may say: the
// proxy may refuse it by the allow list (a wildcard matches names and
// public addresses only) or by its address.
var blockedLiteral = []string{"blocked-by-allowlist", "blocked-by-address"}

// TestEgressWildcardNonPublic: Allow "*" does not reach the loopback,
// by literal or by a name that resolves there; the loopback server sees
// nothing. Named literally, it is reached. (The metadata and private
// addresses are TestEgressPublicHost's, in a network namespace of its
// own: here a proxy that failed would dial them on the host's network.)
func TestEgressWildcardNonPublic(t *testing.T) {
	modeBwrap.use(t)
	fx := newFixture(t)
	sink := startWeb(t, "", false, nil)
	dns := startDNS(t, map[string]string{"loop.test": "127.0.0.1"})
	p := sink.port()
	r := send(t, fx, egressPolicy(dest("*", 0))(t, fx), dns.resolver(), []request{
		{name: "127.0.0.1", raw: get("http://127.0.0.1:"+p+"/", "127.0.0.1:"+p), status: 403, xerr: blockedLiteral},
		{name: "127.0.0.1, CONNECT", raw: connect("127.0.0.1:" + p), status: 403, xerr: blockedLiteral},
		{name: "name -> 127.0.0.1", raw: get("http://loop.test:"+p+"/", "loop.test:"+p), status: 403, xerr: []string{"blocked-by-address"}},
		{name: "name -> 127.0.0.1, CONNECT", raw: connect("loop.test:" + p), status: 403, xerr: []string{"blocked-by-address"}},
	})
	wantHits(t, sink, "Allow * to loopback", 0)
	if !dns.wasAsked("loop.test") {
		t.Errorf("the proxy never asked the test's DNS server for loop.test")
	}
	for _, c := range r.out.Network.Conns {
		if c.Verdict != "refused" {
			t.Errorf("the report has a connection that was not refused: %+v", c)
		}
	}
	if r.out.Network.Refused != 4 {
		t.Errorf("the report counts %d refused connections, want 4: %+v", r.out.Network.Refused, r.out.Network.Conns)
	}

	// Named literally, the loopback server is reached, by GET and CONNECT.
	send(t, fx, egressPolicy(dest("127.0.0.1", sink.portNum()))(t, fx), dns.resolver(), []request{
		{name: "127.0.0.1 allowed literally", raw: get("http://127.0.0.1:"+p+"/", "127.0.0.1:"+p), status: 200},
		{name: "127.0.0.1 allowed literally, CONNECT", raw: connect("127.0.0.1:" + p), status: 200},
	})
	wantHits(t, sink, "Allow 127.0.0.1:"+p, 2)

	// The same by SOCKS5 (ALL_PROXY).
	socks(t, fx, egressPolicy(dest("*", 0))(t, fx), dns.resolver(), []socksReq{
		{name: "127.0.0.1 under *", host: "127.0.0.1", port: sink.portNum(), rep: 2},
		{name: "name -> 127.0.0.1 under *", host: "loop.test", port: sink.portNum(), rep: 2},
	})
	wantHits(t, sink, "SOCKS5 under Allow *", 0)
	socks(t, fx, egressPolicy(dest("127.0.0.1", sink.portNum()))(t, fx), dns.resolver(), []socksReq{
		{name: "127.0.0.1 allowed literally", host: "127.0.0.1", port: sink.portNum(), rep: 0},
	})
	wantHits(t, sink, "SOCKS5 to the literal 127.0.0.1:"+p, 1)
}

// TestEgressRebinding: an allowed name whose DNS answer is 127.0.0.1 is
// refused, even with 127.0.0.1 on that port allowed literally, and the
// server there sees nothing; the same name, resolved with the same DNS
// server outside the sandbox, does lead to it.
func TestEgressRebinding(t *testing.T) {
	modeBwrap.use(t)
	fx := newFixture(t)
	sink := startWeb(t, "", false, nil)
	dns := startDNS(t, map[string]string{"allowed.test": "127.0.0.1"})
	p := sink.port()

	// Outside: the name leads to the server.
	addrs, err := dns.resolver().LookupHost(context.Background(), "allowed.test")
	if err != nil || len(addrs) == 0 {
		t.Fatalf("the test's DNS server does not resolve allowed.test: %v %v", addrs, err)
	}
	c, err := net.Dial("tcp", net.JoinHostPort(addrs[0], p))
	if err != nil {
		t.Fatalf("allowed.test (%s) port %s is not reachable outside the sandbox, so this test proves nothing: %v", addrs[0], p, err)
	}
	c.Close()
	wantHits(t, sink, "outside, allowed.test", 1)

	pol := egressPolicy(dest("allowed.test", 0), dest("127.0.0.1", sink.portNum()))(t, fx)
	r := send(t, fx, pol, dns.resolver(), []request{
		{name: "allowed.test -> 127.0.0.1", raw: get("http://allowed.test:"+p+"/", "allowed.test:"+p), status: 403, xerr: []string{"blocked-by-address"}},
		{name: "allowed.test -> 127.0.0.1, CONNECT", raw: connect("allowed.test:" + p), status: 403, xerr: []string{"blocked-by-address"}},
		{name: "127.0.0.1 named literally", raw: get("http://127.0.0.1:"+p+"/", "127.0.0.1:"+p), status: 200},
	})
	wantHits(t, sink, "allowed.test rebinding to 127.0.0.1 (and the literal)", 1)
	if !dns.wasAsked("allowed.test") {
		t.Errorf("the proxy never asked the test's DNS server for allowed.test")
	}
	socks(t, fx, pol, dns.resolver(), []socksReq{
		{name: "allowed.test -> 127.0.0.1", host: "allowed.test", port: sink.portNum(), rep: 2},
		{name: "127.0.0.1 named literally", host: "127.0.0.1", port: sink.portNum(), rep: 0},
	})
	wantHits(t, sink, "SOCKS5 allowed.test rebinding to 127.0.0.1 (and the literal)", 1)
	for _, rec := range records(r.out, "allowed.test", sink.portNum()) {
		if rec.Verdict != "refused" || !strings.Contains(rec.Addr, "127.0.0.1") {
			t.Errorf("the record of allowed.test is %+v, want refused naming the address 127.0.0.1", rec)
		}
	}
}

// TestEgressSmuggling: requests that name an allowed host in one place
// and another in another reach neither; the plain requests to the
// allowed host in the same run do.
func TestEgressSmuggling(t *testing.T) {
	modeBwrap.use(t)
	fx := newFixture(t)
	ok := startWeb(t, "", false, nil)
	evil := startWeb(t, "", false, nil)
	dns := startDNS(t, map[string]string{"allowed.test": "127.0.0.1", "evil.test": "127.0.0.1"})
	a, e := ok.addr(), evil.addr()
	pol := egressPolicy(dest("127.0.0.1", ok.portNum()), dest("allowed.test", 443))(t, fx)
	send(t, fx, pol, dns.resolver(), []request{
		{name: "absolute URI allowed, Host header another", raw: get("http://"+a+"/", "evil.test"), status: 400},
		{name: "absolute URI allowed, Host header the evil server", raw: get("http://"+a+"/", e), status: 400},
		{name: "absolute URI another, Host header allowed", raw: get("http://"+e+"/", a)},
		{name: "CONNECT allowed@evil", raw: connect(a + "@" + e), status: 400},
		{name: "CONNECT allowed.test:443@evil.test", raw: connect("allowed.test:443@evil.test"), status: 400},
		{name: "CONNECT with userinfo", raw: connect("user:pw@" + a), status: 400},
		{name: "absolute URI with the allowed host as userinfo", raw: get("http://"+a+"@"+e+"/", e)},
		{name: "plain GET to the allowed host", raw: get("http://"+a+"/", a), status: 200},
		{name: "plain CONNECT to the allowed host", raw: connect(a), status: 200},
	})
	wantHits(t, ok, "the allowed server (the two plain requests only)", 2)
	wantHits(t, evil, "the other server", 0)
}

// pyRelay attacks the proxy's end inside the run between two requests
// through it: it kills every process it can see, binds the proxy's
// port and another, and connects to the proxy again.
const pyRelay = `
import json, signal, urllib.request
def fetch(tag):
    try:
        print(tag, urllib.request.urlopen({{URL}}, timeout=20).read().decode(), flush=True)
    except Exception as e:
        print(tag, "ERROR", e, flush=True)
if {{KILL}}:
    fetch("FETCH1")
    tried = []
    try:
        os.kill(-1, signal.SIGKILL)
        tried.append("-1")
    except OSError as e:
        tried.append("-1: %s" % e)
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                os.kill(int(d), signal.SIGKILL)
                tried.append(d)
            except OSError as e:
                tried.append("%s: %s" % (d, e))
    print("KILLED", json.dumps(tried), flush=True)
for name, port in (("BIND3128", 3128), ("BINDOTHER", 0)):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        s.listen(8)
        print(name, "LISTENING", s.getsockname()[1], flush=True)
        s.close()
    except OSError as e:
        print(name, "ERROR", e, flush=True)
if {{KILL}}:
    fetch("FETCH2")
`

// TestEgressRelay: the command kills every process it sees and tries to
// take the proxy's port and listen on another; the proxy still serves
// its next request, and the command listens on nothing. Outside the
// sandbox the same binds listen.
func TestEgressRelay(t *testing.T) {
	modeBwrap.use(t)
	fx := newFixture(t)
	srv := startWeb(t, "", false, nil)
	fx.set("URL", strconv.Quote("http://"+srv.addr()+"/"))

	fx.set("KILL", "False")
	out := runOutside(t, fx, pyArgv(fx.expand(pyRelay)), 0)
	if !strings.Contains(out.stdout, "BINDOTHER LISTENING") {
		t.Fatalf("outside the sandbox the script cannot listen on a port, so this test proves nothing\n%s", out)
	}
	if !strings.Contains(out.stdout, "BIND3128 LISTENING") {
		t.Logf("outside the sandbox 127.0.0.1:3128 is taken here: %s", out.stdout)
	}

	fx.set("KILL", "True")
	r := runEgress(t, fx, egressPolicy(dest("127.0.0.1", srv.portNum()))(t, fx), pyArgv(fx.expand(pyRelay)), nil)
	want := "FETCH1 " + srv.body
	if !strings.Contains(r.stdout, want) {
		t.Fatalf("the first request through the proxy failed, so the attack proves nothing\n%s", r)
	}
	if !strings.Contains(r.stdout, "KILLED ") {
		t.Fatalf("the script never got to the kill\n%s", r)
	}
	t.Logf("kill attempts: %s; %s; %s", lineOf(r.stdout, "KILLED "), lineOf(r.stdout, "BIND3128"), lineOf(r.stdout, "BINDOTHER"))
	if !strings.Contains(r.stdout, "FETCH2 "+srv.body) {
		t.Errorf("after the kill and the binds the proxy no longer served the run (%s)\n%s", lineOf(r.stdout, "FETCH2"), r)
	}
	for _, b := range []string{"BIND3128", "BINDOTHER"} {
		if strings.Contains(r.stdout, b+" LISTENING") {
			t.Errorf("the command listened inside the sandbox: %s", lineOf(r.stdout, b))
		}
	}
	wantHits(t, srv, "the two requests", 2)
}

func lineOf(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return "(no line " + prefix + ")"
}

// pyHold opens {{N}} connections to the proxy, each with a request
// begun and never ended, writes how many it holds to {{WORK}}/holding,
// makes one more request of its own, and holds them all until
// {{WORK}}/release appears.
const pyHold = `
import urllib.request, urllib.error
conns = []
for i in range({{N}}):
    try:
        c = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        c.sendall(b"GET http://")
        conns.append(c)
    except OSError as e:
        print("CONNFAIL", e, flush=True)
        break
try:
    print("EXTRA", urllib.request.urlopen({{URL}}, timeout=20).status, flush=True)
except urllib.error.HTTPError as e:
    print("EXTRA", e.code, flush=True)
except Exception as e:
    print("EXTRA ERROR", e, flush=True)
with open("{{WORK}}/holding.tmp", "w") as f:
    f.write(str(len(conns)))
os.rename("{{WORK}}/holding.tmp", "{{WORK}}/holding")
for i in range(600):
    if os.path.exists("{{WORK}}/release"):
        break
    time.sleep(0.1)
print("HELD", len(conns), flush=True)
`

// TestEgressExhaustion: one run holds more connections to its proxy
// than the proxy takes (its own next request is refused), while a
// second run at the same time gets its allowed request through.
func TestEgressExhaustion(t *testing.T) {
	modeBwrap.use(t)
	srv := startWeb(t, "", false, nil)
	url := strconv.Quote("http://" + srv.addr() + "/")
	pol := egressPolicy(dest("127.0.0.1", srv.portNum()))

	holder := newFixture(t)
	holder.set("N", "100")
	holder.set("URL", url)
	holderPol := pol(t, holder)
	held := make(chan result, 1)
	go func() {
		// runEgress may not call t.Fatal off the test's goroutine.
		opt := testbin.SandboxOptions()
		out, err := sandbox.Run(context.Background(), sandbox.Request{
			Argv: pyArgv(holder.expand(pyHold)), Env: holder.env(), Policy: holderPol,
			Limits: sandbox.Limits{Timeout: 90 * time.Second}, Options: opt,
		})
		r := result{where: "the holding run", stdout: string(out.Stdout), stderr: string(out.Stderr), exit: out.ExitCode, out: out}
		if err != nil {
			r.stderr += "\nsandbox.Run: " + err.Error()
		}
		held <- r
	}()
	release := func() { writeFile(t, filepath.Join(holder.Work, "release"), "", 0o644) }
	defer release()

	var a result
	holding := filepath.Join(holder.Work, "holding")
wait:
	for deadline := time.Now().Add(60 * time.Second); !exists(holding); { // a safety net
		select {
		case a = <-held:
			t.Fatalf("the holding run ended before it held its connections\n%s", a)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			break wait
		}
	}
	if !exists(holding) {
		t.Fatal("the holding run never held its connections")
	}

	other := newFixture(t)
	other.set("URL", url)
	r := runEgress(t, other, pol(t, other), pyArgv(other.expand(`
import urllib.request
print("FETCH", urllib.request.urlopen({{URL}}, timeout=20).read().decode(), flush=True)
`)), nil)
	release()
	a = <-held

	if !strings.Contains(a.stdout, "HELD 100") {
		t.Fatalf("the holding run did not hold 100 connections\n%s", a)
	}
	if !strings.Contains(a.stdout, "EXTRA 503") {
		t.Errorf("with 100 connections held, the holding run's own request was not refused (%s): the proxy was not exhausted, so this test proves nothing\n%s", lineOf(a.stdout, "EXTRA"), a)
	}
	if a.out.Network == nil || a.out.Network.Refused == 0 {
		t.Errorf("the holding run's report counts no refusal: %+v", a.out.Network)
	}
	if !strings.Contains(r.stdout, "FETCH "+srv.body) {
		t.Errorf("while another run exhausted its proxy, this run's allowed request failed\n%s", r)
	}
}

// pyClients fetches from the HTTP server {{HTTP}} and the HTTPS server
// {{HTTPS}} (whose CA is {{CA}}) through the proxy with urllib and with
// http.client.
const pyClients = `
import http.client, ssl, urllib.request
ctx = ssl.create_default_context(cafile={{CA}})
def run(tag, f):
    try:
        print(tag, f(), flush=True)
    except Exception as e:
        print(tag, "ERROR", repr(e), flush=True)
def hc_http():
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=20)
    c.request("GET", "http://%s/hc" % {{HTTP}})
    return c.getresponse().read().decode()
def hc_https():
    host, port = {{HTTPS}}.rsplit(":", 1)
    c = http.client.HTTPSConnection("127.0.0.1", 3128, timeout=20, context=ctx)
    c.set_tunnel(host, int(port))
    c.request("GET", "/hc")
    return c.getresponse().read().decode()
run("URLLIB-HTTP", lambda: urllib.request.urlopen("http://%s/u" % {{HTTP}}, timeout=20).read().decode())
run("URLLIB-HTTPS", lambda: urllib.request.urlopen("https://%s/u" % {{HTTPS}}, timeout=20, context=ctx).read().decode())
run("HTTPCLIENT-HTTP", hc_http)
run("HTTPCLIENT-HTTPS", hc_https)
`

// TestEgressPythonClients: Python's urllib and http.client reach an
// allowed loopback server through the proxy, over HTTP and over HTTPS
// by CONNECT, and the run's report lists each connection with its bytes.
func TestEgressPythonClients(t *testing.T) {
	modeBwrap.use(t)
	fx := newFixture(t)
	plain := startWeb(t, "", false, nil)
	secure := startWeb(t, "", true, nil)
	fx.set("HTTP", strconv.Quote(plain.addr()))
	fx.set("HTTPS", strconv.Quote(secure.addr()))
	fx.set("CA", strconv.Quote(secure.caFile(t, fx.Docs)))
	r := runEgress(t, fx, egressPolicy(dest("127.0.0.1", plain.portNum()), dest("127.0.0.1", secure.portNum()))(t, fx),
		pyArgv(fx.expand(pyClients)), nil)
	for tag, body := range map[string]string{
		"URLLIB-HTTP": plain.body, "URLLIB-HTTPS": secure.body,
		"HTTPCLIENT-HTTP": plain.body, "HTTPCLIENT-HTTPS": secure.body,
	} {
		if !strings.Contains(r.stdout, tag+" "+body) {
			t.Errorf("%s did not get the server's body: %s", tag, lineOf(r.stdout, tag))
		}
	}
	wantHits(t, plain, "the HTTP server", 2)
	wantHits(t, secure, "the HTTPS server", 2)
	for _, s := range []struct {
		w     *web
		proto string
	}{{plain, "http"}, {secure, "connect"}} {
		rs := records(r.out, "127.0.0.1", s.w.portNum())
		if len(rs) != 2 {
			t.Errorf("the report has %d records of 127.0.0.1:%s, want 2: %+v", len(rs), s.w.port(), r.out.Network.Conns)
		}
		for _, rec := range rs {
			if rec.Verdict != "allowed" || rec.Proto != s.proto || rec.Up <= 0 || rec.Down <= 0 || rec.Addr == "" {
				t.Errorf("record %+v: want verdict allowed, proto %s, bytes both ways, an address", rec, s.proto)
			}
		}
	}
	if r.out.Network.Refused != 0 {
		t.Errorf("the report counts %d refusals (first %s), want none", r.out.Network.Refused, r.out.Network.FirstRefused)
	}
}

// netnsChild marks the test binary re-executed by TestEgressPublicHost
// in a network namespace of its own.
const netnsChild = "METNOS_HOSTILE_EGRESS_NETNS"

// netnsBwrap passes the child the bwrap the parent's probe found.
const netnsBwrap = "METNOS_HOSTILE_EGRESS_BWRAP"

// TestEgressPublicHost: with Allow "*" (a manifest's https://*), a name
// that resolves to a public address is reached over HTTPS, while names
// that resolve to loopback, metadata or private addresses are refused
// and their servers see nothing; named literally, those servers are
// reached. It runs in a network namespace it creates, where the
// documentation address 192.0.2.10 (public to the proxy), 169.254.169.254
// and 10.0.0.1 are on the loopback: no real outside address is touched.
func TestEgressPublicHost(t *testing.T) {
	if os.Getenv(netnsChild) == "" {
		modeBwrap.use(t)
		reexecInNetns(t, "^TestEgressPublicHost$")
		return
	}
	for _, a := range []string{"192.0.2.10/32", "169.254.169.254/32", "10.0.0.1/32"} {
		if out, err := exec.Command("ip", "addr", "add", a, "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s dev lo: %v %s", a, err, out)
		}
	}
	// The bwrap the parent's probe found root-owned: in a user namespace
	// that maps this user to root, the host's root is unmapped, its files
	// are owned by the overflow uid, and the probe would refuse every
	// bwrap on PATH; naming it is what an owner's configuration does.
	t.Setenv("METNOS_SANDBOX", "")
	t.Setenv("METNOS_BWRAP", os.Getenv(netnsBwrap))
	requireSandbox(t, true)
	lockDir = filepath.Join(t.TempDir(), "locks")
	mkdir(t, lockDir, 0o700)
	defer func() { lockDir = "" }()
	fx := newFixture(t)
	cert, ca := selfSigned(t, "public.test")
	// 192.0.2.10 is on this namespace's loopback: this device's own
	// address, which a wildcard never reaches, but for the stand-in.
	standIns = []netip.Prefix{netip.MustParsePrefix("192.0.2.10/32")}
	defer func() { standIns = nil }()
	pub := startWeb(t, "192.0.2.10:0", true, cert)
	loop := startWeb(t, "127.0.0.1:0", false, nil)
	meta := startWeb(t, "169.254.169.254:0", false, nil)
	priv := startWeb(t, "10.0.0.1:0", false, nil)
	dns := startDNS(t, map[string]string{
		"public.test":  "192.0.2.10",
		"allowed.test": "127.0.0.1",
		"meta.test":    "169.254.169.254",
		"priv.test":    "10.0.0.1",
	})
	caPath := filepath.Join(fx.Docs, "public-ca.pem")
	writeFile(t, caPath, string(ca), 0o644)
	fx.set("CA", strconv.Quote(caPath))
	fx.set("URL", strconv.Quote("https://public.test:"+pub.port()+"/"))
	r := runEgress(t, fx, egressPolicy(dest("*", 0))(t, fx), pyArgv(fx.expand(`
import ssl, urllib.request
ctx = ssl.create_default_context(cafile={{CA}})
try:
    print("PUBLIC", urllib.request.urlopen({{URL}}, timeout=20, context=ctx).read().decode(), flush=True)
except Exception as e:
    print("PUBLIC ERROR", repr(e), flush=True)
`)), dns.resolver())
	if !strings.Contains(r.stdout, "PUBLIC "+pub.body) {
		t.Errorf("Allow * did not reach https://public.test (192.0.2.10): %s\n%s", lineOf(r.stdout, "PUBLIC"), r)
	}
	wantHits(t, pub, "public.test", 1)
	if rs := records(r.out, "public.test", pub.portNum()); len(rs) != 1 || rs[0].Verdict != "allowed" || !strings.Contains(rs[0].Addr, "192.0.2.10") {
		t.Errorf("the report's records of public.test are %+v, want one allowed to 192.0.2.10", rs)
	}

	send(t, fx, egressPolicy(dest("*", 0))(t, fx), dns.resolver(), []request{
		{name: "allowed.test -> 127.0.0.1", raw: connect("allowed.test:" + loop.port()), status: 403, xerr: []string{"blocked-by-address"}},
		{name: "meta.test -> 169.254.169.254", raw: connect("meta.test:" + meta.port()), status: 403, xerr: []string{"blocked-by-address"}},
		{name: "priv.test -> 10.0.0.1", raw: connect("priv.test:" + priv.port()), status: 403, xerr: []string{"blocked-by-address"}},
		{name: "169.254.169.254", raw: connect(meta.addr()), status: 403, xerr: blockedLiteral},
		{name: "10.0.0.1", raw: connect(priv.addr()), status: 403, xerr: blockedLiteral},
		{name: "public.test", raw: connect("public.test:" + pub.port()), status: 200},
	})
	for _, w := range []*web{loop, meta, priv} {
		wantHits(t, w, "Allow * to "+w.addr(), 0)
	}
	wantHits(t, pub, "Allow * to public.test", 1)

	// Not stood in for a public host, the same address is this device's
	// own: a wildcard does not reach it.
	standIns = nil
	send(t, fx, egressPolicy(dest("*", 0))(t, fx), dns.resolver(), []request{
		{name: "public.test, this device's own address", raw: connect("public.test:" + pub.port()), status: 403, xerr: []string{"blocked-by-address"}},
	})
	wantHits(t, pub, "Allow * to this device's own address", 0)

	// Named literally, each is reached.
	send(t, fx, egressPolicy(dest("127.0.0.1", loop.portNum()), dest("169.254.169.254", meta.portNum()), dest("10.0.0.1", priv.portNum()))(t, fx), dns.resolver(), []request{
		{name: "127.0.0.1 literally", raw: connect(loop.addr()), status: 200},
		{name: "169.254.169.254 literally", raw: connect(meta.addr()), status: 200},
		{name: "10.0.0.1 literally", raw: connect(priv.addr()), status: 200},
	})
	for _, w := range []*web{loop, meta, priv} {
		wantHits(t, w, "the literal "+w.addr(), 1)
	}
}

// reexecInNetns runs the tests matching run of this binary again in a
// network namespace of their own (with its loopback up): as root with
// unshare --net, otherwise in a user namespace that maps this user to
// root (unshare --net --map-root-user). The child's skip is this test's
// skip, its failure this test's failure.
func reexecInNetns(t *testing.T, run string) {
	t.Helper()
	un := []string{"unshare", "--net"}
	if !isRoot() {
		un = append(un, "--map-root-user")
	}
	argv := append(un, "sh", "-c", `ip link set lo up && exec "$@"`, "sh", os.Args[0], "-test.run", run, "-test.v", "-test.count=1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	bw := sandbox.Probe(testbin.SandboxOptions()).Bwrap
	if bw == "" {
		t.Fatal("the probe found bwrap usable but names none")
	}
	cmd.Env = append(os.Environ(), netnsChild+"=1", netnsBwrap+"="+bw)
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace of its own (%s):\n%s", strings.Join(un, " "), out)
	if strings.Contains(string(out), "unshare: ") {
		msg := fmt.Sprintf("cannot make a network namespace here: %s", lineOf(string(out), "unshare: "))
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if err != nil {
		t.Fatalf("the run in a network namespace failed: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: ") {
		t.Skip("the run in a network namespace skipped (see its output above)")
	}
}

// selfSigned is a certificate for name and its PEM, which is its own CA.
func selfSigned(t *testing.T, name string) (*tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		DNSNames:              []string{name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
