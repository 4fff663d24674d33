package egress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// serveHTTP serves one HTTP request: CONNECT, or a forwarded http://
// absolute URI. One request per connection.
func (p *Proxy) serveHTTP(c net.Conn, br *bufio.Reader) {
	r := &pending{p: p, Record: Record{Proto: "http", Verdict: "refused"}}
	defer r.finish()
	head, err := readHead(br)
	if err != nil {
		r.Reason = err.Error()
		code := http.StatusBadRequest
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			code = http.StatusRequestTimeout
		}
		r.answer(c, code, "bad-request")
		return
	}
	hostHeaders := rawHostHeaders(head)
	// head ends at its blank line: the headers ReadRequest reads are
	// head's, and a body, or a tunnel's first bytes, come after it.
	cr := bufio.NewReader(io.MultiReader(bytes.NewReader(head), br))
	req, err := http.ReadRequest(cr)
	if err != nil {
		r.Reason = "malformed request: " + err.Error()
		r.answer(c, http.StatusBadRequest, "bad-request")
		return
	}
	c.SetReadDeadline(time.Time{})
	if req.Method == http.MethodConnect {
		r.Proto = "connect"
		p.serveConnect(c, cr, req, hostHeaders, r)
		return
	}
	p.forward(c, req, hostHeaders, r)
}

// bad answers 400 and records the refusal.
func bad(c net.Conn, r *pending, format string, args ...any) {
	r.Reason = fmt.Sprintf(format, args...)
	r.answer(c, http.StatusBadRequest, "bad-request")
}

func (p *Proxy) serveConnect(c net.Conn, cr *bufio.Reader, req *http.Request, hostHeaders []string, r *pending) {
	host, port, err := splitAuthority(req.RequestURI, 0)
	if err != nil {
		bad(c, r, "CONNECT wants host:port: %v", err)
		return
	}
	r.Host, r.Port = host, port
	for _, h := range hostHeaders {
		if !sameAuthority(h, host, port, port) {
			bad(c, r, "the Host header %q names another host than CONNECT %s", h, req.RequestURI)
			return
		}
	}
	up, ok := p.dialFor(c, r)
	if !ok {
		return
	}
	defer p.untrack(up)
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		r.Reason = "client gone: " + err.Error()
		return
	}
	pipe(c, cr, up)
	r.Up, r.Down = up.up.Load(), up.down.Load()
}

// forward sends one request for an absolute http:// URI in origin form,
// hop-by-hop and Proxy-* headers removed, and its response back, both
// with "Connection: close".
func (p *Proxy) forward(c net.Conn, req *http.Request, hostHeaders []string, r *pending) {
	uri := req.RequestURI
	switch lower := strings.ToLower(uri); {
	case strings.HasPrefix(lower, "https://"):
		bad(c, r, "%s: https:// goes through CONNECT (set HTTPS_PROXY), not a forwarded request", uri)
		return
	case strings.HasPrefix(uri, "/") || uri == "*":
		bad(c, r, "%s: this is a proxy: the request must name an absolute http:// URI", uri)
		return
	case !strings.HasPrefix(lower, "http://"):
		bad(c, r, "%s: only http:// URIs are forwarded (https:// through CONNECT)", uri)
		return
	}
	if req.URL.User != nil {
		bad(c, r, "%s: user information in the URI is refused", uri)
		return
	}
	host, port, err := splitAuthority(req.URL.Host, 80)
	if err != nil {
		bad(c, r, "%s: %v", uri, err)
		return
	}
	r.Host, r.Port = host, port
	for _, h := range hostHeaders {
		if !sameAuthority(h, host, port, 80) {
			bad(c, r, "the Host header %q names another host than the URI %s", h, uri)
			return
		}
	}
	up, ok := p.dialFor(c, r)
	if !ok {
		return
	}
	defer p.untrack(up)
	defer func() { r.Up, r.Down = up.up.Load(), up.down.Load() }()

	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		req.Header.Del("Expect")
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
	}
	removeHopByHop(req.Header)
	req.RequestURI = ""
	req.Host = req.URL.Host
	req.Close = true
	// A failure after the request went out is recorded with the bytes
	// that did go each way.
	counted := func() { r.Up, r.Down = up.up.Load(), up.down.Load() }
	if err := req.Write(up); err != nil {
		r.Reason = fmt.Sprintf("sending the request to %s: %v", hostPort(host, port), err)
		counted()
		r.answer(c, http.StatusBadGateway, "")
		return
	}
	// The response head, 1xx ones included, may take maxHead bytes: a
	// server cannot make the agent hold an endless head. (A server that
	// never answers is cut when the run ends and the proxy closes.)
	lim := &io.LimitedReader{R: up, N: maxHead}
	upr := bufio.NewReader(lim)
	for informational := 0; ; informational++ {
		resp, err := http.ReadResponse(upr, req)
		if err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			if informational < 8 {
				continue // 1xx: the 100 Continue is ours; the rest informational
			}
			err = errors.New("more than 8 informational (1xx) responses")
		}
		if err != nil {
			if lim.N <= 0 {
				err = fmt.Errorf("the response head is longer than %d bytes", maxHead)
			}
			r.Reason = fmt.Sprintf("reading the response of %s: %v", hostPort(host, port), err)
			counted()
			r.answer(c, http.StatusBadGateway, "")
			return
		}
		// The head is written again without its hop-by-hop fields; the
		// body goes as the server framed it, the bytes read ahead
		// first, then socket to socket (splice on Linux) until the
		// server closes, as it does after one response (Connection:
		// close).
		removeHopByHop(resp.Header)
		head := &bytes.Buffer{}
		fmt.Fprintf(head, "HTTP/%d.%d %s\r\n", resp.ProtoMajor, resp.ProtoMinor, resp.Status)
		resp.Header.Write(head)
		if len(resp.TransferEncoding) > 0 {
			fmt.Fprintf(head, "Transfer-Encoding: %s\r\n", strings.Join(resp.TransferEncoding, ", "))
		} else if resp.ContentLength >= 0 && resp.Header.Get("Content-Length") == "" && bodyAllowed(req.Method, resp.StatusCode) {
			fmt.Fprintf(head, "Content-Length: %d\r\n", resp.ContentLength)
		}
		head.WriteString("Connection: close\r\n\r\n")
		if _, err := c.Write(head.Bytes()); err != nil {
			r.Reason = "client gone: " + err.Error()
			return
		}
		if n := upr.Buffered(); n > 0 {
			b, _ := upr.Peek(n)
			_, err := c.Write(b) // read through up: counted already
			if err != nil {
				r.Reason = "client gone: " + err.Error()
				return
			}
		}
		n, _ := io.Copy(c, up.Conn)
		up.down.Add(n)
		return
	}
}

// bodyAllowed reports whether a response to method with status code
// may carry a body (RFC 9110 §6.4.1).
func bodyAllowed(method string, code int) bool {
	return method != http.MethodHead && code != http.StatusNoContent && code != http.StatusNotModified && (code < 100 || code >= 200)
}

// dialFor connects to r's destination, answering the client a 403 (with
// X-Proxy-Error) or 502 and recording why when it cannot.
func (p *Proxy) dialFor(c net.Conn, r *pending) (*countConn, bool) {
	up, addr, err := p.connect(r.Host, r.Port)
	r.Addr = addr
	if err != nil {
		r.Reason = err.Error()
		if rf := refusalOf(err); rf != nil {
			r.answer(c, http.StatusForbidden, "blocked-by-"+rf.List)
		} else {
			r.Verdict = "allowed"
			r.answer(c, http.StatusBadGateway, "")
		}
		return nil, false
	}
	r.Verdict = "allowed"
	cu := &countConn{Conn: up}
	if !p.track(cu) {
		r.Reason = "proxy closed"
		return nil, false
	}
	return cu, true
}

// readHead reads a request head up to and including the empty line, at
// most 64 KiB.
func readHead(br *bufio.Reader) ([]byte, error) {
	var head []byte
	// atStart: the next byte begins a line (a long line comes in
	// pieces of the buffer's size, and its last piece may be "\r\n").
	atStart := false
	for {
		line, err := br.ReadSlice('\n')
		head = append(head, line...)
		if len(head) > maxHead {
			return nil, fmt.Errorf("request head longer than %d bytes", maxHead)
		}
		if err == bufio.ErrBufferFull {
			atStart = false
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the request head: %w", err)
		}
		if atStart && (string(line) == "\r\n" || string(line) == "\n") {
			return head, nil
		}
		atStart = true
	}
}

// rawHostHeaders returns the values of the Host header lines of head
// (http.ReadRequest hides them when the URI is absolute).
func rawHostHeaders(head []byte) []string {
	var hosts []string
	lines := strings.Split(string(head), "\n")
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(strings.TrimRight(l, "\r"), ":")
		if ok && strings.EqualFold(strings.TrimSpace(name), "host") {
			hosts = append(hosts, strings.TrimSpace(value))
		}
	}
	return hosts
}

// sameAuthority reports whether a Host header names host:port (its port
// defaulting to defPort).
func sameAuthority(header, host string, port, defPort uint16) bool {
	h, p, err := splitAuthority(header, defPort)
	return err == nil && h == host && p == port
}

var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
	for k := range h {
		if strings.HasPrefix(k, "Proxy-") {
			delete(h, k)
		}
	}
}

// answer records r, then answers the client code with r.Reason as the
// body: recorded first, so that Records is in the order the clients
// were answered.
func (r *pending) answer(c net.Conn, code int, xerr string) {
	r.finish()
	httpError(c, code, xerr, r.Reason)
}

// httpError answers a one-line text body, with X-Proxy-Error when xerr
// is set.
func httpError(w io.Writer, code int, xerr, msg string) {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	b.WriteString("Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n")
	if xerr != "" {
		fmt.Fprintf(&b, "X-Proxy-Error: %s\r\n", xerr)
	}
	body := strings.ReplaceAll(msg, "\n", " ") + "\n"
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	io.WriteString(w, b.String())
}
