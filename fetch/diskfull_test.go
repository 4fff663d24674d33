//go:build linux

package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestDiskFull: on a full disk the download fails at once with the
// system's reason (no attempt is repeated: the pause does not free the
// disk), keeps dst.part (and what it committed) for later, and installs
// nothing. The disk is a 1 MiB tmpfs the test mounts, so root only.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting the small tmpfs that plays the full disk needs root")
	}
	disk := t.TempDir()
	if err := syscall.Mount("tmpfs", disk, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(disk, syscall.MNT_DETACH) })
	m, srv := newMirror(t, 3_000_000)
	sum := sha256.Sum256(m.data)
	pin := Pin{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(m.data))}
	dst := filepath.Join(disk, "python.tar.gz")
	o := quick()
	o.Chunk, o.Attempts = 256_000, 5
	err := File(context.Background(), srv.URL, dst, pin, o)
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("error %v, want the disk's own reason", err)
	}
	if strings.Contains(err.Error(), "attempts") {
		t.Fatalf("error %v: a full disk was retried", err)
	}
	if _, err := os.Stat(dst); err == nil {
		t.Fatal("a file was installed")
	}
	if fi, err := os.Stat(dst + ".part"); err != nil || fi.Size() == 0 {
		t.Fatalf(".part was not kept: %v", err)
	}
	if _, err := os.Stat(dst + ".part.json"); err != nil {
		t.Fatalf("the state was not kept: %v", err)
	}
}
