package client

import (
	"context"
	"crypto/ed25519"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// TestServerErrorSentences: each error code of the protocol becomes one
// sentence that says what to do.
func TestServerErrorSentences(t *testing.T) {
	for code, want := range map[string]string{
		"invalid_token":      "ask the Metnos admin page for a new one",
		"token_already_used": "already used by another device",
		"unknown_device":     "pair again",
		"bad_signature":      "signature",
		"internal_error":     "see its log",
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(400)
			io.WriteString(w, `{"error":"`+code+`","message":"details here"}`)
		}))
		c := New(srv.URL+"/", ed25519.NewKeyFromSeed(make([]byte, 32)), "", nil)
		_, err := c.Register(context.Background(), "DEV.x.y")
		srv.Close()
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "details here") || strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("%s: %v", code, err)
		}
	}
	if StatusOf(os.ErrNotExist) != 0 {
		t.Error("StatusOf of a non-server error")
	}
}

// TestOneTransport: every request goes through the dialer given, and
// none follows a redirect, runtime downloads through HTTPClient
// included.
func TestOneTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	}))
	defer srv.Close()
	dials := 0
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials++
		return (&net.Dialer{}).DialContext(ctx, network, strings.TrimPrefix(srv.URL, "http://"))
	}
	c := New("http://server.invalid:8765", ed25519.NewKeyFromSeed(make([]byte, 32)), "dev", dial)
	if _, err := c.Shim(context.Background()); StatusOf(err) != http.StatusFound {
		t.Errorf("a redirect was followed, or the dialer not used: %v", err)
	}
	resp, err := c.HTTPClient().Get(c.RuntimeURL("a.tar.gz"))
	if err != nil || resp.StatusCode != http.StatusFound {
		t.Errorf("runtime download: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if dials == 0 {
		t.Error("the dialer was not used")
	}
	if got := c.RuntimeURL("a.tar.gz"); got != "http://server.invalid:8765/agent/runtime/a.tar.gz" {
		t.Errorf("RuntimeURL %s", got)
	}
}
