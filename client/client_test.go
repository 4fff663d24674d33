package client

import (
	"context"
	"crypto/ed25519"
	"io"
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
