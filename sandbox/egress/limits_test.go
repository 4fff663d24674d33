package egress

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
)

// connect opens a CONNECT tunnel to hp through the proxy and returns it
// once the proxy answered 200.
func connect(t testing.TB, proxyAddr, hp string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hp, hp)
	// Read the head byte by byte: what follows belongs to the tunnel.
	var head []byte
	b := make([]byte, 1)
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		if _, err := c.Read(b); err != nil {
			t.Fatalf("CONNECT %s: %v (read %q)", hp, err, head)
		}
		head = append(head, b[0])
	}
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) {
		t.Fatalf("CONNECT %s: %q", hp, head)
	}
	return c
}

// TestMaxConns: a client holding MaxConns tunnels gets refusals for more
// (HTTP 503, SOCKS5 0x01), while another run's proxy serves at once.
func TestMaxConns(t *testing.T) {
	srv := newServer(t, false)
	hp := srv.Listener.Addr().String()
	rules := policy.Egress{Allow: []policy.Dest{lit(srv)}}
	p, pa := start(t, rules, Options{MaxConns: 2})
	_, other := start(t, rules, Options{MaxConns: 2})
	get := "GET http://" + hp + "/ HTTP/1.1\r\nHost: " + hp + "\r\n\r\n"

	// With room for one more, the same client is served.
	_, roomy := start(t, rules, Options{MaxConns: 3})
	connect(t, roomy, hp)
	connect(t, roomy, hp)
	if status, _, body := raw(t, roomy, get); status != 200 {
		t.Fatalf("below MaxConns: %d %q", status, body)
	}

	connect(t, pa, hp)
	connect(t, pa, hp)
	status, xerr, body := raw(t, pa, get)
	if status != 503 || xerr != "too-many-connections" || !strings.Contains(body, "2 at once") {
		t.Errorf("beyond MaxConns: %d %q %q; want 503 too-many-connections", status, xerr, body)
	}
	if rep, _ := socks5(t, pa, 1, "127.0.0.1", srv.port()); rep != 0x01 {
		t.Errorf("SOCKS5 beyond MaxConns: reply %#x; want 0x01", rep)
	}
	if status, _, body := raw(t, other, get); status != 200 {
		t.Errorf("another run's proxy: %d %q; want 200", status, body)
	}
	p.Close()
	var full []Record
	for _, r := range p.Records() {
		if strings.Contains(r.Reason, "too many connections") {
			full = append(full, r)
		}
	}
	if len(full) != 2 || full[0].Verdict != "refused" || full[0].Host != "127.0.0.1" || full[1].Proto != "socks5" {
		t.Errorf("refusals recorded: %+v", full)
	}
}

// echoish accepts one connection at a time, reads exactly in bytes,
// answers out bytes and closes.
func echoish(t *testing.T, in, out int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.ReadFull(c, make([]byte, in))
			c.Write(bytes.Repeat([]byte("d"), out))
			c.Close()
		}
	}()
	return l.Addr().String()
}

// TestRecordsCountBytes: each tunnel's record has the exact bytes sent
// each way, and refusals are counted with the first one named.
func TestRecordsCountBytes(t *testing.T) {
	hp := echoish(t, 1000, 2345)
	ap, _ := net.ResolveTCPAddr("tcp", hp)
	p, pa := start(t, policy.Egress{Allow: []policy.Dest{{Host: "127.0.0.1", Port: uint16(ap.Port)}}}, Options{})

	c := connect(t, pa, hp)
	c.Write(bytes.Repeat([]byte("u"), 1000))
	if got, _ := io.ReadAll(c); len(got) != 2345 {
		t.Errorf("CONNECT: read %d bytes; want 2345", len(got))
	}
	c.Close()
	rep, sc := socks5(t, pa, 1, "127.0.0.1", uint16(ap.Port))
	if rep != 0 {
		t.Fatalf("SOCKS5: reply %#x", rep)
	}
	sc.Write(bytes.Repeat([]byte("u"), 1000))
	io.ReadAll(sc)
	sc.Close()
	raw(t, pa, "CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")
	raw(t, pa, "CONNECT 127.0.0.1:2 HTTP/1.1\r\n\r\n")
	p.Close()

	var allowed []Record
	for _, r := range p.Records() {
		if r.Verdict == "allowed" {
			allowed = append(allowed, r)
		}
	}
	if len(allowed) != 2 {
		t.Fatalf("allowed records: %+v", allowed)
	}
	for _, r := range allowed {
		if r.Up != 1000 || r.Down != 2345 || r.Addr != "127.0.0.1" {
			t.Errorf("%s record: %+v; want up 1000, down 2345", r.Proto, r)
		}
	}
	if n, first := p.Refused(); n != 2 || first != "127.0.0.1:1" {
		t.Errorf("Refused() = %d, %q; want 2, 127.0.0.1:1", n, first)
	}
}

// TestCloseEndsOpenConnections: Close ends a held tunnel, which is
// recorded, and returns.
func TestCloseEndsOpenConnections(t *testing.T) {
	srv := newServer(t, false)
	p, pa := start(t, policy.Egress{Allow: []policy.Dest{lit(srv)}}, Options{})
	c := connect(t, pa, srv.Listener.Addr().String())
	p.Close()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("the tunnel is still open after Close")
	}
	recs := p.Records()
	if len(recs) != 1 || recs[0].Proto != "connect" || recs[0].Verdict != "allowed" {
		t.Errorf("Records = %+v; want the held tunnel", recs)
	}
}

// TestSlowHead: a client trickling its request head is answered 408 and
// let go instead of holding its slot.
func TestSlowHead(t *testing.T) {
	srv := newServer(t, false)
	p := New(policy.Egress{Allow: []policy.Dest{lit(srv)}}, Options{MaxConns: 1})
	p.headTimeout = 50 * time.Millisecond
	pa := serve(t, p)
	c, err := net.Dial("tcp", pa)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://"+srv.Listener.Addr().String()+"/ HTTP/1.1\r\nX-Slow: ")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("slow head: %v %v; want 408", resp, err)
	}
}

func TestRecordsCapped(t *testing.T) {
	p := New(policy.Egress{}, Options{})
	for i := range maxRecords + 5 {
		p.record(Record{Proto: "http", Host: fmt.Sprint("h", i), Port: 80, Verdict: "refused"})
	}
	if n, first := p.Refused(); len(p.Records()) != maxRecords || p.Overflow() != 5 || n != maxRecords+5 || first != "h0:80" {
		t.Errorf("records %d, overflow %d, refused %d %q", len(p.Records()), p.Overflow(), n, first)
	}
}
