package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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
