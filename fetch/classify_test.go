package fetch

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/layout"
)

// TestPermanentErrorsFailAtOnce: what no retry can mend costs one
// request (or none), and what may pass is retried; the count of
// requests is what a user waits for, not the clock.
func TestPermanentErrorsFailAtOnce(t *testing.T) {
	status := func(code int) func(*mirror, int, http.ResponseWriter, *http.Request) bool {
		return func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			w.WriteHeader(code)
			return true
		}
	}
	for _, tc := range []struct {
		name     string
		fault    func(*mirror, int, http.ResponseWriter, *http.Request) bool
		pin      func(Pin) Pin
		requests int
		want     string
	}{
		{name: "404", fault: status(404), requests: 1, want: "404 Not Found"},
		{name: "410", fault: status(410), requests: 1, want: "410 Gone"},
		{name: "400", fault: status(400), requests: 1, want: "400 Bad Request"},
		{name: "size-contradicts-the-pin", pin: func(p Pin) Pin { p.Size++; return p }, requests: 1, want: "the pin says"},
		{name: "whole-file-size-contradicts-the-pin", fault: func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Length", fmt.Sprint(len(m.data)))
			w.Write(m.data)
			return true
		}, pin: func(p Pin) Pin { p.Size--; return p }, requests: 1, want: "the pin says"},
		{name: "503-is-retried", fault: status(503), requests: 4, want: "503 Service Unavailable"},
		{name: "429-is-retried", fault: status(429), requests: 4, want: "429 Too Many Requests"},
		{name: "408-is-retried", fault: status(408), requests: 4, want: "408 Request Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, srv := newMirror(t, 3000)
			m.fault = tc.fault
			pin := m.pin()
			if tc.pin != nil {
				pin = tc.pin(pin)
			}
			o := quick()
			o.Attempts = 4
			dst := filepath.Join(t.TempDir(), "f")
			err := File(context.Background(), srv.URL+"/f", dst, pin, o)
			check(t, dst, m, err, tc.want)
			if n := strings.Count(err.Error(), srv.URL); n != 1 {
				t.Errorf("the URL appears %d times in %q, want once", n, err)
			}
			if m.requests != tc.requests {
				t.Errorf("%d requests, want %d (%v)", m.requests, tc.requests, err)
			}
		})
	}
}

// TestBadURLsFailBeforeAnyRequest: a URL without a scheme that names no
// file, an unsupported scheme, a URL without a host: one clear error at
// once.
func TestBadURLsFailBeforeAnyRequest(t *testing.T) {
	m, srv := newMirror(t, 100)
	u, _ := url.Parse(srv.URL)
	dir := t.TempDir()
	for _, tc := range []struct{ url, want string }{
		{u.Host + "/f.tar.gz", "neither a URL"},
		{"example", "neither a URL"},
		{"/nonexistent/f.tar.gz", "neither a URL"},
		{"file:///nonexistent/f.tar.gz", "no such file"},
		{"ftp://" + u.Host + "/f", "ftp:// is not supported"},
		{"http:///f", "no host"},
		{"http://", "no host"},
		{"file://otherhost/f", "on this machine"},
	} {
		err := File(context.Background(), tc.url, filepath.Join(dir, "f"), m.pin(), quick())
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.url) {
			t.Errorf("%q: %v, want an error naming it and saying %q", tc.url, err, tc.want)
		}
		if strings.Contains(err.Error(), "attempt") {
			t.Errorf("%q: retried: %v", tc.url, err)
		}
	}
	if m.requests != 0 {
		t.Errorf("%d requests, want none", m.requests)
	}
}

// TestStallSaysSo: a server that answers nothing is given up after
// maxStalls attempts, and the error says what happened rather than
// "context canceled".
func TestStallSaysSo(t *testing.T) {
	for _, where := range []string{"headers", "body"} {
		t.Run(where, func(t *testing.T) {
			m, srv := newMirror(t, 3000)
			release := make(chan struct{})
			defer close(release)
			m.fault = func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
				if where == "body" {
					w.Header().Set("Content-Length", "3000")
					w.WriteHeader(http.StatusOK)
					w.Write(m.data[:10])
					http.NewResponseController(w).Flush()
				}
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return true
			}
			o := quick()
			o.Idle = 100 * time.Millisecond
			dst := filepath.Join(t.TempDir(), "f")
			err := File(context.Background(), srv.URL+"/f", dst, m.pin(), o)
			u, _ := url.Parse(srv.URL)
			want := "no data for 0.1 s from " + u.Host
			check(t, dst, m, err, want)
			if strings.Contains(err.Error(), "context canceled") {
				t.Errorf("the error still says context canceled: %v", err)
			}
			if m.requests != maxStalls {
				t.Errorf("%d requests, want %d", m.requests, maxStalls)
			}
		})
	}
}

// TestLocalFile: a local path or a file:// URL is accepted and checked
// against the pin as a download is.
func TestLocalFile(t *testing.T) {
	m, _ := newMirror(t, 5000)
	dir := t.TempDir()
	src := filepath.Join(dir, "python.tar.gz")
	if err := os.WriteFile(src, m.data, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, u := range []string{src, "file://" + filepath.ToSlash(src)} {
		dst := filepath.Join(dir, fmt.Sprint("ok", i))
		check(t, dst, m, File(context.Background(), u, dst, m.pin(), quick()), "")
		leftover(t, dst)
	}
	for _, tc := range []struct {
		name string
		pin  func(Pin) Pin
	}{
		{"size", func(p Pin) Pin { p.Size++; return p }},
		{"sha", func(p Pin) Pin { p.SHA256 = strings.Repeat("0", 64); return p }},
	} {
		dst := filepath.Join(dir, "bad-"+tc.name)
		err := File(context.Background(), src, dst, tc.pin(m.pin()), quick())
		check(t, dst, m, err, "the pin says")
		if !errors.Is(err, ErrPinMismatch) {
			t.Errorf("%s: %v does not wrap ErrPinMismatch", tc.name, err)
		}
		leftover(t, dst)
	}
}

// leftover fails when a dst.part* file is left.
func leftover(t *testing.T, dst string) {
	t.Helper()
	if left, _ := filepath.Glob(dst + ".part*"); len(left) > 0 {
		t.Errorf("left behind: %q", left)
	}
}

// TestDestination: a missing folder is refused and not created, a
// folder as dst is refused, both before any request; a success leaves
// nothing but the file.
func TestDestination(t *testing.T) {
	m, srv := newMirror(t, 3000)
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope")
	err := File(context.Background(), srv.URL+"/f", filepath.Join(missing, "f"), m.pin(), quick())
	if err == nil || !strings.Contains(err.Error(), "folder "+missing+" does not exist") {
		t.Errorf("missing folder: %v", err)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("%s was created", missing)
	}
	err = File(context.Background(), srv.URL+"/f", dir, m.pin(), quick())
	if err == nil || !strings.Contains(err.Error(), dir+" is a folder") {
		t.Errorf("folder as dst: %v", err)
	}
	leftover(t, dir)
	if m.requests != 0 {
		t.Errorf("%d requests before refusing, want none", m.requests)
	}
	dst := filepath.Join(dir, "f")
	check(t, dst, m, File(context.Background(), srv.URL+"/f", dst, m.pin(), quick()), "")
	leftover(t, dst)
}

// TestDamagedState: a dst.part.json that cannot be a download's state
// is discarded with a warning, and the download starts over and
// succeeds.
func TestDamagedState(t *testing.T) {
	for name, st := range map[string]string{
		"garbage":           "\x00\x01{not json",
		"negative":          `{"url":"%s","sha256":"%s","size":%d,"total":%d,"committed":-7}`,
		"past-the-total":    `{"url":"%s","sha256":"%s","size":%d,"total":%d,"committed":999999}`,
		"total-not-the-pin": `{"url":"%s","sha256":"%s","size":%d,"total":%d1,"committed":100}`,
	} {
		t.Run(name, func(t *testing.T) {
			m, srv := newMirror(t, 3000)
			dst := filepath.Join(t.TempDir(), "f")
			p := m.pin()
			if strings.Contains(st, "%") {
				st = fmt.Sprintf(st, srv.URL+"/f", p.SHA256, p.Size, p.Size)
			}
			os.WriteFile(dst+".part", bytes.Repeat([]byte("x"), 2000), 0o644)
			os.WriteFile(dst+".part.json", []byte(st), 0o644)
			var log bytes.Buffer
			o := quick()
			o.Logger = slog.New(slog.NewTextHandler(&log, nil))
			check(t, dst, m, File(context.Background(), srv.URL+"/f", dst, p, o), "")
			if !strings.Contains(log.String(), "damaged") || !strings.Contains(log.String(), dst+".part.json") {
				t.Errorf("no warning naming the damaged state:\n%s", log.String())
			}
			leftover(t, dst)
		})
	}
}

// TestConnectionErrorIsRetriedAndNamesTheURLOnce: a refused connection
// may pass later, so it is retried; the error names the URL once.
func TestConnectionErrorIsRetriedAndNamesTheURLOnce(t *testing.T) {
	m, srv := newMirror(t, 100)
	url := srv.URL + "/f"
	srv.Close()
	var log bytes.Buffer
	o := quick()
	o.Attempts = 3
	o.Logger = slog.New(slog.NewTextHandler(&log, nil))
	dst := filepath.Join(t.TempDir(), "f")
	err := File(context.Background(), url, dst, m.pin(), o)
	check(t, dst, m, err, "after 3 attempts")
	if n := strings.Count(err.Error(), srv.URL); n != 1 {
		t.Errorf("the URL appears %d times in %q, want once", n, err)
	}
	if n := strings.Count(log.String(), "chunk failed; retrying"); n != 2 {
		t.Errorf("%d retries logged, want 2:\n%s", n, log.String())
	}
}

// TestUnsafeArchiveIsNotRetried: an archive that matches its pin but
// would write outside its folder fails the install at once, says why,
// and leaves no runtime.
func TestUnsafeArchiveIsNotRetried(t *testing.T) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	body := "#!/bin/sh\necho pwned\n"
	tw.WriteHeader(&tar.Header{Name: "../python/bin/python3", Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write([]byte(body))
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()
	dir := t.TempDir()
	src := filepath.Join(dir, "cpython-3.99.0-test.tar.gz")
	os.WriteFile(src, gz.Bytes(), 0o644)
	sum := sha256.Sum256(gz.Bytes())
	lay := layout.Layout{Cache: filepath.Join(dir, "cache")}
	var log bytes.Buffer
	o := quick()
	o.Logger = slog.New(slog.NewTextHandler(&log, nil))
	_, err := Install(context.Background(), lay, Source{URL: src, Pin: Pin{SHA256: hex.EncodeToString(sum[:])}}, o)
	if !errors.Is(err, ErrUnsafeArchive) || !strings.Contains(err.Error(), "not safe to unpack") {
		t.Fatalf("Install: %v, want an unsafe-archive error", err)
	}
	if strings.Contains(log.String(), "unpacking it again") {
		t.Errorf("the unsafe archive was unpacked twice:\n%s", log.String())
	}
	if _, err := Current(lay); err == nil {
		t.Error("a runtime is installed")
	}
}
