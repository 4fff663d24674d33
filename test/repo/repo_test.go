// Package repo holds checks on the repository itself: every package says
// what it is, the sandbox shim, started for every run, stays lean, the
// packaged service unit is the one the agent installs, no library reads
// the environment, the sandbox and the policy spell none of the agent's
// folders, and the reference server imports no device code.
package repo

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/service"
)

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

// TestPackageDocs: every package outside test/ has a package doc.
func TestPackageDocs(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Doc}}", "github.com/metnos/agent/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, doc, _ := strings.Cut(line, "\t")
		if strings.Contains(path, "/test/") {
			continue
		}
		if strings.TrimSpace(doc) == "" {
			t.Errorf("%s has no package doc", path)
		}
	}
}

// TestShimStaysLean: the shim runs once per executor invocation, so
// every package it links costs start-up time on every run
// (shared/notes/startup-costs.md). It must not link the network stack,
// the tailnet, or the seccomp assembler (the agent assembles filters).
func TestShimStaysLean(t *testing.T) {
	bad := []string{"net/http", "crypto/tls", "log/slog", "tailscale.com", "github.com/elastic/go-seccomp-bpf"}
	for _, dep := range goList(t, "-deps", "github.com/metnos/agent/cmd/metnos-shim") {
		for _, b := range bad {
			if dep == b || strings.HasPrefix(dep, b+"/") {
				t.Errorf("cmd/metnos-shim links %s", dep)
			}
		}
	}
}

// TestPackagedUnit: the systemd user unit the deb and rpm carry is the
// one `metnos-agent install` writes, for /usr/bin/metnos-agent (comments
// aside).
func TestPackagedUnit(t *testing.T) {
	want, err := service.SystemdUnit(service.Config{Exe: "/usr/bin/metnos-agent", Args: []string{"run"}})
	if err != nil {
		t.Fatal(err)
	}
	// The test runs in test/repo.
	got, err := os.ReadFile(filepath.Join("..", "..", "packaging", "linux", "metnos-agent.service"))
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
		t.Fatalf("packaging/linux/metnos-agent.service differs from service.SystemdUnit:\n%s\nwant:\n%s", got, want)
	}
}
