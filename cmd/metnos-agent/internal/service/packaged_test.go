package service

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackagedUnit: the systemd user unit the deb and rpm carry is the
// one `metnos-agent install` writes, for /usr/bin/metnos-agent (comments
// aside).
func TestPackagedUnit(t *testing.T) {
	want, err := SystemdUnit(Config{Exe: "/usr/bin/metnos-agent", Args: []string{"run", "--wait"}})
	if err != nil {
		t.Fatal(err)
	}
	// The test runs in cmd/metnos-agent/internal/service.
	got, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "packaging", "linux", "metnos-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	strip := func(b []byte) string {
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(l, "#") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	if strip(got) != strip(want) {
		t.Fatalf("packaging/linux/metnos-agent.service differs from SystemdUnit:\n%s\nwant:\n%s", got, want)
	}
}
