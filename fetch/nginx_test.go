//go:build linux

package fetch

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// requireTool finds a program the test needs: missing, it skips (or,
// with METNOS_REQUIRE_SANDBOX=1, fails: CI installs it).
func requireTool(t *testing.T, name string, paths ...string) string {
	t.Helper()
	for _, p := range append(paths, name) {
		if q, err := exec.LookPath(p); err == nil {
			return q
		}
	}
	msg := name + " is not installed (apt-get install " + name + ")"
	if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
		t.Fatal(msg + "; METNOS_REQUIRE_SANDBOX=1 makes this a failure")
	}
	t.Skip(msg)
	return ""
}

// startNginx serves dir on a loopback port with Debian's nginx and
// returns its base URL.
func startNginx(t *testing.T, dir string) string {
	t.Helper()
	bin := requireTool(t, "nginx", "/usr/sbin/nginx")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	prefix := t.TempDir()
	os.MkdirAll(filepath.Join(prefix, "logs"), 0o755)
	user := ""
	if os.Getuid() == 0 {
		user = "user root;"
	}
	conf := fmt.Sprintf(`%s
daemon off; master_process off; worker_processes 1;
error_log %s/logs/error.log; pid %s/nginx.pid;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path %s/tmp; proxy_temp_path %s/tmp; fastcgi_temp_path %s/tmp; uwsgi_temp_path %s/tmp; scgi_temp_path %s/tmp;
  server { listen 127.0.0.1:%d; root %s; location / { } }
}`, user, prefix, prefix, prefix, prefix, prefix, prefix, prefix, port, dir)
	cf := filepath.Join(prefix, "nginx.conf")
	os.WriteFile(cf, []byte(conf), 0o644)
	cmd := exec.Command(bin, "-p", prefix, "-c", cf)
	out, _ := os.Create(filepath.Join(prefix, "logs", "stderr"))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return fmt.Sprintf("http://127.0.0.1:%d", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(filepath.Join(prefix, "logs", "stderr"))
	t.Fatalf("nginx did not start: %s", b)
	return ""
}

// TestNginx: a real server answers Range and If-Range as servers do;
// the download, stopped half-way and resumed, ends verified.
func TestNginx(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 5_000_000)
	rand.Read(data)
	os.WriteFile(filepath.Join(dir, "python.tar.gz"), data, 0o644)
	os.Chmod(dir, 0o755)
	base := startNginx(t, dir)
	sum := sha256.Sum256(data)
	pin := Pin{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
	dst := filepath.Join(t.TempDir(), "python.tar.gz")
	ctx, cancel := context.WithCancel(context.Background())
	o := Options{Chunk: 1_000_000, Progress: func(p Progress) {
		if p.Done >= 2_000_000 {
			cancel()
		}
	}}
	if err := File(ctx, base+"/python.tar.gz", dst, pin, o); err == nil {
		t.Fatal("the stopped download succeeded")
	}
	if err := File(context.Background(), base+"/python.tar.gz", dst, pin, Options{Chunk: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := matches(dst, pin); !ok {
		t.Fatal("the file does not match")
	}
	// A missing file is nginx's 404 page: a clear error.
	err := File(context.Background(), base+"/nope.tar.gz", filepath.Join(t.TempDir(), "x"), pin, Options{})
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: %v", err)
	}
}
