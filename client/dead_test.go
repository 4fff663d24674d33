package client

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

// stallingServer answers every request at once, except the ones stall
// picks, which it never answers (until the test ends): as a path that
// died under a connection, the client sees no byte come back.
func stallingServer(t *testing.T, stall func(path string, n int) bool) *httptest.Server {
	t.Helper()
	done := make(chan struct{})
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stall(r.URL.Path, int(n.Add(1))) {
			select {
			case <-done:
			case <-r.Context().Done():
			}
			return
		}
		if r.URL.Path == wire.PathPoll {
			w.Write([]byte(`{"invocation":null}`))
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	return srv
}

// testClient is a client of srv whose idle limits are short.
func testClient(srv *httptest.Server) *Client {
	c := New(srv.URL, ed25519.NewKeyFromSeed(make([]byte, 32)), "dev", nil)
	c.answerIdle, c.pollMargin = 300*time.Millisecond, 300*time.Millisecond
	return c
}

// TestHeartbeatRetriedOnDeadConnection: a heartbeat that gets no byte
// back (a connection the outage left dead) fails at its idle limit, not
// its 40 s timeout, and is sent once more on a new connection, which
// the server answers.
func TestHeartbeatRetriedOnDeadConnection(t *testing.T) {
	srv := stallingServer(t, func(path string, n int) bool { return n == 1 })
	c := testClient(srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Heartbeat(ctx, map[string]any{"agent": "test"}); err != nil {
		t.Fatalf("the heartbeat was not retried on a new connection: %v (after %s)", err, time.Since(start))
	}
}

// TestPollDeadConnection: a poll whose connection stays silent past its
// block and margin fails then, saying that no data came, instead of
// waiting its whole timeout (block + 15 s) and saying "context
// deadline exceeded".
func TestPollDeadConnection(t *testing.T) {
	srv := stallingServer(t, func(string, int) bool { return true })
	c := testClient(srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Poll(ctx, "", 200*time.Millisecond)
	if ctx.Err() != nil {
		t.Fatalf("the poll on a silent connection waited past 5 s: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "no data for") || StatusOf(err) != 0 {
		t.Fatalf("poll on a silent connection: %v", err)
	}
	if strings.Count(err.Error(), srv.URL) != 1 {
		t.Errorf("the error names the URL other than once: %v", err)
	}
	t.Logf("failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestDeadConnectionCutsPolls: when another request finds its
// connection dead, the poll in flight (whose connection went through
// the same path) is cut short at once rather than waited on for its
// whole block.
func TestDeadConnectionCutsPolls(t *testing.T) {
	srv := stallingServer(t, func(string, int) bool { return true })
	c := testClient(srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	polled := make(chan error, 1)
	go func() {
		_, err := c.Poll(ctx, "", 20*time.Second)
		polled <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := c.Executor(ctx, "echo_args"); err == nil || !strings.Contains(err.Error(), "no data for") {
		t.Fatalf("a request on a silent connection: %v", err)
	}
	select {
	case err := <-polled:
		if !errors.Is(err, ErrPathDead) {
			t.Fatalf("the poll ended with %v, want ErrPathDead", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the poll in flight was not cut short when another request found the path dead")
	}
}

// TestReconnectCutsPolls: Reconnect (the path changed) cuts the poll in
// flight short at once.
func TestReconnectCutsPolls(t *testing.T) {
	srv := stallingServer(t, func(string, int) bool { return true })
	c := testClient(srv)
	polled := make(chan error, 1)
	go func() {
		_, err := c.Poll(context.Background(), "", 20*time.Second)
		polled <- err
	}()
	time.Sleep(100 * time.Millisecond)
	c.Reconnect()
	select {
	case err := <-polled:
		// ErrReconnected: the caller's own doing, which the agent does
		// not report as the server being unreachable.
		if !errors.Is(err, ErrPathDead) || !errors.Is(err, ErrReconnected) {
			t.Fatalf("the poll ended with %v, want ErrReconnected (an ErrPathDead)", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Reconnect did not cut the poll in flight short")
	}
}

// TestHTTPSLongPollBesideHeartbeat: over https with a server that
// offers HTTP/2, a heartbeat sent while a long poll waits in silence
// does not set its short idle limit on the poll's connection: each
// request has a connection of its own (HTTP/1.1, as the protocol is),
// and the poll gets its answer.
func TestHTTPSLongPollBesideHeartbeat(t *testing.T) {
	var protos sync.Map
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos.Store(r.Proto, true)
		if r.URL.Path == wire.PathPoll {
			time.Sleep(time.Second) // silent for longer than the heartbeat's idle limit
			w.Write([]byte(`{"invocation":null}`))
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	c := testClient(srv)
	c.pollMargin = 2 * time.Second
	c.hc.Transport.(idleTransport).TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	polled := make(chan error, 1)
	go func() {
		_, err := c.Poll(ctx, "", time.Second)
		polled <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := c.Heartbeat(ctx, map[string]any{"agent": "test"}); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	if err := <-polled; err != nil {
		t.Fatalf("the poll failed beside a heartbeat: %v", err)
	}
	protos.Range(func(k, _ any) bool {
		if k != "HTTP/1.1" {
			t.Errorf("a request went as %v; the protocol is HTTP/1.1", k)
		}
		return true
	})
}
