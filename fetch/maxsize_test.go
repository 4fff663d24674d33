package fetch

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestMaxSize: with a sha256 pin and no size, a server that ignores
// Range and streams an endless body without a length (or says the
// file is larger than MaxSize) is cut off at MaxSize, at once and
// without retries, and nothing of it is left to resume.
func TestMaxSize(t *testing.T) {
	const max = 1 << 20
	for _, tc := range []struct {
		name   string
		length bool
	}{{"endless body, no length", false}, {"Content-Length too large", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var requests, served atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				if tc.length {
					w.Header().Set("Content-Length", "1099511627776")
				}
				w.WriteHeader(http.StatusOK)
				buf := make([]byte, 64<<10)
				for served.Load() < 8*max {
					n, err := w.Write(buf)
					served.Add(int64(n))
					if err != nil {
						return
					}
				}
			}))
			t.Cleanup(srv.Close)
			dst := filepath.Join(t.TempDir(), "file")
			o := quick()
			o.MaxSize = max
			err := File(context.Background(), srv.URL+"/file", dst, Pin{SHA256: strings.Repeat("ab", 32)}, o)
			var perm *permanentError
			if err == nil || !errors.As(err, &perm) || !strings.Contains(err.Error(), "more than the 1048576") {
				t.Fatalf("File: %v, want the size refused", err)
			}
			if n := requests.Load(); n != 1 {
				t.Errorf("%d requests, want 1: a file too large is not asked for again", n)
			}
			if fi, err := os.Stat(dst + ".part"); err == nil && fi.Size() > 0 {
				t.Errorf("%d bytes are kept in %s", fi.Size(), dst+".part")
			}
		})
	}
}
