package fetch

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestProbePermanentErrorsFailAtOnce: what no retry can mend fails on the
// first attempt (or before any request), with a message that says
// what is wrong, and leaves nothing behind.
func TestProbePermanentErrorsFailAtOnce(t *testing.T) {
	m, srv := newMirror(t, 3000)
	var requests atomic.Int64
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		switch r.URL.Path {
		case "/ftp":
			http.Redirect(w, r, "ftp://127.0.0.1/f", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(redirect.Close)
	for _, tc := range []struct {
		name, url string
		pin       Pin
		want      string
		requests  int64 // at most
	}{
		{name: "port out of range", url: "http://127.0.0.1:99999/f", pin: m.pin(), want: "the port 99999 is out of range (want 1 to 65535)"},
		{name: "port zero", url: "http://127.0.0.1:0/f", pin: m.pin(), want: "the port 0 is out of range"},
		{name: "escape in an http URL", url: srv.URL + "/\x1b[31mf", pin: m.pin(), want: `not a valid URL: invalid control character in URL`},
		{name: "negative size", url: srv.URL + "/f", pin: Pin{SHA256: m.pin().SHA256, Size: -5}, want: "the pinned size -5 is negative"},
		{name: "redirect to ftp", url: redirect.URL + "/ftp", pin: m.pin(), want: "redirected to ftp://127.0.0.1/f, which is not an http:// or https:// URL", requests: 1},
		{name: "redirect loop", url: redirect.URL + "/loop", pin: m.pin(), want: "redirected more than 10 times", requests: 11},
		{name: "404", url: redirect.URL + "/nope", pin: m.pin(), want: "the server answered 404 Not Found", requests: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requests.Store(0)
			dst := filepath.Join(t.TempDir(), "f")
			o := quick()
			o.Backoff = 200 * time.Millisecond // ten attempts would take seconds
			err := File(context.Background(), tc.url, dst, tc.pin, o)
			check(t, dst, m, err, tc.want)
			if n := requests.Load(); n > tc.requests {
				t.Errorf("%d requests, want at most %d", n, tc.requests)
			}
			// "after N attempts" would say it was retried.
			if strings.Contains(err.Error(), "\x1b") || strings.Contains(err.Error(), "attempt") || strings.Count(err.Error(), "fetch ") != 1 {
				t.Errorf("error %q: want one \"fetch\", no attempt count, no raw escape", err)
			}
			leftover(t, dst)
		})
	}
}

// TestPasswordRedacted: a URL's password is in no log line and no
// error.
func TestPasswordRedacted(t *testing.T) {
	m, srv := newMirror(t, 3000)
	url := strings.Replace(srv.URL, "http://", "http://u:secret@", 1)
	var log bytes.Buffer
	o := quick()
	o.Logger = slog.New(slog.NewTextHandler(&log, nil))
	dst := filepath.Join(t.TempDir(), "f")
	var seen []string
	o.Progress = func(p Progress) { seen = append(seen, p.URL) }
	if err := File(context.Background(), url+"/f", dst, m.pin(), o); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "secret") || !strings.Contains(log.String(), "u:xxxxx@") {
		t.Errorf("the log shows the password, or no redacted URL:\n%s", log.String())
	}
	for _, u := range seen {
		if strings.Contains(u, "secret") {
			t.Errorf("progress shows the password: %s", u)
		}
	}
	bad := m.pin()
	bad.SHA256 = strings.Repeat("0", 64)
	err := File(context.Background(), url+"/g", filepath.Join(t.TempDir(), "g"), bad, o)
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("error %v shows the password", err)
	}
	// A download left to resume keeps its state in a file: without the
	// password.
	m.mu.Lock()
	m.fault = func(m *mirror, n int, w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Range") != "bytes=0-999" {
			w.WriteHeader(http.StatusInternalServerError)
			return true
		}
		return false
	}
	m.mu.Unlock()
	o.Attempts = 1
	half := filepath.Join(t.TempDir(), "h")
	if err := File(context.Background(), url+"/h", half, m.pin(), o); err == nil {
		t.Fatal("a download whose second chunk fails succeeded")
	}
	b, err := os.ReadFile(half + ".part.json")
	if err != nil || strings.Contains(string(b), "secret") || !strings.Contains(string(b), "u:xxxxx@") {
		t.Errorf("the state of the download left to resume (%v): %s", err, b)
	}
	m.mu.Lock()
	m.fault = nil
	m.mu.Unlock()
	if err := File(context.Background(), url+"/h", half, m.pin(), o); err != nil {
		t.Errorf("resuming: %v", err)
	}
}

// TestPinShownAsPinned: with no size pinned, the pin is not said to be
// 0 bytes; a file that misses its pin leaves nothing behind.
func TestPinShownAsPinned(t *testing.T) {
	m, srv := newMirror(t, 3000)
	bad := Pin{SHA256: strings.Repeat("0", 64)}
	dst := filepath.Join(t.TempDir(), "f")
	err := File(context.Background(), srv.URL+"/f", dst, bad, quick())
	check(t, dst, m, err, "the pin says "+bad.SHA256+":")
	if strings.Contains(err.Error(), "(0 bytes)") || strings.Count(err.Error(), "fetch ") != 1 {
		t.Errorf("error %q: claims a 0-byte pin, or says fetch twice", err)
	}
	leftover(t, dst) // the bytes fetched twice alike miss the pin: nothing to resume
	bad.Size = 3000
	if got := bad.String(); got != bad.SHA256+" (3000 bytes)" {
		t.Errorf("a pin with a size shows as %q", got)
	}
}

// TestRefusedConnection: a closed port says nothing listens there.
func TestRefusedConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	m, _ := newMirror(t, 10)
	dst := filepath.Join(t.TempDir(), "f")
	o := quick()
	o.Attempts = 2
	err = File(context.Background(), "http://"+addr+"/f", dst, m.pin(), o)
	check(t, dst, m, err, "nothing listens at "+addr)
	if strings.Contains(err.Error(), "dial tcp") {
		t.Errorf("error %q: the raw dial error", err)
	}
	leftover(t, dst)
}

// TestInTheWay: a dst.part that is a folder, and a lock file that
// cannot be made, are said as such before anything is downloaded.
func TestInTheWay(t *testing.T) {
	m, srv := newMirror(t, 3000)
	dir := t.TempDir()
	dst := filepath.Join(dir, "f")
	if err := os.Mkdir(dst+".part", 0o755); err != nil {
		t.Fatal(err)
	}
	err := File(context.Background(), srv.URL+"/f", dst, m.pin(), quick())
	check(t, dst, m, err, dst+".part is in the way of the download")
	if m.served != 0 {
		t.Errorf("%d bytes served before the refusal", m.served)
	}
	if runtime.GOOS != "linux" {
		return
	}
	err = File(context.Background(), srv.URL+"/f", "/proc/metnos-fetch-test", m.pin(), quick())
	if err == nil || strings.Contains(err.Error(), "another download") || !strings.Contains(err.Error(), "cannot create the lock file next to /proc/metnos-fetch-test") {
		t.Errorf("-o in /proc: %v", err)
	}
}
