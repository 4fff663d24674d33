package egress

import (
	"io"
	"net"
	"net/netip"
	"testing"

	"github.com/metnos/agent/policy"
)

// source accepts connections and sends size bytes on each.
func source(b *testing.B, size int) string {
	buf := make([]byte, 64<<10)
	addr, _ := tcpServer(b, func(c net.Conn) {
		for left := size; left > 0; left -= len(buf) {
			if _, err := c.Write(buf[:min(left, len(buf))]); err != nil {
				return
			}
		}
	})
	return addr
}

// BenchmarkDownload compares a 64 MiB download through a CONNECT tunnel
// with the same download direct (go test -bench Download -run X).
func BenchmarkDownload(b *testing.B) {
	const size = 64 << 20
	hp := source(b, size)
	ap := netip.MustParseAddrPort(hp)
	for _, via := range []string{"direct", "connect"} {
		b.Run(via, func(b *testing.B) {
			var pa string
			if via == "connect" {
				p := New(policy.Egress{Allow: []policy.Dest{{Host: "127.0.0.1", Port: ap.Port()}}}, Options{})
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				go p.Serve(l)
				defer p.Close()
				pa = l.Addr().String()
			}
			b.SetBytes(size)
			for b.Loop() {
				var c net.Conn
				if via == "direct" {
					var err error
					if c, err = net.Dial("tcp", hp); err != nil {
						b.Fatal(err)
					}
				} else {
					c = connect(b, pa, hp)
				}
				n, _ := io.Copy(io.Discard, c)
				c.Close()
				if n != size {
					b.Fatalf("read %d bytes", n)
				}
			}
		})
	}
}
