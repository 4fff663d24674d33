package client

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
)

// TestErrorNamesTheURLOnce: a request that gets no answer names its URL
// once, and the cause stays in the chain.
func TestErrorNamesTheURLOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + l.Addr().String()
	l.Close() // nothing listens there now
	c := New(base, ed25519.NewKeyFromSeed(make([]byte, 32)), "dev-1", nil)
	_, rerr := c.Register(context.Background(), "DEV.x.y")
	_, eerr := c.Executor(context.Background(), "list_dir")
	herr := c.Heartbeat(context.Background(), map[string]any{})
	for _, err := range []error{rerr, eerr, herr} {
		if err == nil {
			t.Fatal("no error from a closed port")
		}
		if n := strings.Count(err.Error(), base); n != 1 {
			t.Errorf("the URL appears %d times in %q, want once", n, err)
		}
		if !strings.Contains(err.Error(), "nothing listens at "+l.Addr().String()+": is the Metnos server running, and is this its device port (8765)?") {
			t.Errorf("%v: does not say that nothing listens there", err)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%v: the cause is lost from the chain", err)
		}
	}
}

// TestErrorBodiesAreOneLine: an HTML page says "not a Metnos server?"
// with the URL and the status and none of the page; a text body gives
// its first line, cut; a JSON error keeps its code and message.
func TestErrorBodiesAreOneLine(t *testing.T) {
	page := "<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body>\n" +
		strings.Repeat("<p>nginx</p>\n", 40) + "</body></html>\n"
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		want              []string
		not               []string
	}{
		{"html", "text/html; charset=utf-8", page, 404, []string{"not a Metnos server?", "/agent/register answered 404 Not Found with an HTML page"}, []string{"<", "nginx"}},
		{"html-as-text", "text/plain", page, 502, []string{"not a Metnos server?", "502 Bad Gateway"}, []string{"<", "nginx"}},
		{"text", "text/plain", "upstream connect\x1b error\x07\nline two\nline three", 503, []string{`503: upstream connect\x1b error\x07…`}, []string{"line two", "\x1b"}},
		{"long-text", "text/plain", strings.Repeat("x", 500), 500, []string{"500: " + strings.Repeat("x", 120) + "…"}, []string{strings.Repeat("x", 121)}},
		{"empty", "", "", 500, []string{"the server answered 500 Internal Server Error"}, nil},
		{"json", "application/json", `{"error":"invalid_token","message":"no such token"}`, 400, []string{"ask the Metnos admin page", "invalid_token: no such token"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.ctype != "" {
					w.Header().Set("Content-Type", tc.ctype)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			c := New(srv.URL, ed25519.NewKeyFromSeed(make([]byte, 32)), "", nil)
			_, err := c.Register(context.Background(), "DEV.x.y")
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || len(msg) > 400 {
				t.Errorf("more than a short line (%d bytes): %q", len(msg), msg)
			}
			if strings.Count(msg, srv.URL) != 1 {
				t.Errorf("the URL is not named once: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q does not say %q", msg, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(msg, n) {
					t.Errorf("%q says %q", msg, n)
				}
			}
			if StatusOf(err) != tc.status {
				t.Errorf("StatusOf = %d, want %d", StatusOf(err), tc.status)
			}
		})
	}
}
