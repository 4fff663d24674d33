package egress

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/metnos/agent/policy"
)

// server is a loopback HTTP test server that counts the connections it
// accepts: a refusal test proves with it that no connection reached it.
type server struct {
	*httptest.Server
	conns atomic.Int64
	mu    sync.Mutex
	reqs  []*http.Request
}

func newServer(t *testing.T, tlsToo bool) *server {
	t.Helper()
	s := &server{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, "hello from "+r.Host+" "+r.RequestURI+" body="+string(body))
	})
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	if tlsToo {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// hostPort returns the server's 127.0.0.1 address and port.
func (s *server) addrPort() netip.AddrPort {
	return netip.MustParseAddrPort(s.Listener.Addr().String())
}

func (s *server) port() uint16 { return s.addrPort().Port() }

func (s *server) lastRequest() *http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		return nil
	}
	return s.reqs[len(s.reqs)-1]
}

// start runs a Proxy for rules on a loopback listener until the test ends.
func start(t *testing.T, rules policy.Egress, opt Options) (*Proxy, string) {
	t.Helper()
	if opt.StandIns == nil {
		// The tests' stand-in public hosts are documentation addresses,
		// which may be this machine's own network (a test machine's
		// LAN often is).
		opt.StandIns = docRanges
	}
	p := New(rules, opt)
	return p, serve(t, p)
}

// docRanges are the documentation ranges.
var docRanges = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32"),
}

// serve runs p on a loopback listener until the test ends.
func serve(t *testing.T, p *Proxy) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(l) }()
	t.Cleanup(func() {
		p.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return l.Addr().String()
}

// dials records every address the proxy dials and sends each to target
// (a loopback test server), so that a test can use addresses it cannot
// listen on (169.254.169.254, documentation ranges) and see whether the
// proxy tried them.
type dials struct {
	mu     sync.Mutex
	addrs  []string
	target string
}

func (d *dials) hook(p *Proxy, target string) {
	d.target = target
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.mu.Lock()
		d.addrs = append(d.addrs, addr)
		d.mu.Unlock()
		var nd net.Dialer
		return nd.DialContext(ctx, network, d.target)
	}
}

func (d *dials) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.addrs...)
}

// client returns an HTTP client using proxyAddr for http and https,
// trusting the TLS test servers' certificate.
func client(proxyAddr string, tlsSrv *server) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr}), DisableKeepAlives: true}
	if tlsSrv != nil {
		tr.TLSClientConfig = tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	}
	return &http.Client{Transport: tr}
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", u, err)
	}
	return resp, string(b)
}

// raw sends req as written on a new connection to the proxy and returns
// the response head's status line, X-Proxy-Error and body.
func raw(t *testing.T, proxyAddr, req string) (status int, xerr, body string) {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the proxy's answer to %q: %v", req, err)
	}
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(req, "CONNECT") {
		return resp.StatusCode, "", ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Proxy-Error"), string(b)
}

func lit(s *server) policy.Dest {
	return policy.Dest{Host: "127.0.0.1", Port: s.port(), Why: "test literal"}
}

func port(s string) uint16 {
	n, _ := strconv.Atoi(s)
	return uint16(n)
}

// tcpServer is a loopback TCP server that serves each connection with
// serve, in a goroutine of its own, and closes it after; it returns the
// server's address and port.
func tcpServer(tb testing.TB, serve func(net.Conn)) (addr string, port uint16) {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return l.Addr().String(), uint16(l.Addr().(*net.TCPAddr).Port)
}

// dnsServer answers A and AAAA questions from names on 127.0.0.1, so a
// test can make a name resolve to whatever it likes (DNS rebinding).
func dnsServer(t *testing.T, names map[string][]netip.Addr) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out, ok := dnsAnswer(buf[:n], names); ok {
				pc.WriteTo(out, from)
			}
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

func dnsAnswer(in []byte, names map[string][]netip.Addr) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(in)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
	addrs, known := names[name]
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
	for _, a := range addrs {
		switch {
		case q.Type == dnsmessage.TypeA && a.Is4():
			b.AResource(rr, dnsmessage.AResource{A: a.As4()})
		case q.Type == dnsmessage.TypeAAAA && a.Is6():
			b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
	}
	out, err := b.Finish()
	return out, err == nil
}

// socks5 speaks SOCKS5 to the proxy: no-auth greeting, then a request of
// cmd to the address (atyp 1, 3 or 4); it returns the reply code and the
// connection (the tunnel, when the reply is 0).
func socks5(t *testing.T, proxyAddr string, cmd byte, host string, port uint16) (byte, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte{5, 1, 0}); err != nil {
		t.Fatal(err)
	}
	var sel [2]byte
	if _, err := io.ReadFull(c, sel[:]); err != nil || sel != [2]byte{5, 0} {
		t.Fatalf("SOCKS5 method selection: %v %v", sel, err)
	}
	req := []byte{5, cmd, 0}
	if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
		b := a.As4()
		req = append(append(req, 1), b[:]...)
	} else if err == nil {
		b := a.As16()
		req = append(append(req, 4), b[:]...)
	} else {
		req = append(append(req, 3, byte(len(host))), host...)
	}
	req = append(req, byte(port>>8), byte(port))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var rep [10]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		t.Fatalf("SOCKS5 reply: %v", err)
	}
	if rep[0] != 5 {
		t.Fatalf("SOCKS5 reply version %d", rep[0])
	}
	return rep[1], c
}

// getOver sends a GET over an established tunnel and returns the body.
func getOver(t *testing.T, c net.Conn, host string) string {
	t.Helper()
	if _, err := io.WriteString(c, "GET /tunnel HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response through the tunnel: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("through the tunnel: %s %s", resp.Status, b)
	}
	return string(b)
}
