package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
)

// rawServer is a loopback TCP server that answers each connection
// with answer, then half-closes it and reads what else comes.
func rawServer(t *testing.T, answer func(c net.Conn)) (addr string, port uint16) {
	t.Helper()
	return tcpServer(t, func(c net.Conn) {
		answer(c)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
	})
}

// TestHeadLimitHolds: a header line of exactly the reader's buffer size
// does not end the head early, so a request head stays within its
// limit (found in review: the head then went on into the socket without
// a limit).
func TestHeadLimitHolds(t *testing.T) {
	_, pa := start(t, policy.Egress{}, Options{})
	var b strings.Builder
	b.WriteString("GET http://198.51.100.7/ HTTP/1.1\r\n")
	b.WriteString("X-A: " + strings.Repeat("a", 4091) + "\r\n") // 4098 bytes: a 4096-byte piece, then "\r\n"
	for b.Len() < 100<<10 {
		b.WriteString("X-B: " + strings.Repeat("b", 1000) + "\r\n")
	}
	b.WriteString("\r\n")
	status, _, body := raw(t, pa, b.String())
	if status != 400 || !strings.Contains(body, "longer than") {
		t.Errorf("a 100 KiB head: %d %q, want 400 saying it is too long", status, body)
	}
	// The same head within the limit is read whole (and refused by the
	// allow list, which names nothing).
	small := "GET http://198.51.100.7/ HTTP/1.1\r\nX-A: " + strings.Repeat("a", 4091) + "\r\nX-B: b\r\n\r\n"
	if status, xerr, _ := raw(t, pa, small); status != 403 || xerr != "blocked-by-allowlist" {
		t.Errorf("a head with a 4098-byte line: %d %q, want 403 blocked-by-allowlist", status, xerr)
	}
}

// TestUpstreamHeadBounded: a server that sends an endless response head,
// or endless informational responses, gets a 502 once past the limit,
// and the same server answering within it gets through.
func TestUpstreamHeadBounded(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer func(net.Conn)
		status int
	}{
		{"long head", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\n")
			for range 200 {
				io.WriteString(c, "X-B: "+strings.Repeat("b", 1000)+"\r\n")
			}
			io.WriteString(c, "Content-Length: 2\r\n\r\nok")
		}, 502},
		{"many 1xx", func(c net.Conn) {
			for range 20 {
				io.WriteString(c, "HTTP/1.1 102 Processing\r\n\r\n")
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}, 502},
		{"a few 1xx", func(c net.Conn) {
			for range 3 {
				io.WriteString(c, "HTTP/1.1 102 Processing\r\n\r\n")
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}, 200},
		{"short head", func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nX-B: "+strings.Repeat("b", 1000)+"\r\nContent-Length: 2\r\n\r\nok")
		}, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr, port := rawServer(t, func(conn net.Conn) {
				bufio.NewReader(conn).ReadString('\n')
				c.answer(conn)
			})
			p, pa := start(t, policy.Egress{Allow: []policy.Dest{{Host: "127.0.0.1", Port: port}}}, Options{})
			status, _, _ := raw(t, pa, "GET http://"+addr+"/ HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
			if status != c.status {
				t.Errorf("status %d, want %d", status, c.status)
			}
			if c.status == 502 {
				if r := p.Records(); len(r) != 1 || (!strings.Contains(r[0].Reason, "longer than") && !strings.Contains(r[0].Reason, "informational")) {
					t.Errorf("records %+v, want the reason", r)
				}
			}
		})
	}
}

// TestBytesCountedOnFailure: a request whose upstream took the body and
// then closed without answering is recorded with the bytes that went
// out.
func TestBytesCountedOnFailure(t *testing.T) {
	var took atomic.Int64
	addr, port := rawServer(t, func(c net.Conn) {
		// Take the request, body and all, and answer nothing.
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err == nil {
			n, _ := io.Copy(io.Discard, req.Body)
			took.Store(n)
		}
		c.Close()
	})
	p, pa := start(t, policy.Egress{Allow: []policy.Dest{{Host: "127.0.0.1", Port: port}}}, Options{})
	body := strings.Repeat("x", 1<<20)
	go func() {
		c, err := net.Dial("tcp", pa)
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(c, "POST http://%s/ HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", addr, addr, len(body), body)
		http.ReadResponse(bufio.NewReader(c), nil)
	}()
	for end := time.Now().Add(30 * time.Second); len(p.Records()) == 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	n := took.Load()
	p.Close()
	rs := p.Records()
	if len(rs) != 1 || rs[0].Up < int64(len(body)) || n < int64(len(body)) {
		t.Errorf("server read %d; records %+v: want Up >= %d", n, rs, len(body))
	}
}

// TestRefusalRecordsBounded: what a client sends is quoted in reasons
// at most so long, and the first refusal's name and reason come from
// the same record, also when the client named no destination.
func TestRefusalRecordsBounded(t *testing.T) {
	p, pa := start(t, policy.Egress{}, Options{})
	if status, _, _ := raw(t, pa, "BLAH\r\n\r\n"); status != 400 {
		t.Errorf("garbage: %d", status)
	}
	if status, _, _ := raw(t, pa, "GET /"+strings.Repeat("a", 60000)+" HTTP/1.1\r\n\r\n"); status != 400 {
		t.Errorf("a long origin-form URI: %d", status)
	}
	if status, _, _ := raw(t, pa, "GET http://198.51.100.7/ HTTP/1.1\r\n\r\n"); status != 403 {
		t.Errorf("a refused host: %d", status)
	}
	for _, r := range p.Records() {
		if len(r.Reason) > maxReason+len("…") {
			t.Errorf("a reason of %d bytes is kept: %.80q…", len(r.Reason), r.Reason)
		}
	}
	n, first := p.Refused()
	rec, ok := p.FirstRefused()
	if n != 3 || !ok || first != "(no destination: http request not understood)" || rec.Host != "" {
		t.Errorf("Refused %d %q, first record %+v", n, first, rec)
	}
}

// TestLocalPrefixes: this device's addresses (the loopback at least)
// and their networks are listed, but those the caller stands in for
// public hosts.
func TestLocalPrefixes(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	in := func(ps []netip.Prefix) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(lo) })
	}
	if !in(LocalPrefixes(nil)) {
		t.Errorf("LocalPrefixes() = %v, without the loopback", LocalPrefixes(nil))
	}
	if in(LocalPrefixes([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})) {
		t.Error("a stand-in range is still listed")
	}
}
