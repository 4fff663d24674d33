// Package testbin builds metnos-agent and metnos-shim side by side for
// the tests and benchmarks that run the agent as a real process.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Build builds both commands into dir (CGO_ENABLED=0, as releases are
// built), with extra go build flags.
func Build(dir string, flags ...string) error {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	args := append(append([]string{"build"}, flags...), "-o", dir+string(os.PathSeparator), "./cmd/metnos-agent", "./cmd/metnos-shim")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the agent: %v\n%s", err, out)
	}
	return nil
}

// Prepare returns the directory holding both commands: $METNOS_E2E_BIN
// when set (CI builds them once and runs the tests as another user
// too), else a fresh build in a temporary directory that cleanup
// removes.
func Prepare() (dir string, cleanup func(), err error) {
	if d := os.Getenv("METNOS_E2E_BIN"); d != "" {
		return d, func() {}, nil
	}
	dir, err = os.MkdirTemp("", "metnos-bin-")
	if err != nil {
		return "", nil, err
	}
	os.Chmod(dir, 0o755)
	if err := Build(dir); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// Grep returns the lines of s that contain sub, for a failure message
// that shows the lines that matter of a long output.
func Grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
