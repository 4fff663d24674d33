package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	k1, err := loadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "keys", "author_priv.bin"))
	if err != nil || st.Size() != 32 || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	k2, err := loadOrCreateKey(dir)
	if err != nil || !k1.Equal(k2) {
		t.Errorf("reloaded key differs: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "keys", "author_priv.bin"), []byte("short"), 0o600)
	if _, err := loadOrCreateKey(dir); err == nil {
		t.Error("a 5-byte key was accepted")
	}
}

func TestServeAndClient(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs syncBuf
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--dir", t.TempDir(), "--addr", "127.0.0.1:0", "--executors", "../../refserver/testdata/executors"}, &out, &errs)
	}()
	var url string
	for deadline := time.Now().Add(20 * time.Second); url == ""; time.Sleep(10 * time.Millisecond) {
		if s := out.String(); strings.HasPrefix(s, "http://") && strings.HasSuffix(s, "\n") {
			url = strings.TrimSpace(s)
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve printed no URL; stderr: %s", errs.String())
		}
	}
	var o bytes.Buffer
	if code := run(ctx, []string{"token", "--server", url, "demo-pc"}, &o, &o); code != 0 || !strings.Contains(o.String(), `"token": "DEV.`) {
		t.Errorf("token: %d %s", code, o.String())
	}
	o.Reset()
	if code := run(ctx, []string{"get", "--server", url, "inv-nope-nope"}, &o, &o); code != 1 || !strings.Contains(o.String(), "404") {
		t.Errorf("get unknown: %d %s", code, o.String())
	}
	o.Reset()
	if code := run(ctx, []string{"enqueue", "--server", url, "dev", "echo_args", "{"}, &o, &o); code != 1 {
		t.Errorf("enqueue bad JSON: %d %s", code, o.String())
	}
	o.Reset()
	if code := run(ctx, []string{"enqueue", "--server", url, "nodev", "echo_args", `{"n":1}`}, &o, &o); code != 1 || !strings.Contains(o.String(), "not paired") {
		t.Errorf("enqueue unknown device: %d %s", code, o.String())
	}
	if code := run(ctx, []string{"bogus"}, &o, &o); code != 2 {
		t.Errorf("unknown command: %d", code)
	}
	if code := run(ctx, []string{"serve"}, &o, &o); code != 1 {
		t.Errorf("serve without --dir: %d", code)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d: %s", code, errs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// startServe runs serve with extra flags until the test ends and
// returns its URL.
func startServe(t *testing.T, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs syncBuf
	done := make(chan int, 1)
	args := append([]string{"serve", "--dir", t.TempDir(), "--addr", "127.0.0.1:0", "--executors", "../../refserver/testdata/executors"}, extra...)
	go func() { done <- run(ctx, args, &out, &errs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s := out.String(); strings.HasPrefix(s, "http://") && strings.HasSuffix(s, "\n") {
			return strings.TrimSpace(s)
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve printed no URL; stderr: %s", errs.String())
		}
	}
}

func TestPublishAndJoinCommands(t *testing.T) {
	ctx := context.Background()
	mirror := filepath.Join(t.TempDir(), "client")
	bin := filepath.Join(t.TempDir(), "metnos-agent")
	build := []byte("a metnos-agent build")
	os.WriteFile(bin, build, 0o755)
	sum := sha256.Sum256(build)

	var o bytes.Buffer
	code := run(ctx, []string{"publish", "--mirror", mirror, "--version", "2.1.0", "--target", "linux-amd64", "--installers", bin}, &o, &o)
	if code != 0 || !strings.Contains(o.String(), hex.EncodeToString(sum[:])) || !strings.Contains(o.String(), "install.sh") ||
		!strings.Contains(o.String(), "manifest latest: 2.1.0") {
		t.Fatalf("publish: %d\n%s", code, o.String())
	}
	if got, err := os.ReadFile(filepath.Join(mirror, "2.1.0", "linux-amd64", "metnos-agent")); err != nil || !bytes.Equal(got, build) {
		t.Errorf("published file: %v", err)
	}
	o.Reset()
	if code := run(ctx, []string{"publish", "--mirror", mirror, "--version", "2.0.0", "--target", "linux-arm64", bin}, &o, &o); code != 0 || !strings.Contains(o.String(), "not the latest") {
		t.Errorf("publishing an older version: %d\n%s", code, o.String())
	}
	for _, bad := range [][]string{
		{"publish", "--mirror", mirror, "--version", "2.1.0", "--target", "Linux", bin},
		{"publish", "--mirror", mirror, "--version", "2.1.0", "--target", "linux-amd64"},
		{"publish", "--version", "2.1.0", "--target", "linux-amd64", bin},
		{"publish", "--mirror", mirror, "--version", "2.1.0", "--target", "linux-amd64", filepath.Dir(bin)},
	} {
		o.Reset()
		if code := run(ctx, bad, &o, &o); code != 1 {
			t.Errorf("%v: exit %d\n%s", bad, code, o.String())
		}
	}

	url := startServe(t, "--mirror", mirror)
	resp, err := http.Get(url + "/agent/component/metnos-agent/update/linux-amd64")
	if err != nil {
		t.Fatal(err)
	}
	desc, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(desc), hex.EncodeToString(sum[:])) {
		t.Errorf("descriptor after publish: %d %s", resp.StatusCode, desc)
	}

	o.Reset()
	if code := run(ctx, []string{"join", "--server", url, "--platform", "linux", "family-pc"}, &o, &o); code != 0 ||
		!regexp.MustCompile(`^`+regexp.QuoteMeta(url)+`/agent/client/join/[0-9a-f]{16}\n$`).MatchString(o.String()) {
		t.Fatalf("join: %d %q", code, o.String())
	}
	link := strings.TrimSpace(o.String())
	resp, err = http.Get(link + "/installer")
	if err != nil {
		t.Fatal(err)
	}
	inst, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(inst), "METNOS_TOKEN='DEV.") {
		t.Errorf("installer of the printed link: %d %s", resp.StatusCode, inst)
	}
	o.Reset()
	if code := run(ctx, []string{"join", "--server", url, "--json", "--ttl", "60", "other-pc"}, &o, &o); code != 0 || !strings.Contains(o.String(), `"token": "DEV.`) {
		t.Errorf("join --json: %d %s", code, o.String())
	}
	o.Reset()
	if code := run(ctx, []string{"join", "--server", url, "--platform", "mac", "pc"}, &o, &o); code != 1 || !strings.Contains(o.String(), "token_error") {
		t.Errorf("join --platform mac: %d %s", code, o.String())
	}
}
