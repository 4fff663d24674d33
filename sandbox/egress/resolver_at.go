package egress

import (
	"context"
	"net"
)

// ResolverAt is a resolver that asks the DNS server at addr (host:port)
// alone, over UDP and, for long answers, TCP: what METNOS_EGRESS_DNS
// sets. It returns nil, the system's resolver, for "".
func ResolverAt(addr string) *net.Resolver {
	if addr == "" {
		return nil
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}
