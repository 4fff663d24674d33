package bench

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/testkit/pbstest"
)

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestFetchRatio: a METNOS_BENCH_FETCH_MB (512) MiB file over loopback,
// fetch.File (8,000,000-byte chunks, each fsynced, the whole hashed)
// against `curl -s -o` and against itself one chunk at a time, in the
// same run, interleaved, 3 rounds each; and
// the extraction of a python-build-standalone-layout archive (made from
// this machine's Python) by fetch.Extract against GNU `tar -xzf`. It
// prints the medians and the ratios (curl / fetch: ≥ 0.9 is the target;
// tar / Extract: ≥ 1.0). Information only.
//
//	go test ./test/bench -run FetchRatio -count=1 -v
func TestFetchRatio(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short")
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	mb := 512
	if s := os.Getenv("METNOS_BENCH_FETCH_MB"); s != "" {
		mb, _ = strconv.Atoi(s)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "big.bin")
	f, _ := os.Create(src)
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, int64(mb)<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	pin := fetch.Pin{SHA256: hex.EncodeToString(h.Sum(nil)), Size: int64(mb) << 20}
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	url := srv.URL + "/big.bin"
	variants := []struct {
		name string
		run  func(out string) error
	}{
		{"fetch", func(out string) error { return fetch.File(context.Background(), url, out, pin, fetch.Options{}) }},
		{"fetch, 3 chunks at once", func(out string) error {
			return fetch.File(context.Background(), url, out, pin, fetch.Options{Parallel: 3})
		}},
		{"curl -o", func(out string) error {
			if b, err := exec.Command(curl, "-s", "-o", out, url).CombinedOutput(); err != nil {
				return fmt.Errorf("curl: %v %s", err, b)
			}
			return nil
		}},
		// fetch makes the file durable before it counts as there; curl
		// leaves it in the page cache. The same, then one fsync:
		{"curl -o, then fsync", func(out string) error {
			if b, err := exec.Command(curl, "-s", "-o", out, url).CombinedOutput(); err != nil {
				return fmt.Errorf("curl: %v %s", err, b)
			}
			f, err := os.Open(out)
			if err != nil {
				return err
			}
			defer f.Close()
			return f.Sync()
		}},
	}
	times := make([][]time.Duration, len(variants))
	for round := 0; round < 4; round++ {
		// The first variant of a round pays for the previous round's
		// write-back: it rotates.
		for k := range variants {
			i := (k + round) % len(variants)
			out := filepath.Join(dir, "out")
			start := time.Now()
			if err := variants[i].run(out); err != nil {
				t.Fatal(err)
			}
			times[i] = append(times[i], time.Since(start))
			os.Remove(out)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d MiB over loopback, medians of 4 rotated rounds:\n", mb)
	for i, v := range variants {
		m := median(times[i])
		fmt.Fprintf(&b, "  %-26s %8v  %4.0f MiB/s\n", v.name, m.Round(time.Millisecond), float64(mb)/m.Seconds())
	}
	fmt.Fprintf(&b, "  curl / fetch: %.2f× (target ≥ 0.9); (curl + fsync) / fetch: %.2f×; three chunks at once take %.2f× the time of one",
		float64(median(times[2]))/float64(median(times[0])), float64(median(times[3]))/float64(median(times[0])), float64(median(times[1]))/float64(median(times[0])))
	t.Log(b.String())

	// Extraction.
	tarBin, err := exec.LookPath("tar")
	if err != nil {
		t.Skip("tar is not installed")
	}
	var arc bytes.Buffer
	if _, err := pbstest.Write(&arc, gzip.DefaultCompression); errors.Is(err, pbstest.ErrNoPython) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	ap := filepath.Join(dir, "python.tar.gz")
	os.WriteFile(ap, arc.Bytes(), 0o644)
	var te, tt []time.Duration
	for round := 0; round < 5; round++ {
		out := filepath.Join(dir, fmt.Sprint("x", round))
		start := time.Now()
		if err := fetch.Extract(ap, out, fetch.Limits{}); err != nil {
			t.Fatal(err)
		}
		te = append(te, time.Since(start))
		os.RemoveAll(out)
		os.Mkdir(out, 0o755)
		start = time.Now()
		if b, err := exec.Command(tarBin, "-xzf", ap, "-C", out).CombinedOutput(); err != nil {
			t.Fatalf("tar: %v %s", err, b)
		}
		tt = append(tt, time.Since(start))
		os.RemoveAll(out)
	}
	me, mt := median(te), median(tt)
	t.Logf("\nextracting a %.1f MiB python-build-standalone-layout .tar.gz: Extract %v, tar -xzf %v; tar/Extract %.2f× (target ≥ 1.0)",
		float64(arc.Len())/(1<<20), me.Round(time.Millisecond), mt.Round(time.Millisecond), float64(mt)/float64(me))
}
