package agent

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

// syncBuffer is a log sink safe for the agent's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestUnreachableLoggedOnce: polls that get no answer are logged once
// as "server unreachable" with the reason, not once per retry, and the
// first poll answered after them once as "server reachable again".
func TestUnreachableLoggedOnce(t *testing.T) {
	var polls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == wire.PathPoll && polls.Add(1) <= 2 {
			// No answer: the connection is cut.
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		if r.URL.Path == wire.PathPoll {
			w.Write([]byte(`{"invocation":null}`))
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	a := testAgent(t, srv.URL)
	var logs syncBuffer
	a.waitSwept() // its sweep logs too
	a.log = slog.New(slog.NewTextHandler(&logs, nil))
	a.cfg.Block, a.cfg.HeartbeatEvery = 100*time.Millisecond, time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	for ctx.Err() == nil && (polls.Load() < 4 || !strings.Contains(logs.String(), "reachable again")) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	out := logs.String()
	if n := strings.Count(out, "server unreachable: "+srv.URL+wire.PathPoll); n != 1 {
		t.Errorf("two failed polls in a row logged %d times as server unreachable (with the URL and reason), want once:\n%s", n, out)
	}
	if n := strings.Count(out, "server reachable again"); n != 1 {
		t.Errorf("the recovery logged %d times, want once:\n%s", n, out)
	}
}

// TestHeartbeatFailuresLoggedOnce: heartbeats that keep failing are
// logged at warn once, not every period.
func TestHeartbeatFailuresLoggedOnce(t *testing.T) {
	var beats atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == wire.PathHeartbeat {
			beats.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path == wire.PathPoll {
			w.Write([]byte(`{"invocation":null}`))
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	a := testAgent(t, srv.URL)
	var logs syncBuffer
	a.waitSwept() // its sweep logs too
	a.log = slog.New(slog.NewTextHandler(&logs, nil))
	a.cfg.Block, a.cfg.HeartbeatEvery = 100*time.Millisecond, 20*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	for ctx.Err() == nil && beats.Load() < 5 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if n := strings.Count(logs.String(), "heartbeat failed"); n != 1 {
		t.Errorf("%d failed heartbeats in a row logged %d times at warn, want once:\n%s", beats.Load(), n, logs.String())
	}
}
