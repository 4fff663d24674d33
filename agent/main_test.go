package agent

import (
	"os"
	"testing"

	"github.com/metnos/agent/sandbox/shim"
)

// TestMain lets the test binary be the sandbox's shim, as the agent's
// own binary is: the tests that run executors need it.
func TestMain(m *testing.M) {
	shim.MainIfShim()
	os.Exit(m.Run())
}
