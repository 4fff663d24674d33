package egress

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/metnos/agent/policy"
)

func TestHTTPForwardAllowed(t *testing.T) {
	srv := newServer(t, false)
	p, pa := start(t, policy.Egress{Allow: []policy.Dest{lit(srv)}, Deny: policy.DefaultDeny()}, Options{})
	c := client(pa, nil)
	req, _ := http.NewRequest("POST", srv.URL+"/path?q=1", strings.NewReader("payload"))
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
	req.Header.Set("X-Keep", "yes")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	host := srv.Listener.Addr().String()
	if want := "hello from " + host + " /path?q=1 body=payload"; resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("got %s %q; want 200 %q", resp.Status, body, want)
	}
	got := srv.lastRequest()
	if got.Header.Get("Proxy-Authorization") != "" || got.Header.Get("X-Keep") != "yes" || !got.Close {
		t.Errorf("the server saw headers %v (close %v); want Proxy-* removed, X-Keep kept, Connection: close", got.Header, got.Close)
	}
	p.Close() // waits for the connection's goroutine, which records it
	recs := p.Records()
	if len(recs) != 1 {
		t.Fatalf("Records = %+v; want one", recs)
	}
	r := recs[0]
	if r.Proto != "http" || r.Host != "127.0.0.1" || r.Port != srv.port() || r.Addr != "127.0.0.1" || r.Verdict != "allowed" ||
		r.Up < int64(len("payload")) || r.Down < int64(len(body)) {
		t.Errorf("record = %+v", r)
	}
	if n, first := p.Refused(); n != 0 || first != "" {
		t.Errorf("Refused() = %d, %q; want 0", n, first)
	}
}

func TestConnectHTTPS(t *testing.T) {
	srv := newServer(t, true)
	for _, allowed := range []bool{true, false} {
		rules := policy.Egress{Deny: policy.DefaultDeny()}
		if allowed {
			rules.Allow = []policy.Dest{lit(srv)}
		} else {
			rules.Allow = []policy.Dest{{Host: "127.0.0.1", Port: srv.port() + 1}}
		}
		p, pa := start(t, rules, Options{})
		resp, err := client(pa, srv).Get(srv.URL + "/secure")
		if !allowed {
			// Go's transport reports the proxy's refusal as an error
			// naming the status.
			if err == nil || !strings.Contains(err.Error(), "Forbidden") {
				t.Errorf("HTTPS to a port not allowed: %v; want a 403 Forbidden", err)
			}
			p.Close()
			if n, first := p.Refused(); n != 1 || first != srv.Listener.Addr().String() {
				t.Errorf("Refused() = %d, %q", n, first)
			}
			continue
		}
		if err != nil {
			t.Fatalf("HTTPS through CONNECT: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "/secure") {
			t.Errorf("body %q", b)
		}
		p.Close()
		r := p.Records()[0]
		if r.Proto != "connect" || r.Verdict != "allowed" || r.Up == 0 || r.Down <= int64(len(b)) {
			t.Errorf("record = %+v; want connect, allowed, TLS bytes both ways", r)
		}
	}
	if srv.conns.Load() != 1 {
		t.Errorf("the server saw %d connections; want 1 (the allowed one)", srv.conns.Load())
	}
}

func TestPortNotAllowed(t *testing.T) {
	a, b := newServer(t, false), newServer(t, false)
	_, pa := start(t, policy.Egress{Allow: []policy.Dest{lit(a)}}, Options{})
	status, xerr, body := raw(t, pa, "GET "+b.URL+"/ HTTP/1.1\r\nHost: "+b.Listener.Addr().String()+"\r\n\r\n")
	if status != 403 || xerr != "blocked-by-allowlist" || !strings.Contains(body, b.Listener.Addr().String()+" is not named by the executor's manifest") {
		t.Errorf("got %d %q %q; want 403 blocked-by-allowlist naming the host", status, xerr, body)
	}
	if b.conns.Load() != 0 {
		t.Errorf("a refused request reached the server")
	}
	// The same request passes when the port is allowed.
	_, pa2 := start(t, policy.Egress{Allow: []policy.Dest{lit(a), lit(b)}}, Options{})
	if status, _, _ := raw(t, pa2, "GET "+b.URL+"/ HTTP/1.1\r\nHost: "+b.Listener.Addr().String()+"\r\n\r\n"); status != 200 {
		t.Errorf("allowed port: status %d", status)
	}
}

// TestDenyPortWins: the default deny list's port 25 refuses a CONNECT
// that Allow "*" and a literal both allow, and the proxy dials nothing.
func TestDenyPortWins(t *testing.T) {
	srv := newServer(t, false)
	for _, allow := range [][]policy.Dest{{{Host: "*"}}, {{Host: "127.0.0.1"}}, {{Host: "smtp.example.com"}}} {
		for _, deny := range [][]policy.Dest{policy.DefaultDeny(), nil} {
			var d dials
			p, pa := start(t, policy.Egress{Allow: allow, Deny: deny}, Options{
				Resolver: dnsServer(t, map[string][]netip.Addr{"smtp.example.com": {netip.MustParseAddr("192.0.2.25")}}),
			})
			d.hook(p, srv.Listener.Addr().String())
			host := allow[0].Host
			if host == "*" {
				host = "mx.example.net"
				p.resolver = dnsServer(t, map[string][]netip.Addr{host: {netip.MustParseAddr("192.0.2.25")}})
			}
			status, xerr, body := raw(t, pa, "CONNECT "+net.JoinHostPort(host, "25")+" HTTP/1.1\r\n\r\n")
			if deny != nil {
				if status != 403 || xerr != "blocked-by-denylist" || !strings.Contains(body, "default deny: mail port") || len(d.list()) != 0 {
					t.Errorf("allow %v, CONNECT %s:25: %d %q %q, dialed %v; want 403 blocked-by-denylist and no dial", allow, host, status, xerr, body, d.list())
				}
				continue
			}
			if status != 200 || len(d.list()) != 1 || !strings.HasSuffix(d.list()[0], ":25") {
				t.Errorf("allow %v without the deny list, CONNECT %s:25: %d, dialed %v; want 200 and one dial to port 25", allow, host, status, d.list())
			}
		}
	}
}

// TestWildcardNeverReachesLocal: "*" reaches no loopback, metadata or
// private address named literally; the literal in Allow does.
func TestWildcardNeverReachesLocal(t *testing.T) {
	srv := newServer(t, false)
	for _, target := range []string{srv.Listener.Addr().String(), "169.254.169.254:80", "10.0.0.1:80", "[::ffff:10.0.0.1]:80"} {
		host, ps, _ := net.SplitHostPort(target)
		for _, allow := range []policy.Dest{{Host: "*"}, {Host: policy.NormalizeHost(host), Port: port(ps)}} {
			var d dials
			p, pa := start(t, policy.Egress{Allow: []policy.Dest{allow}}, Options{})
			d.hook(p, srv.Listener.Addr().String())
			before := srv.conns.Load()
			status, xerr, body := raw(t, pa, "GET http://"+target+"/ HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
			if allow.Host == "*" {
				if status != 403 || xerr != "blocked-by-allowlist" || len(d.list()) != 0 || srv.conns.Load() != before {
					t.Errorf("* → %s: %d %q %q, dialed %v; want 403 and no dial", target, status, xerr, body, d.list())
				}
				continue
			}
			if status != 200 || len(d.list()) != 1 {
				t.Errorf("literal %s → %s: %d %q, dialed %v; want 200", allow.Host, target, status, body, d.list())
			}
		}
	}
}

// TestDNSRebinding: an allowed name whose DNS answer is 127.0.0.1 is
// refused after resolution, and nothing connects to the loopback
// server; the owner's CIDR for loopback lets it through, and a public
// answer goes through.
func TestDNSRebinding(t *testing.T) {
	srv := newServer(t, false)
	res := dnsServer(t, map[string][]netip.Addr{
		"allowed.test": {netip.MustParseAddr("127.0.0.1")},
		"public.test":  {netip.MustParseAddr("198.51.100.7")},
	})
	u := fmt.Sprintf("http://allowed.test:%d/x", srv.port())
	p, pa := start(t, policy.Egress{Allow: []policy.Dest{{Host: "allowed.test"}, {Host: "*"}}}, Options{Resolver: res})
	resp, body := get(t, client(pa, nil), u)
	if resp.StatusCode != 403 || resp.Header.Get("X-Proxy-Error") != "blocked-by-address" ||
		!strings.Contains(body, "resolves to 127.0.0.1 (loopback)") {
		t.Errorf("rebinding: %s %q %q; want 403 blocked-by-address", resp.Status, resp.Header.Get("X-Proxy-Error"), body)
	}
	if srv.conns.Load() != 0 {
		t.Errorf("rebinding: %d connections reached the loopback server", srv.conns.Load())
	}
	p.Close()
	if r := p.Records()[0]; r.Verdict != "refused" || r.Host != "allowed.test" || r.Addr != "127.0.0.1" {
		t.Errorf("record = %+v", r)
	}

	// The owner's CIDR vouches for loopback: the same request passes.
	_, pa2 := start(t, policy.Egress{Allow: []policy.Dest{{Host: "allowed.test"}, {Host: "127.0.0.0/8", Why: "owner allow"}}}, Options{Resolver: res})
	if resp, body := get(t, client(pa2, nil), u); resp.StatusCode != 200 || !strings.Contains(body, "/x") {
		t.Errorf("with the owner's CIDR: %s %q", resp.Status, body)
	}

	// https://* reaches a host the proxy takes for public (a
	// documentation address, dialed to the test server).
	srvTLS := newServer(t, true)
	p3, pa3 := start(t, policy.Egress{Allow: []policy.Dest{{Host: "*", Why: "network:http hint https://*"}}}, Options{Resolver: res})
	var d dials
	d.hook(p3, srvTLS.Listener.Addr().String())
	c := client(pa3, srvTLS)
	c.Transport.(*http.Transport).TLSClientConfig.ServerName = "example.com" // httptest's certificate names it
	if resp, body := get(t, c, "https://public.test/pub"); resp.StatusCode != 200 || !strings.Contains(body, "/pub") {
		t.Errorf("https://* to a public name: %s %q", resp.Status, body)
	}
	if got := d.list(); len(got) != 1 || got[0] != "198.51.100.7:443" {
		t.Errorf("dialed %v; want 198.51.100.7:443", got)
	}
	p3.Close()
	if r := p3.Records()[0]; r.Addr != "198.51.100.7" || r.Verdict != "allowed" {
		t.Errorf("record = %+v", r)
	}
}

func TestSmuggling(t *testing.T) {
	srv := newServer(t, false)
	hp := srv.Listener.Addr().String()
	_, pa := start(t, policy.Egress{Allow: []policy.Dest{lit(srv), {Host: "allowed.test"}}}, Options{
		Resolver: dnsServer(t, map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("192.0.2.1")}, "evil.test": {netip.MustParseAddr("127.0.0.1")}}),
	})
	for _, tc := range []struct{ name, req string }{
		{"Host header names another host", "GET http://" + hp + "/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
		{"Host header names another port", "GET http://" + hp + "/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n"},
		{"two Host headers", "GET http://" + hp + "/ HTTP/1.1\r\nHost: " + hp + "\r\nHost: evil.test\r\n\r\n"},
		{"userinfo in the URI", "GET http://user:pw@" + hp + "/ HTTP/1.1\r\nHost: " + hp + "\r\n\r\n"},
		{"userinfo naming the allowed host", "GET http://" + hp + "@evil.test/ HTTP/1.1\r\n\r\n"},
		{"origin form", "GET / HTTP/1.1\r\nHost: " + hp + "\r\n\r\n"},
		{"https:// forwarded", "GET https://" + hp + "/ HTTP/1.1\r\nHost: " + hp + "\r\n\r\n"},
		{"ftp://", "GET ftp://" + hp + "/ HTTP/1.1\r\nHost: " + hp + "\r\n\r\n"},
		{"CONNECT host:port@evil", "CONNECT allowed.test:443@evil.test HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"},
		{"CONNECT user@host", "CONNECT user@" + hp + " HTTP/1.1\r\n\r\n"},
		{"CONNECT without a port", "CONNECT allowed.test HTTP/1.1\r\n\r\n"},
		{"CONNECT with a path", "CONNECT " + hp + "/x HTTP/1.1\r\n\r\n"},
		{"CONNECT Host header names another host", "CONNECT " + hp + " HTTP/1.1\r\nHost: evil.test:443\r\n\r\n"},
		{"malformed", "NONSENSE\r\n\r\n"},
	} {
		status, _, body := raw(t, pa, tc.req)
		if status != 400 {
			t.Errorf("%s: %d %q; want 400", tc.name, status, body)
		}
	}
	if srv.conns.Load() != 0 {
		t.Errorf("%d smuggled requests reached the server", srv.conns.Load())
	}
	// The same requests, well formed, pass.
	for _, req := range []string{
		"GET http://" + hp + "/ HTTP/1.1\r\nHost: " + hp + "\r\n\r\n",
		"GET http://" + hp + "/ HTTP/1.1\r\n\r\n",
		"CONNECT " + hp + " HTTP/1.1\r\nHost: " + hp + "\r\n\r\n",
	} {
		if status, _, body := raw(t, pa, req); status != 200 {
			t.Errorf("%q: %d %q; want 200", req, status, body)
		}
	}
}

func TestSOCKS5(t *testing.T) {
	srv := newServer(t, false)
	res := dnsServer(t, map[string][]netip.Addr{"public.test": {netip.MustParseAddr("203.0.113.5")}})
	p, pa := start(t, policy.Egress{Allow: []policy.Dest{lit(srv), {Host: "public.test", Port: 8080}, {Host: "2001:db8::1"}}, Deny: policy.DefaultDeny()}, Options{Resolver: res})
	var d dials
	d.hook(p, srv.Listener.Addr().String())

	// IPv4, allowed.
	d.target = srv.Listener.Addr().String()
	rep, c := socks5(t, pa, 1, "127.0.0.1", srv.port())
	if rep != 0 {
		t.Fatalf("SOCKS5 CONNECT to the allowed literal: reply %#x", rep)
	}
	if body := getOver(t, c, srv.Listener.Addr().String()); !strings.Contains(body, "/tunnel") {
		t.Errorf("body %q", body)
	}
	// Domain name, resolved by the proxy, allowed.
	if rep, c := socks5(t, pa, 1, "public.test", 8080); rep != 0 {
		t.Errorf("SOCKS5 domain: reply %#x", rep)
	} else {
		getOver(t, c, "public.test:8080")
	}
	// IPv6.
	if rep, c := socks5(t, pa, 1, "2001:db8::1", 80); rep != 0 {
		t.Errorf("SOCKS5 IPv6: reply %#x", rep)
	} else {
		getOver(t, c, "[2001:db8::1]")
	}
	if got := strings.Join(d.list()[1:], " "); got != "203.0.113.5:8080 [2001:db8::1]:80" {
		t.Errorf("dialed %q", got)
	}
	n := len(d.list())
	// Refused: another port, another name, the deny list, UDP ASSOCIATE
	// and BIND to the allowed destination.
	for _, tc := range []struct {
		cmd  byte
		host string
		port uint16
		rep  byte
	}{
		{1, "127.0.0.1", srv.port() + 1, 0x02},
		{1, "public.test", 443, 0x02},
		{1, "other.test", 8080, 0x02},
		{1, "127.0.0.1", 25, 0x02},
		{3, "127.0.0.1", srv.port(), 0x07},
		{2, "127.0.0.1", srv.port(), 0x07},
	} {
		if rep, _ := socks5(t, pa, tc.cmd, tc.host, tc.port); rep != tc.rep {
			t.Errorf("SOCKS5 cmd %d to %s:%d: reply %#x; want %#x", tc.cmd, tc.host, tc.port, rep, tc.rep)
		}
	}
	if len(d.list()) != n {
		t.Errorf("refused SOCKS5 requests dialed %v", d.list()[n:])
	}
	p.Close()
	if n, first := p.Refused(); n != 6 || first != fmt.Sprintf("127.0.0.1:%d", srv.port()+1) {
		t.Errorf("Refused() = %d, %q", n, first)
	}
}

func TestSOCKS5NoAuthOnly(t *testing.T) {
	p, pa := start(t, policy.Egress{Allow: []policy.Dest{{Host: "*"}}}, Options{})
	c, err := net.Dial("tcp", pa)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{5, 1, 2}) // username/password only
	var sel [2]byte
	if _, err := io.ReadFull(c, sel[:]); err != nil || sel != [2]byte{5, 0xff} {
		t.Errorf("selection %v %v; want 5 0xff", sel, err)
	}
	p.Close()
	if n, _ := p.Refused(); n != 1 {
		t.Errorf("Refused() = %d; want 1", n)
	}
}

// TestRebindingDisguised: loopback and private answers in IPv6 clothing
// (IPv4-mapped, NAT64, 6to4) are refused without a dial; a name with a
// private and a public answer is dialed at the public one only.
func TestRebindingDisguised(t *testing.T) {
	srv := newServer(t, false)
	res := dnsServer(t, map[string][]netip.Addr{
		"mapped.test": {netip.MustParseAddr("::ffff:127.0.0.1")},
		"nat64.test":  {netip.MustParseAddr("64:ff9b::a00:1")},
		"6to4.test":   {netip.MustParseAddr("2002:a9fe:a9fe::1")},
		"mixed.test":  {netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("203.0.113.8")},
	})
	p, pa := start(t, policy.Egress{Allow: []policy.Dest{{Host: "*"}}}, Options{Resolver: res})
	var d dials
	d.hook(p, srv.Listener.Addr().String())
	for _, name := range []string{"mapped.test", "nat64.test", "6to4.test"} {
		status, xerr, body := raw(t, pa, "GET http://"+name+"/ HTTP/1.1\r\nHost: "+name+"\r\n\r\n")
		if status != 403 || xerr != "blocked-by-address" {
			t.Errorf("%s: %d %q %q; want 403 blocked-by-address", name, status, xerr, body)
		}
	}
	if got := d.list(); len(got) != 0 {
		t.Errorf("dialed %v; want nothing", got)
	}
	// The same proxy serves a name whose answers include a public one.
	if status, _, body := raw(t, pa, "GET http://mixed.test/ HTTP/1.1\r\nHost: mixed.test\r\n\r\n"); status != 200 {
		t.Errorf("mixed.test: %d %q; want 200", status, body)
	}
	if got := d.list(); len(got) != 1 || got[0] != "203.0.113.8:80" {
		t.Errorf("dialed %v; want only 203.0.113.8:80", got)
	}
}

func TestSplitAuthority(t *testing.T) {
	for _, tc := range []struct {
		in      string
		defPort uint16
		host    string
		port    uint16
	}{
		{"api.github.com:443", 0, "api.github.com", 443},
		{"API.GitHub.com.:443", 0, "api.github.com", 443},
		{"127.0.0.1:8080", 0, "127.0.0.1", 8080},
		{"[::1]:8080", 0, "::1", 8080},
		{"[::ffff:10.0.0.1]:80", 0, "10.0.0.1", 80},
		{"example.org", 80, "example.org", 80},
		{"[2001:db8::1]", 80, "2001:db8::1", 80},
		{"example.org", 0, "", 0},
		{"example.org:", 80, "", 0},
		{"example.org:0", 0, "", 0},
		{"example.org:65536", 0, "", 0},
		{"example.org:+443", 0, "", 0},
		{"a@b.example:443", 0, "", 0},
		{"b.example:443@a.example", 0, "", 0},
		{"b.example:443/x", 0, "", 0},
		{"b example:443", 0, "", 0},
		{"[fe80::1%25eth0]:80", 0, "", 0},
		{"::1:443", 0, "", 0},
		{"[127.0.0.1]:443", 0, "", 0},
		{"*:443", 0, "", 0},
	} {
		host, port, err := splitAuthority(tc.in, tc.defPort)
		if host != tc.host || port != tc.port || (err == nil) != (tc.host != "") {
			t.Errorf("splitAuthority(%q, %d) = %q, %d, %v; want %q, %d", tc.in, tc.defPort, host, port, err, tc.host, tc.port)
		}
	}
}
