package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

// hugeServer answers every request with size bytes of spaces (a body
// announced with its Content-Length when announce is set, else
// streamed), counting the bytes it managed to send.
func hugeServer(t *testing.T, size int64, announce bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if announce {
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		}
		chunk := []byte(strings.Repeat(" ", 64<<10))
		for n := int64(0); n < size; n += int64(len(chunk)) {
			k, err := w.Write(chunk)
			served.Add(int64(k))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &served
}

// TestHugeAnswerRefused: a server that answers 200 MiB (streamed) or
// announces 2 GiB gets one sentence, "the answer from URL is larger
// than N MiB: not a Metnos server?", after at most about the limit was
// read: the agent's memory stays bounded (it read up to 64 MiB of any
// answer, then fed the cut body to the JSON decoder, "EOF").
func TestHugeAnswerRefused(t *testing.T) {
	for _, tc := range []struct {
		name     string
		size     int64
		announce bool
		call     func(*Client) error
		limit    int64
		path     string
	}{
		{"poll-streamed", 200 << 20, false, func(c *Client) error { _, err := c.Poll(context.Background(), "", time.Second); return err }, pollAnswer, wire.PathPoll},
		{"register-streamed", 200 << 20, false, func(c *Client) error { _, err := c.Register(context.Background(), "DEV.x"); return err }, smallAnswer, wire.PathRegister},
		{"heartbeat-announced", 2 << 30, true, func(c *Client) error { return c.Heartbeat(context.Background(), map[string]any{}) }, smallAnswer, wire.PathHeartbeat},
		{"register-announced", 2 << 30, true, func(c *Client) error { _, err := c.Register(context.Background(), "DEV.x"); return err }, smallAnswer, wire.PathRegister},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, served := hugeServer(t, tc.size, tc.announce)
			c := testClient(srv)
			c.answerIdle = 5 * time.Second
			err := tc.call(c)
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("a %d MiB answer: %v, want ErrTooLarge", tc.size>>20, err)
			}
			want := "the answer from " + srv.URL + tc.path + " is larger than " + strconv.FormatInt(tc.limit>>20, 10) + " MiB: not a Metnos server?"
			if err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
			srv.Close() // waits for the handler: served is final
			// What the kernel buffers on the way is on top of what was read.
			if got, most := served.Load(), tc.limit+8<<20; got > most {
				t.Errorf("the server sent %d MiB before the client stopped reading, want at most %d MiB", got>>20, most>>20)
			}
			if tc.announce && served.Load() > 8<<20 {
				t.Errorf("an answer announced as %d MiB was read (%d MiB sent) instead of refused up front", tc.size>>20, served.Load()>>20)
			}
		})
	}
}

// TestStalledServerSaysSo: a server that never answers, or sends its
// headers and stops, gives one sentence naming the URL once and saying
// that no answer or no data came, not "context deadline exceeded" or
// "read tcp …: i/o timeout".
func TestStalledServerSaysSo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(w http.ResponseWriter, r *http.Request, done <-chan struct{})
		want    string
	}{
		{"no-answer", func(w http.ResponseWriter, r *http.Request, done <-chan struct{}) { <-done }, ": no data for 0.3 s (is the server up?"},
		{"headers-then-stop", func(w http.ResponseWriter, r *http.Request, done <-chan struct{}) {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(200)
			w.Write([]byte(`{"device_id":`))
			w.(http.Flusher).Flush()
			<-done
		}, ": no data for 0.3 s (is the server up?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				default:
					tc.handler(w, r, done)
				}
			}))
			defer srv.Close()
			defer close(done)
			c := testClient(srv)
			_, err := c.Register(context.Background(), "DEV.x")
			if err == nil {
				t.Fatal("no error from a stalled server")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, srv.URL+wire.PathRegister+tc.want) {
				t.Errorf("error %q, want it to start with the URL and %q", msg, tc.want)
			}
			if strings.Count(msg, srv.URL) != 1 {
				t.Errorf("the URL appears other than once in %q", msg)
			}
			for _, raw := range []string{"deadline exceeded", "i/o timeout", "read tcp"} {
				if strings.Contains(msg, raw) {
					t.Errorf("raw Go words %q in %q", raw, msg)
				}
			}
		})
	}
	t.Run("overall-timeout", func(t *testing.T) {
		// The request's own timeout passes first (the idle limit is longer).
		done := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-done:
			case <-r.Context().Done():
			}
		}))
		defer srv.Close()
		defer close(done)
		c := testClient(srv)
		c.answerIdle = time.Minute
		_, err := c.send(withWatch(context.Background(), &watch{idle: time.Minute}), http.MethodPost, wire.PathRegister, []byte("{}"), false, 300*time.Millisecond, smallAnswer, &watch{idle: time.Minute})
		want := srv.URL + wire.PathRegister + ": no answer within 0.3 s (is the server up?"
		if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "deadline exceeded") {
			t.Errorf("error %v, want it to start with %q", err, want)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%v: the cause is lost from the chain", err)
		}
	})
}

// TestPollCutByStalledRequestSaysSo: a poll cut short because another
// request got no data says that, not that the path "went away or
// changed" (which only Reconnect knows); both are ErrPathDead.
func TestPollCutByStalledRequestSaysSo(t *testing.T) {
	srv := stallingServer(t, func(string, int) bool { return true })
	c := testClient(srv)
	polled := make(chan error, 1)
	go func() {
		_, err := c.Poll(context.Background(), "", 20*time.Second)
		polled <- err
	}()
	time.Sleep(100 * time.Millisecond)
	c.Executor(context.Background(), "echo_args")
	select {
	case err := <-polled:
		if !errors.Is(err, ErrPathDead) {
			t.Fatalf("the poll ended with %v, want ErrPathDead", err)
		}
		if strings.Contains(err.Error(), "went away or changed") || !strings.Contains(err.Error(), "another request to the server got no data") {
			t.Errorf("the poll cut by a stalled request says %q", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the poll in flight was not cut short")
	}
}

// TestNotAMetnosServerAnswers: a 200 answer to register that is an HTML
// page or garbage says "not a Metnos server?" and what came, with no Go
// JSON error in it.
func TestNotAMetnosServerAnswers(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"html", "<!DOCTYPE html><html><body>It works!</body></html>", "with an HTML page"},
		{"garbage", "\x00\x01\x02binary", "with something that is not JSON"},
		{"other-json", `{"hello":"world"}`, "with JSON that is not a registration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(tc.body)) }))
			defer srv.Close()
			_, err := testClient(srv).Register(context.Background(), "DEV.x")
			want := "not a Metnos server? " + srv.URL + wire.PathRegister + " answered " + tc.want
			if err == nil || err.Error() != want {
				t.Errorf("error %v, want %q", err, want)
			}
		})
	}
}
