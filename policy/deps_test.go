package policy

import (
	"os/exec"
	"strings"
	"testing"
)

// TestRunsNothing: package policy is data. It must not link the sandbox
// or anything that starts processes, so that it builds and tests where
// no sandbox is installed.
func TestRunsNothing(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/metnos/agent/policy").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "os/exec", strings.HasPrefix(dep, "github.com/metnos/agent/sandbox"),
			strings.HasPrefix(dep, "github.com/metnos/agent/platform"):
			t.Errorf("package policy links %s", dep)
		}
	}
}
