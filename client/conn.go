package client

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync/atomic"
	"time"
)

// Idle limits: how long a request's connection may carry no byte
// before the request fails as a dead connection (a path that went away
// without closing it, as a tailnet or Wi-Fi outage leaves it). The
// server answers a poll within its block_ms, and every other request
// at once.
const (
	// PollMargin is what a poll allows on top of its block_ms for the
	// answer to arrive.
	PollMargin = 5 * time.Second
	// AnswerIdle is how long any other request of the protocol waits
	// for a byte of its answer (or a byte of its own body to go out).
	AnswerIdle = 15 * time.Second
	// idleConnTimeout closes a pooled connection before its idle limit
	// could fire while it waits in the pool.
	idleConnTimeout = 10 * time.Second
)

// idleKey is the context key of a request's *watch.
type idleKey struct{}

// watch is what one request of the client asks of its connection (its
// idle limit) and learns of it (whether it was reused from the pool).
type watch struct {
	idle   time.Duration
	reused atomic.Bool
}

// withWatch gives a request's context its watch.
func withWatch(ctx context.Context, w *watch) context.Context {
	return context.WithValue(ctx, idleKey{}, w)
}

// newTransport is the client's transport: connections through dial
// (nil: the OS network, with TCP keep-alive probes), each watched for
// its request's idle limit.
func newTransport(dial Dialer) http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if dial == nil {
		d := &net.Dialer{Timeout: 30 * time.Second,
			KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}}
		dial = d.DialContext
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &watchedConn{Conn: c}, nil
	}
	t.IdleConnTimeout = idleConnTimeout
	// HTTP/1.1 only, as the protocol is (docs/protocol.md §1.2), over
	// https too: each request must have its connection to itself, or one
	// request's idle limit would be set on the connection another (a long
	// poll) waits on in silence.
	t.ForceAttemptHTTP2 = false
	t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	return idleTransport{t}
}

// idleTransport hands each request's idle limit (none for a request
// that set none, such as a runtime download, which watches its own) to
// the connection it gets.
type idleTransport struct{ *http.Transport }

func (t idleTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	w, _ := req.Context().Value(idleKey{}).(*watch)
	var idle time.Duration
	if w != nil {
		idle = w.idle
	}
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if w != nil && info.Reused {
			w.reused.Store(true)
		}
		c := info.Conn
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn()
		}
		if wc, ok := c.(*watchedConn); ok {
			wc.setIdle(idle)
		}
	}}
	ctx := httptrace.WithClientTrace(req.Context(), trace)
	return t.Transport.RoundTrip(req.WithContext(ctx))
}

// watchedConn fails a read when the connection has carried no byte,
// either way, for its request's idle limit: HTTP/1.1 has no ping, and
// a dead path otherwise leaves a request waiting for its whole timeout.
type watchedConn struct {
	net.Conn
	idle atomic.Int64 // nanoseconds; 0: no limit
}

func (c *watchedConn) setIdle(d time.Duration) {
	c.idle.Store(int64(d))
	c.extend()
}

// extend moves the read deadline to the idle limit from now.
func (c *watchedConn) extend() {
	if d := time.Duration(c.idle.Load()); d > 0 {
		c.Conn.SetReadDeadline(time.Now().Add(d))
	} else {
		c.Conn.SetReadDeadline(time.Time{})
	}
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.extend()
	}
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.extend()
	}
	return n, err
}

// deadConn reports whether err is a connection's idle limit passing.
func deadConn(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
