package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/metnos/agent/policy"
)

const (
	defaultMaxConns    = 64
	defaultDialTimeout = 10 * time.Second
	// headTimeout is how long a client has to send its request head (HTTP
	// request line and headers, or the SOCKS5 greeting and request), so
	// that one trickling bytes cannot hold a slot for ever.
	headTimeout = 30 * time.Second
	// busyTimeout bounds the answer to a connection beyond MaxConns.
	busyTimeout = 5 * time.Second
	maxHead     = 64 << 10
	// maxRecords caps Records; the connections beyond it are counted.
	maxRecords = 1000
)

// Options tunes a [Proxy]. The zero value is ready to use.
type Options struct {
	// Resolver resolves the names clients ask for; nil means
	// net.DefaultResolver (tests point it at their own DNS server).
	Resolver *net.Resolver
	// MaxConns is how many connections the run may hold at once; 0
	// means 64. Beyond it new ones are refused at once (HTTP 503,
	// SOCKS5 reply 0x01) and recorded.
	MaxConns int
	// DialTimeout bounds resolving a name and connecting to it; 0 means
	// 10 s.
	DialTimeout time.Duration
	// Log receives one line per connection; nil discards them.
	Log *slog.Logger
	// StandIns are addresses of this device the proxy takes for public
	// hosts all the same (see [policy.Egress.Local]): for tests that
	// stand a "public" server up on a documentation address in a
	// network namespace of their own. Nil for any real run.
	StandIns []netip.Prefix
}

// Record is one client connection of a run, allowed or refused.
type Record struct {
	// Proto is "http" (a forwarded http:// request), "connect" (HTTP
	// CONNECT) or "socks5".
	Proto string `json:"proto"`
	// Host and Port are the destination as the client named it (empty
	// when the request was too malformed to name one).
	Host string `json:"host,omitempty"`
	Port uint16 `json:"port,omitempty"`
	// Addr is the address connected to, or the one refused.
	Addr string `json:"addr,omitempty"`
	// Up and Down count the bytes sent to the destination (client to
	// server) and received from it.
	Up   int64 `json:"up"`
	Down int64 `json:"down"`
	// Verdict is "allowed" or "refused".
	Verdict string `json:"verdict"`
	// Reason says why it was refused, or why an allowed connection
	// failed (the name did not resolve, the dial failed); "" otherwise.
	Reason string `json:"reason,omitempty"`
}

// Proxy is the egress proxy of one run: an HTTP forward proxy with
// CONNECT and a SOCKS5 server on the same listener, letting through only
// what its [policy.Egress] allows. Make one with [New].
type Proxy struct {
	rules    policy.Egress
	resolver *net.Resolver
	maxConns int
	timeout  time.Duration
	log      *slog.Logger
	// dial connects to an address already checked; tests replace it to
	// see every dial the proxy makes.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// headTimeout is headTimeout; tests shorten it.
	headTimeout time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	active    int // client connections being served
	busy      int // client connections being told the proxy is full
	records   []Record
	overflow  int
	refused   int
	first     Record
}

// New returns a Proxy enforcing rules. It serves nothing until [Proxy.Serve].
func New(rules policy.Egress, opt Options) *Proxy {
	rules.Local = LocalPrefixes(opt.StandIns)
	p := &Proxy{
		rules:       rules,
		resolver:    opt.Resolver,
		maxConns:    opt.MaxConns,
		timeout:     opt.DialTimeout,
		log:         opt.Log,
		headTimeout: headTimeout,
		listeners:   map[net.Listener]struct{}{},
		conns:       map[net.Conn]struct{}{},
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	if p.maxConns <= 0 {
		p.maxConns = defaultMaxConns
	}
	if p.timeout <= 0 {
		p.timeout = defaultDialTimeout
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.dial = (&net.Dialer{Timeout: p.timeout}).DialContext
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// Serve accepts connections on l until [Proxy.Close], each served in its
// own goroutine. It returns nil after Close, or the listener's error.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return nil
	}
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if !closed && outOfFiles(err) {
				// Out of descriptors: wait for connections to end,
				// as net/http does, rather than end the run's network.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.log.Warn("egress: accept", "err", err, "retry", backoff)
				time.Sleep(backoff)
				continue
			}
			p.mu.Lock()
			delete(p.listeners, l)
			p.mu.Unlock()
			if closed {
				return nil
			}
			return fmt.Errorf("egress: accepting on %s: %w", l.Addr(), err)
		}
		backoff = 0
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return nil
		}
		full := p.active >= p.maxConns
		switch {
		case !full:
			p.active++
		case p.busy < p.maxConns:
			p.busy++
		default:
			// Too many even to answer: close it, and say so.
			p.mu.Unlock()
			c.Close()
			p.record(Record{Verdict: "refused", Reason: p.fullReason()})
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			if full {
				p.answerFull(c)
			} else {
				p.handle(c)
			}
			c.Close()
			p.mu.Lock()
			delete(p.conns, c)
			if full {
				p.busy--
			} else {
				p.active--
			}
			p.mu.Unlock()
		}()
	}
}

// Close stops accepting, closes every open connection (each is recorded)
// and waits until every connection's goroutine has returned.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.cancel()
		for l := range p.listeners {
			l.Close()
		}
		for c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Records returns every connection so far (a copy), in the order they
// were refused or, allowed, ended; past 1000 only their number is kept
// ([Proxy.Overflow]). A connection that closed without sending a byte
// asked for nothing and is not recorded.
func (p *Proxy) Records() []Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Record(nil), p.records...)
}

// Overflow is the number of connections ended beyond the 1000 that
// Records keeps.
func (p *Proxy) Overflow() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.overflow
}

// Refused returns the number of refused connections and the first
// refused destination as "host:port" ("" when none was).
func (p *Proxy) Refused() (n int, first string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refused == 0 {
		return 0, ""
	}
	return p.refused, firstName(p.first)
}

// FirstRefused returns the record of the first refused connection, and
// false when none was.
func (p *Proxy) FirstRefused() (Record, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first, p.refused > 0
}

// firstName is a refused record's "host:port", or what stands for it
// when the client named none (a malformed request).
func firstName(r Record) string {
	if r.Host == "" {
		return "(no destination: " + r.Proto + " request not understood)"
	}
	return hostPort(r.Host, r.Port)
}

func (p *Proxy) record(r Record) {
	p.mu.Lock()
	if r.Verdict == "refused" {
		p.refused++
		if p.refused == 1 {
			p.first = r
		}
	}
	if len(p.records) < maxRecords {
		p.records = append(p.records, r)
	} else {
		p.overflow++
	}
	p.mu.Unlock()
	level := slog.LevelDebug
	if r.Verdict == "refused" {
		level = slog.LevelInfo
	}
	p.log.Log(context.Background(), level, "egress", "proto", r.Proto, "host", r.Host, "port", r.Port,
		"addr", r.Addr, "up", r.Up, "down", r.Down, "verdict", r.Verdict, "reason", r.Reason)
}

// pending is the Record of a connection being served, recorded once:
// before a refusal is answered, or when the connection ends.
type pending struct {
	Record
	p    *Proxy
	done bool
}

func (r *pending) finish() {
	if !r.done {
		r.done = true
		r.Reason = capReason(r.Reason)
		r.p.record(r.Record)
	}
}

// maxReason is the longest reason a record keeps: what a client sent
// (a URI, a malformed line) is quoted in reasons, and the records go
// into the run's audit line and result.
const maxReason = 300

// capReason cuts s to maxReason bytes, at a rune boundary, marking the
// cut.
func capReason(s string) string {
	if len(s) <= maxReason {
		return s
	}
	cut := maxReason
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// track adds an upstream connection to those Close closes; false when the
// proxy is already closed (the connection is closed then).
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) fullReason() string {
	return fmt.Sprintf("too many connections: the run may hold %d at once", p.maxConns)
}

// handle serves one client connection: SOCKS5 when its first byte is 5,
// HTTP otherwise.
func (p *Proxy) handle(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(p.headTimeout))
	br := bufio.NewReader(c)
	b, err := br.Peek(1)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			p.record(Record{Proto: "http", Verdict: "refused", Reason: "no request: " + err.Error()})
		}
		return // a connection that sent nothing asked for nothing
	}
	if b[0] == socksVersion {
		p.serveSOCKS(c, br)
	} else {
		p.serveHTTP(c, br)
	}
}

// answerFull tells a client beyond MaxConns that the proxy is full: a
// 503 or SOCKS5 reply 0x01, after reading its request to record it.
func (p *Proxy) answerFull(c net.Conn) {
	c.SetDeadline(time.Now().Add(busyTimeout))
	br := bufio.NewReader(c)
	r := &pending{p: p, Record: Record{Proto: "http", Verdict: "refused", Reason: p.fullReason()}}
	defer r.finish()
	b, err := br.Peek(1)
	if err != nil {
		return
	}
	if b[0] == socksVersion {
		r.Proto = "socks5"
		if !socksGreet(c, br) {
			return
		}
		_, r.Host, r.Port, _ = readSOCKSRequest(br)
		r.reply(c, socksGeneralFailure)
		return
	}
	head, err := readHead(br)
	if err == nil {
		if req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head))); err == nil {
			if req.Method == http.MethodConnect {
				r.Proto = "connect"
				r.Host, r.Port, _ = splitAuthority(req.RequestURI, 0)
			} else {
				r.Host, r.Port, _ = splitAuthority(req.URL.Host, 80)
			}
		}
	}
	r.answer(c, http.StatusServiceUnavailable, "too-many-connections")
}

// connect decides host:port and dials it: CheckName, then resolution by
// the proxy, then CheckAddr for every address before it is dialed. The
// first allowed address that answers wins; addr is the address dialed
// or refused. A refusal is a *policy.Refusal.
func (p *Proxy) connect(host string, port uint16) (c net.Conn, addr string, err error) {
	host = policy.NormalizeHost(host)
	by, err := p.rules.CheckName(host, port)
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = p.resolver.LookupNetIP(ctx, "ip", host); err != nil {
		return nil, "", fmt.Errorf("egress: resolving %s: %w", host, err)
	}
	var refusal, dialErr error
	for _, a := range addrs {
		a = a.Unmap()
		if err := p.rules.CheckAddr(host, port, a, by); err != nil {
			if refusal == nil {
				refusal, addr = err, a.String()
			}
			continue
		}
		c, err := p.dial(ctx, "tcp", netip.AddrPortFrom(a, port).String())
		if err != nil {
			dialErr, addr = fmt.Errorf("egress: connecting to %s (%s): %w", hostPort(host, port), a, err), a.String()
			continue
		}
		return c, a.String(), nil
	}
	if dialErr != nil {
		return nil, addr, dialErr
	}
	if refusal != nil {
		return nil, addr, refusal
	}
	return nil, "", fmt.Errorf("egress: %s resolves to no address", host)
}

// refusalOf returns err as a *policy.Refusal, or nil.
func refusalOf(err error) *policy.Refusal {
	var r *policy.Refusal
	if errors.As(err, &r) {
		return r
	}
	return nil
}

// countConn counts the bytes written to an upstream connection (Up) and
// read from it (Down).
type countConn struct {
	net.Conn
	up, down atomic.Int64
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.down.Add(int64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.up.Add(int64(n))
	return n, err
}

// pipe copies client (read through cr, which may hold bytes already
// buffered) to up and up to client, half-closing each side when its
// source ends, until both directions are done.
func pipe(client net.Conn, cr io.Reader, up *countConn) {
	done := make(chan struct{})
	go func() {
		copyBuf(up, cr)
		closeWrite(up)
		close(done)
	}()
	// The download side goes socket to socket (splice on Linux), its
	// bytes counted from the copy.
	n, _ := io.Copy(client, up.Conn)
	up.down.Add(n)
	closeWrite(client)
	<-done
}

// copyBuf copies through a 64 KiB buffer, hiding WriterTo and ReaderFrom:
// a bufio.Reader's WriteTo would copy 4 KiB at a time.
func copyBuf(dst io.Writer, src io.Reader) {
	io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 64<<10))
}

func closeWrite(c net.Conn) {
	if cc, ok := c.(*countConn); ok {
		c = cc.Conn
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// splitAuthority reads "host:port", "[v6]:port" (or, with defPort set,
// either without the port): no user information, path, spaces or zone.
// The host is a DNS name or an IP literal, normalized.
func splitAuthority(s string, defPort uint16) (host string, port uint16, err error) {
	if s == "" || strings.ContainsAny(s, "@/?#\\% \t\r\n") {
		return "", 0, fmt.Errorf("egress: %q is not a host:port", s)
	}
	var ps string
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return "", 0, fmt.Errorf("egress: %q: missing ']'", s)
		}
		host, ps = s[1:end], s[end+1:]
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return "", 0, fmt.Errorf("egress: %q: %q is not an IPv6 address", s, host)
		}
		if ps != "" && !strings.HasPrefix(ps, ":") {
			return "", 0, fmt.Errorf("egress: %q is not a host:port", s)
		}
		ps = strings.TrimPrefix(ps, ":")
	} else {
		var hasPort bool
		host, ps, hasPort = strings.Cut(s, ":")
		if hasPort && ps == "" || strings.Contains(ps, ":") {
			return "", 0, fmt.Errorf("egress: %q is not a host:port", s)
		}
		if !validHost(host) {
			return "", 0, fmt.Errorf("egress: %q: %q is not a host name or address", s, host)
		}
	}
	if ps == "" {
		if defPort == 0 {
			return "", 0, fmt.Errorf("egress: %q has no port", s)
		}
		return policy.NormalizeHost(host), defPort, nil
	}
	n, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("egress: %q: bad port %q", s, ps)
	}
	return policy.NormalizeHost(host), uint16(n), nil
}

// validHost reports whether h is an IPv4 literal or a DNS name (letters,
// digits, '-', '_' in dot-separated labels; one trailing dot allowed).
func validHost(h string) bool {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Is4()
	}
	return policy.ValidHostName(strings.ToLower(strings.TrimSuffix(h, ".")))
}

func hostPort(h string, p uint16) string {
	if h == "" {
		return ""
	}
	return net.JoinHostPort(h, strconv.Itoa(int(p)))
}

// outOfFiles reports an accept error that passes once connections end.
func outOfFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS)
}

// dialRefused says whether a dial error was the destination refusing
// the connection (as opposed to unreachable or timed out).
func dialRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// LocalPrefixes returns this device's addresses and the networks its
// interfaces are on, as prefixes, but those within except: what
// [policy.Egress.Local] holds. An error listing the interfaces leaves
// it empty (the non-public ranges still hold).
func LocalPrefixes(except []netip.Prefix) []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if slices.ContainsFunc(except, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			continue
		}
		ones, _ := n.Mask.Size()
		if ip.Is4() && ones > 32 {
			ones -= 96
		}
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		if pfx, err := ip.Prefix(ones); err == nil && pfx.Bits() < ip.BitLen() {
			out = append(out, pfx)
		}
	}
	return out
}
