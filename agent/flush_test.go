package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/wire"
)

// testAgent is an Agent paired with url, its directories in a temp dir.
func testAgent(t *testing.T, url string) *Agent {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	// What the command line passes from its environment and layout.
	lay := layout.Layout{Data: filepath.Join(dir, "data"), Cache: filepath.Join(dir, "cache"), Home: dir}
	key, err := pairing.LoadOrCreateKey(lay)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	id, k := "0123456789abcdef0123456789abcdef", wire.PublicKeyWire(pub)
	if err := pairing.SaveState(lay, pairing.State{DeviceID: &id, ServerURL: &url, ServerPublicKey: &k}); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Layout: lay, Client: client.New(url, key, id, nil),
		Host:   policy.Host{Home: dir, UID: os.Getuid(), AgentDataDirs: lay.AgentDirs()},
		Python: os.Getenv("METNOS_PYTHON"), Path: os.Getenv("PATH"),
		Sandbox: sandbox.Options{SearchPath: os.Getenv("PATH"), Bwrap: os.Getenv("METNOS_BWRAP")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestFlushStatuses: a result the server accepts leaves the spool, one
// refused for good goes to dead-results, and one refused for now (408,
// 423, 425, 429, 5xx, or no answer) stays, byte for byte.
func TestFlushStatuses(t *testing.T) {
	for _, tc := range []struct {
		status     int
		kept, dead bool
		serverGone bool
	}{
		{status: 200},
		{status: 400, dead: true}, {status: 403, dead: true}, {status: 404, dead: true}, {status: 413, dead: true}, {status: 422, dead: true},
		{status: 408, kept: true}, {status: 423, kept: true}, {status: 425, kept: true}, {status: 429, kept: true},
		{status: 500, kept: true}, {status: 503, kept: true}, {status: 302, kept: true},
		{serverGone: true, kept: true},
	} {
		var got []byte
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, _ = io.ReadAll(r.Body)
			if r.Header.Get("X-Metnos-Device-Sig") == "" {
				t.Error("an unsigned result")
			}
			w.WriteHeader(tc.status)
		}))
		url := srv.URL
		if tc.serverGone {
			srv.Close()
		}
		a := testAgent(t, url)
		body := []byte(`{"invocation_id":"inv-18ed65bd51bdc701fcd26b58","ok":true,"x":"città"}`)
		if err := a.spoolResult("inv-18ed65bd51bdc701fcd26b58", body); err != nil {
			t.Fatal(err)
		}
		empty := a.flush(context.Background())
		if !tc.serverGone && string(got) != string(body) {
			t.Errorf("status %d: sent %q, want the spooled bytes", tc.status, got)
		}
		pending, _ := a.spool.Pending()
		dead, _ := filepath.Glob(filepath.Join(a.cfg.Layout.Data, "spool", "dead-results", "*"))
		if (len(pending) == 1) != tc.kept || (len(dead) == 1) != tc.dead || empty == tc.kept {
			t.Errorf("status %d (gone %v): pending %d, dead %v, empty %v", tc.status, tc.serverGone, len(pending), dead, empty)
		}
		if tc.dead && !strings.Contains(filepath.Base(dead[0]), ".http-") {
			t.Errorf("dead letter name %s", dead[0])
		}
		if !tc.serverGone {
			srv.Close()
		}
	}
}

// TestRetention: at start, spooled results older than the spool
// retention and backup blobs of turns older than the history retention
// are removed; newer ones stay.
func TestRetention(t *testing.T) {
	a := testAgent(t, "http://127.0.0.1:1")
	data := a.cfg.Layout.Data
	old := time.Now().Add(-40 * 24 * time.Hour)
	files := map[string]bool{ // path -> kept
		filepath.Join(data, "spool", "results", "inv-18ed65bd51bdc701fcd26b58.json"): false,
		filepath.Join(data, "spool", "results", "inv-18ed65bd51bdc701fcd26b59.json"): true,
		filepath.Join(data, "shimdata", "_history", "turn-old", "blob", "x.bin"):     false,
		filepath.Join(data, "shimdata", "_history", "turn-new", "blob", "y.bin"):     true,
	}
	for p, kept := range files {
		os.MkdirAll(filepath.Dir(p), 0o700)
		os.WriteFile(p, []byte(`{"invocation_id":"x"}`), 0o600)
		if !kept {
			os.Chtimes(p, old, old)
			os.Chtimes(filepath.Dir(p), old, old) // a turn's age is that of its newest blob
			os.Chtimes(filepath.Dir(filepath.Dir(p)), old, old)
		}
	}
	a.Close()
	b, err := New(a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.waitSwept()
	defer b.Close()
	for p, kept := range files {
		if _, err := os.Stat(p); (err == nil) != kept {
			t.Errorf("%s: kept %v, want %v", p, err == nil, kept)
		}
	}
}

// TestHistoryLinkNotFollowed: an executor that replaced shimdata/_history
// (or a turn folder in it) by a link to the user's files loses the link
// at the next start, and the files stay.
func TestHistoryLinkNotFollowed(t *testing.T) {
	a := testAgent(t, "http://127.0.0.1:1")
	a.waitSwept()
	old := time.Now().Add(-40 * 24 * time.Hour)
	victim := filepath.Join(t.TempDir(), "Photos")
	os.MkdirAll(filepath.Join(victim, "2019"), 0o700)
	os.WriteFile(filepath.Join(victim, "2019", "kid.jpg"), []byte("x"), 0o600)
	os.Chtimes(filepath.Join(victim, "2019"), old, old)
	hist := filepath.Join(a.userData(), "_history")
	os.MkdirAll(a.userData(), 0o700)
	if err := os.Symlink(victim, hist); err != nil {
		t.Fatal(err)
	}
	a.expireBlobs(30 * 24 * time.Hour)
	if _, err := os.Stat(filepath.Join(victim, "2019", "kid.jpg")); err != nil {
		t.Fatalf("a file behind the link was removed: %v", err)
	}
	if _, err := os.Lstat(hist); err == nil {
		t.Error("the link is still there")
	}
	// A link as a turn folder.
	os.MkdirAll(hist, 0o700)
	os.Symlink(filepath.Join(victim, "2019"), filepath.Join(hist, "turn-x"))
	os.Chtimes(filepath.Join(victim, "2019"), old, old)
	a.expireBlobs(30 * 24 * time.Hour)
	if _, err := os.Stat(filepath.Join(victim, "2019", "kid.jpg")); err != nil {
		t.Fatalf("a file behind a turn link was removed: %v", err)
	}
}

// TestFlushPastRefusedForNow: a result the server refuses for now does
// not hold back the ones after it.
func TestFlushPastRefusedForNow(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "stuck") {
			w.WriteHeader(500)
		}
	}))
	defer srv.Close()
	a := testAgent(t, srv.URL)
	a.spool.Finish("inv-18ed65bd51bdc701fcd26b51", []byte(`{"invocation_id":"inv-18ed65bd51bdc701fcd26b51","x":"stuck"}`))
	a.spool.Finish("inv-18ed65bd51bdc701fcd26b52", []byte(`{"invocation_id":"inv-18ed65bd51bdc701fcd26b52"}`))
	if a.flush(context.Background()) {
		t.Fatal("Flush says the spool is empty")
	}
	pending, _ := a.spool.Pending()
	if len(pending) != 1 || pending[0].ID != "inv-18ed65bd51bdc701fcd26b51" {
		t.Fatalf("pending after the flush: %v", pending)
	}
}

// TestOutbox: once the first flush has read the spool, a result spooled
// since is delivered from memory; one refused for now is sent again, the
// same bytes, once at each flush until the server accepts it, and then
// no more.
func TestOutbox(t *testing.T) {
	var mu sync.Mutex
	var got []string
	status := http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(b))
		w.WriteHeader(status)
	}))
	defer srv.Close()
	a := testAgent(t, srv.URL)
	ctx := context.Background()
	if !a.flush(ctx) {
		t.Fatal("the empty spool does not flush empty")
	}
	body := `{"invocation_id":"inv-18ed65bd51bdc701fcd26b58","ok":true}`
	if err := a.spoolResult("inv-18ed65bd51bdc701fcd26b58", []byte(body)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if a.flush(ctx) {
			t.Fatal("a result refused for now counts as delivered")
		}
	}
	mu.Lock()
	status = http.StatusOK
	mu.Unlock()
	for range 2 {
		if !a.flush(ctx) {
			t.Fatal("the spool is not empty after the server accepted the result")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("the result was sent %d times, want 3 (twice refused, once accepted)", len(got))
	}
	for _, b := range got {
		if b != body {
			t.Errorf("sent %q, want the spooled bytes", b)
		}
	}
	if pending, _ := a.spool.Pending(); len(pending) != 0 {
		t.Errorf("left in the spool: %v", pending)
	}
}

// TestFinishErrorStillDelivered: when spooling fails after the result's
// body is on disk (here the STARTED marker cannot be removed), the
// result is still delivered by this process, as the spool on disk is
// read again.
func TestFinishErrorStillDelivered(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
	defer srv.Close()
	a := testAgent(t, srv.URL)
	ctx := context.Background()
	a.flush(ctx) // the outbox now holds the (empty) spool
	id := "inv-18ed65bd51bdc701fcd26b58"
	if err := os.MkdirAll(filepath.Join(a.cfg.Layout.SpoolStarted(), id+".json", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := a.spoolResult(id, []byte(`{"invocation_id":"`+id+`"}`)); err == nil {
		t.Fatal("spooling succeeded although the marker cannot be removed")
	}
	if pending, _ := a.spool.Pending(); len(pending) != 1 {
		t.Fatalf("%d results on disk, want the one whose spooling failed late", len(pending))
	}
	a.flush(ctx)
	if n.Load() != 1 {
		t.Errorf("%d deliveries, want the result that is on disk", n.Load())
	}
}
