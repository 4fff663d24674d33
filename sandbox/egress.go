package sandbox

import (
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox/egress"
)

// ProxyPort is the port of a run's egress proxy on Linux, on 127.0.0.1
// in the run's own network namespace (where nothing else listens). On
// macOS and Windows the proxy listens on the host's loopback, on a port
// the system picks.
const ProxyPort = 3128

// NetReport is what a run's egress proxy saw: a run of a Policy with
// Egress reaches the network through it alone.
type NetReport struct {
	// Proxy is where the command found the proxy ("127.0.0.1:3128").
	Proxy string `json:"proxy"`
	// Enforced is false where the sandbox cannot keep the command from
	// going around the proxy (Windows): then the allow list binds only
	// programs that use the proxy variables.
	Enforced bool `json:"enforced"`
	// Conns are the connections the proxy allowed or refused, in order;
	// Overflow counts those past the first ones it keeps.
	Conns    []egress.Record `json:"conns,omitempty"`
	Overflow int             `json:"overflow,omitempty"`
	// Refused counts the refused connections; FirstRefused is the first
	// one's "host:port".
	Refused      int    `json:"refused,omitempty"`
	FirstRefused string `json:"first_refused,omitempty"`
	// FirstReason is why the first refused connection was refused, in
	// words ("is not named by the executor's manifest network hints...",
	// "resolves to 127.0.0.1 (loopback)...").
	FirstReason string `json:"first_reason,omitempty"`
}

// egressOf is the Egress a run of p goes through, nil when it has the
// whole network or none.
func egressOf(p policy.Policy) *policy.Egress {
	if p.Network || p.Egress == nil {
		return nil
	}
	return p.Egress
}

// proxyEnv points the usual proxy variables at addr ("127.0.0.1:3128")
// and drops NO_PROXY: every destination, loopback ones included, goes
// through the proxy, which is the only way out.
func proxyEnv(env []string, addr string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(k) {
		case "NO_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "FTP_PROXY":
			continue
		}
		out = append(out, kv)
	}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		out = append(out, k+"=http://"+addr)
	}
	for _, k := range []string{"ALL_PROXY", "all_proxy"} {
		out = append(out, k+"=socks5h://"+addr)
	}
	return out
}

// runProxy is one run's egress proxy. Its listener may come later (on
// Linux the shim makes it inside the sandbox); egress.Proxy closes one
// that comes after Close.
type runProxy struct {
	p        *egress.Proxy
	addr     string
	enforced bool
	// done is closed once Serve has returned, or when no listener is
	// ever to come.
	done     chan struct{}
	stopOnce sync.Once
}

func newRunProxy(e policy.Egress, o Options, addr string, enforced bool) *runProxy {
	return &runProxy{
		p:        egress.New(e, egress.Options{Resolver: o.EgressResolver, StandIns: o.EgressStandIns}),
		addr:     addr,
		enforced: enforced,
		done:     make(chan struct{}),
	}
}

// serve serves l until stop.
func (rp *runProxy) serve(l net.Listener) {
	defer close(rp.done)
	rp.p.Serve(l)
}

// stop closes the listeners and every connection, waits for serve, and
// reports what the proxy saw. It may be called more than once.
func (rp *runProxy) stop() *NetReport {
	rp.stopOnce.Do(func() {
		rp.p.Close()
		<-rp.done
	})
	n, firstRefused := rp.p.Refused()
	rep := &NetReport{Proxy: rp.addr, Enforced: rp.enforced, Conns: rp.p.Records(), Overflow: rp.p.Overflow(), Refused: n, FirstRefused: firstRefused}
	if first, ok := rp.p.FirstRefused(); ok {
		// The reason names the destination first: said once.
		r := strings.TrimPrefix(first.Reason, "egress: ")
		if rest, ok := strings.CutPrefix(r, firstRefused+" "); ok {
			r = rest
		}
		rep.FirstReason = r
	}
	return rep
}

// hostPort joins host and port.
func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
