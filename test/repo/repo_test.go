// Package repo holds checks on the repository itself: every package says
// what it is, the sandbox shim, started for every run, stays lean, no library reads
// the environment, the sandbox and the policy spell none of the agent's
// folders, and the reference server imports no device code.
package repo

import (
	"os/exec"
	"strings"
	"testing"
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
