package update

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/metnos/agent/wire"
)

// TestApplyBoundsTheDownload: the signature covers the sha256, not the
// bytes on the wire, so a transport that lies (plain HTTP over a
// tailnet) can answer the build's URL with a file of any size. The
// agent must stop once it is larger than any build, rather than write
// to the disk beside its executable until it is full (and keep it there
// to resume).
func TestApplyBoundsTheDownload(t *testing.T) {
	defer func(n int64) { maxBuildSize = n }(maxBuildSize)
	maxBuildSize = 4 << 20

	var mu sync.Mutex
	served := int64(0)
	// Past this the lying server answers 404, so that an agent without
	// a bound fails quickly instead of filling the disk.
	const stop = 16 << 20
	s := newServer(t)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, []byte("the real build"))
	lie := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, wire.PathComponent) || !strings.HasPrefix(r.URL.Path, wire.PathClientFiles) {
			s.Config.Handler.ServeHTTP(w, r)
			return
		}
		m := regexp.MustCompile(`^bytes=(\d+)-(\d+)$`).FindStringSubmatch(r.Header.Get("Range"))
		mu.Lock()
		over := served >= stop
		mu.Unlock()
		if m == nil || over {
			http.NotFound(w, r)
			return
		}
		start, _ := strconv.ParseInt(m[1], 10, 64)
		end, _ := strconv.ParseInt(m[2], 10, 64)
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end, int64(1)<<40))
		w.Header().Set("Content-Length", strconv.FormatInt(end-start+1, 10))
		w.WriteHeader(http.StatusPartialContent)
		n, _ := w.Write(make([]byte, end-start+1))
		mu.Lock()
		served += int64(n)
		mu.Unlock()
	}))
	t.Cleanup(lie.Close)
	s.URL = lie.URL // the device talks to the lying transport

	exe := filepath.Join(t.TempDir(), "installed")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\necho metnos-agent 1.0.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := installAt(t, exe, filepath.Join(t.TempDir(), "metnos-agent"), filepath.Join(t.TempDir(), "agent-update.json"))
	u := d.updater(t, s, false)
	err := u.Apply(context.Background(), desc)
	if err == nil || errors.Is(err, ErrRestart) {
		t.Fatalf("Apply of a 1 TiB answer: %v, want an error", err)
	}
	t.Logf("Apply: %v", err)
	mu.Lock()
	got := served
	mu.Unlock()
	if got > maxBuildSize+downloadChunk {
		t.Errorf("the agent took %d bytes of an answer the server said is 1 TiB; no build is larger than %d", got, maxBuildSize)
	}
	if fi, err := os.Stat(d.New + ".part"); err == nil && fi.Size() > maxBuildSize {
		t.Errorf("%d bytes of it are left on disk beside the executable", fi.Size())
	}
	if string(read(t, d.Exe)) != string(read(t, exe)) {
		t.Errorf("the installed build changed")
	}
}
