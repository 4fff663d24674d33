//go:build linux

package hostile

import (
	"os"
	"testing"

	"github.com/metnos/agent/sandbox/shim"
)

// TestMain lets the test binary double as the sandbox shim.
func TestMain(m *testing.M) {
	shim.MainIfShim()
	os.Exit(m.Run())
}
