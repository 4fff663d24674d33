package fetch

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// mirror is a loopback HTTP server with faults.
type mirror struct {
	mu       sync.Mutex
	data     []byte
	etag     string
	fault    func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool // true: handled
	requests int
	served   int64 // body bytes written
	flaked   bool
	delay    time.Duration // before every answer
}

func newMirror(t *testing.T, size int) (*mirror, *httptest.Server) {
	r := rand.New(rand.NewPCG(1, uint64(size)))
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	m := &mirror{data: data, etag: `"v1"`}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	return m, srv
}

type countingWriter struct {
	http.ResponseWriter
	m *mirror
}

func (c countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.m.mu.Lock()
	c.m.served += int64(n)
	c.m.mu.Unlock()
	return n, err
}

func (m *mirror) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.requests++
	n, fault, data, etag, delay := m.requests, m.fault, m.data, m.etag, m.delay
	m.mu.Unlock()
	time.Sleep(delay)
	cw := countingWriter{w, m}
	if fault != nil && fault(m, n, cw, r) {
		return
	}
	w.Header().Set("ETag", etag)
	http.ServeContent(cw, r, "python.tar.gz", time.Unix(1700000000, 0), bytes.NewReader(data))
}

func (m *mirror) pin() Pin {
	sum := sha256.Sum256(m.data)
	return Pin{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(m.data))}
}

func quick() Options {
	return Options{Chunk: 1000, Attempts: 10, Backoff: time.Millisecond, Idle: 2 * time.Second}
}

// check asserts the outcome: a verified file, or an error matching want
// and no file at all.
func check(t *testing.T, dst string, m *mirror, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("download failed: %v", err)
		}
		b, rerr := os.ReadFile(dst)
		if rerr != nil || !bytes.Equal(b, m.data) {
			t.Fatalf("the installed file is not the pinned one (%v)", rerr)
		}
		if _, err := os.Stat(dst + ".part.json"); err == nil {
			t.Error("the state file was left behind")
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want one saying %q", err, want)
	}
	if _, err := os.Stat(dst); err == nil {
		t.Fatal("a file was installed despite the error")
	}
}

func TestFaults(t *testing.T) {
	const size = 10_500
	for _, tc := range []struct {
		name  string
		fault func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool
		pin   func(m *mirror) Pin
		want  string // "" for success
		log   string // what the log must say
		nolog string // what it must not
	}{
		{name: "transient-416-inside-the-file", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if n != 2 {
				return false
			}
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", len(m.data)))
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return true
		}, nolog: "fetching every chunk twice"},
		{name: "server-ignores-if-range", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if n == 3 {
				m.mu.Lock()
				m.data = append([]byte("new version!"), m.data[12:]...)
				m.etag = `"v2"`
				m.mu.Unlock()
			}
			r.Header.Del("If-Range")
			return false
		}, pin: func(m *mirror) Pin {
			d := append([]byte("new version!"), m.data[12:]...)
			sum := sha256.Sum256(d)
			return Pin{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(d))}
		}, log: "another ETag", nolog: "fetching every chunk twice"},
		{name: "plain"},
		{name: "ignores-range", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			w.Write(m.data)
			return true
		}},
		{name: "wrong-content-range-then-ok", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if n%3 != 1 {
				return false
			}
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 1-1000/%d", len(m.data)))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(m.data[1:1001])
			return true
		}},
		{name: "always-wrong-content-range", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 1-1000/%d", len(m.data)))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(m.data[1:1001])
			return true
		}, want: "Content-Range"},
		{name: "short-body", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if n%2 == 0 {
				return false
			}
			var a, b int
			fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &a, &b)
			b = min(b, len(m.data)-1)
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", a, b, len(m.data)))
			w.Header().Set("Content-Length", fmt.Sprint(b-a+1))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(m.data[a : a+(b-a)/2])
			return true
		}},
		{name: "reset-mid-chunk", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if n%2 == 0 {
				return false
			}
			var a, b int
			fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &a, &b)
			b = min(b, len(m.data)-1)
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", a, b, len(m.data)))
			w.Header().Set("Content-Length", fmt.Sprint(b-a+1))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(m.data[a : a+10])
			w.(countingWriter).ResponseWriter.(http.Flusher).Flush()
			conn, _, _ := w.(countingWriter).ResponseWriter.(http.Hijacker).Hijack()
			conn.Close()
			return true
		}},
		{name: "flaky-mirror", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if r.Header.Get("Range") != "bytes=3000-3999" || m.flaked {
				return false // one bad chunk in the first pass
			}
			m.flaked = true
			bad := append([]byte(nil), m.data...)
			bad[3500] ^= 0xff
			w.Header().Set("ETag", m.etag)
			http.ServeContent(w, r, "x", time.Unix(1700000000, 0), bytes.NewReader(bad))
			return true
		}, log: "fetching every chunk twice"},
		{name: "file-changes-between-chunks", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if n == 3 {
				m.mu.Lock()
				m.data = append([]byte("changed!"), m.data[8:]...)
				m.etag = `"v2"`
				m.mu.Unlock()
			}
			return false
		}, want: "pin or the upstream file is wrong", log: "starting over"},
		{name: "slow-trickle-then-ok", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if n != 2 {
				return false
			}
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 1000-1999/%d", len(m.data)))
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusPartialContent)
			w.Write(m.data[1000:1001])
			w.(countingWriter).ResponseWriter.(http.Flusher).Flush()
			time.Sleep(3 * time.Second) // beyond the idle timeout
			return true
		}},
		{name: "lying-content-length", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Length", fmt.Sprint(len(m.data)+100))
			w.WriteHeader(http.StatusOK)
			w.Write(m.data)
			return true
		}, want: "the pin says"},
		{name: "gzip-encoded", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			gz.Write(m.data)
			gz.Close()
			return true
		}, want: "gzip-encoded"},
		{name: "redirect", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/file" {
				http.Redirect(w, r, "/real", http.StatusFound)
				return true
			}
			return false
		}},
		{name: "not-found", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			http.NotFound(w, r)
			return true
		}, want: "404"},
		{name: "html-error-page", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Write([]byte("<html><body>Service temporarily unavailable</body></html>"))
			return true
		}, want: "HTML page"},
		{name: "wrong-pin", pin: func(m *mirror) Pin {
			p := m.pin()
			p.SHA256 = strings.Repeat("0", 64)
			return p
		}, want: "pin or the upstream file is wrong"},
		{name: "wrong-size-pin", pin: func(m *mirror) Pin {
			p := m.pin()
			p.Size++
			return p
		}, want: "pin says"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, srv := newMirror(t, size)
			m.fault = tc.fault
			pin := m.pin()
			if tc.pin != nil {
				pin = tc.pin(m)
			}
			dst := filepath.Join(t.TempDir(), "python.tar.gz")
			o := quick()
			if tc.name == "slow-trickle-then-ok" {
				o.Idle = 300 * time.Millisecond
			}
			var logs bytes.Buffer
			o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			err := File(context.Background(), srv.URL+"/file", dst, pin, o)
			check(t, dst, m, err, tc.want)
			if !strings.Contains(logs.String(), tc.log) {
				t.Errorf("the log does not say %q:\n%s", tc.log, logs.String())
			}
			if tc.nolog != "" && strings.Contains(logs.String(), tc.nolog) {
				t.Errorf("the log says %q:\n%s", tc.nolog, logs.String())
			}
		})
	}
}

// TestResume: a download stopped half-way resumes from what was
// committed, re-downloading nothing already there.
func TestResume(t *testing.T) {
	m, srv := newMirror(t, 10_000)
	dst := filepath.Join(t.TempDir(), "f")
	ctx, cancel := context.WithCancel(context.Background())
	o := quick()
	o.Parallel = 1 // nothing in flight beyond the chunk that stops it
	o.Progress = func(p Progress) {
		if p.Done >= 5000 {
			cancel()
		}
	}
	if err := File(ctx, srv.URL, dst, m.pin(), o); err == nil {
		t.Fatal("the cancelled download succeeded")
	}
	m.mu.Lock()
	first := m.served
	m.mu.Unlock()
	if first < 5000 || first > 6000 {
		t.Fatalf("served %d bytes before the stop", first)
	}
	err := File(context.Background(), srv.URL, dst, m.pin(), quick())
	check(t, dst, m, err, "")
	m.mu.Lock()
	defer m.mu.Unlock()
	if again := m.served - first; again != int64(len(m.data))-5000 {
		t.Errorf("the resume downloaded %d bytes, want the %d not yet committed", again, int64(len(m.data))-5000)
	}
}

// Test416OnCompleteFile: a .part that is already whole (its size
// unknown to the state) is finished, not downloaded again.
func Test416OnCompleteFile(t *testing.T) {
	m, srv := newMirror(t, 3000)
	dst := filepath.Join(t.TempDir(), "f")
	os.WriteFile(dst+".part", m.data, 0o644)
	os.WriteFile(dst+".part.json", []byte(fmt.Sprintf(`{"url":%q,"sha256":%q,"size":0,"committed":3000}`, srv.URL, m.pin().SHA256)), 0o644)
	err := File(context.Background(), srv.URL, dst, Pin{SHA256: m.pin().SHA256}, quick())
	check(t, dst, m, err, "")
	if m.served > 100 || m.requests != 1 {
		t.Errorf("%d bytes in %d requests: the file was downloaded again", m.served, m.requests)
	}
}

func TestBadPin(t *testing.T) {
	err := File(context.Background(), "http://127.0.0.1:1/x", filepath.Join(t.TempDir(), "f"), Pin{SHA256: "abc"}, quick())
	if err == nil || !strings.Contains(err.Error(), "64 hex") {
		t.Fatal(err)
	}
}
