package tailnet

import (
	"strings"
	"testing"
)

// TestCheckControlURL: a control URL that is not an http(s) URL with a
// host is refused up front, naming the URL.
func TestCheckControlURL(t *testing.T) {
	for _, ok := range []string{"", "https://headscale.example", "http://127.0.0.1:8080", "https://hs.example/prefix/"} {
		if err := CheckControlURL(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"notaurl", "headscale.example", "ftp://headscale.example", "http://", "https://:443", "http://user:pw@hs.example", "https://hs.example/?x=1", "http://hs example"} {
		err := CheckControlURL(bad)
		if err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: got %v, want an error naming it", bad, err)
		}
	}
}
