//go:build linux

package hostile

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is a DNS server on the loopback (UDP) that answers A
// queries for the names it was given and NXDOMAIN for the rest: the
// egress proxy's resolver in these tests, so that a name can point
// wherever a test needs without touching a real resolver.
type dnsServer struct {
	pc    net.PacketConn
	mu    sync.Mutex
	names map[string]netip.Addr // lower-case, with the trailing dot
	asked []string
}

func startDNS(t *testing.T, names map[string]string) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{pc: pc, names: map[string]netip.Addr{}}
	for n, a := range names {
		s.names[strings.ToLower(n)+"."] = netip.MustParseAddr(a)
	}
	go s.serve()
	t.Cleanup(func() { pc.Close() })
	return s
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp, ok := s.answer(buf[:n]); ok {
			s.pc.WriteTo(resp, from)
		}
	}
}

func (s *dnsServer) answer(req []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := strings.ToLower(q.Name.String())
	s.mu.Lock()
	s.asked = append(s.asked, name)
	a, known := s.names[name]
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if known && q.Type == dnsmessage.TypeA && a.Is4() {
		rr := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1}
		if b.AResource(rr, dnsmessage.AResource{A: a.As4()}) != nil {
			return nil, false
		}
	}
	resp, err := b.Finish()
	return resp, err == nil
}

// resolver is a Go resolver that asks this server alone.
func (s *dnsServer) resolver() *net.Resolver {
	addr := s.pc.LocalAddr().String()
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp", addr)
		},
	}
}

// wasAsked reports whether a query for name reached the server.
func (s *dnsServer) wasAsked(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.asked {
		if n == strings.ToLower(name)+"." {
			return true
		}
	}
	return false
}
