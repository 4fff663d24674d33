package cli

import (
	"debug/buildinfo"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"
)

// TestSameBuild: a metnos-shim built with the agent's commit stamp is
// the agent's own build; one stamped with another commit (a shim left
// by an older release beside an updated agent) is not, and the agent
// then runs as its own shim.
func TestSameBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shim twice")
	}
	dir := t.TempDir()
	build := func(name, commit string) string {
		out := filepath.Join(dir, name)
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", out,
			"-ldflags=-X github.com/metnos/agent/cmd/metnos-agent/cli.Commit="+commit, "./cmd/metnos-shim")
		cmd.Dir = filepath.Join("..", "..", "..")
		cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the shim: %v\n%s", err, b)
		}
		return out
	}
	a, b := build("shim-a", "aaaa"), build("shim-b", "bbbb")
	if buildKey(mustInfo(t, a)) == buildKey(mustInfo(t, b)) {
		t.Fatalf("shims of commits aaaa and bbbb have the same build key %q", buildKey(mustInfo(t, a)))
	}
	if buildKey(mustInfo(t, a)) != buildKey(mustInfo(t, build("shim-a2", "aaaa"))) {
		t.Fatal("two builds of the same commit have different build keys")
	}
}

func mustInfo(t *testing.T, path string) *debug.BuildInfo {
	t.Helper()
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bi
}
