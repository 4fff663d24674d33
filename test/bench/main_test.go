package bench

import (
	"os"
	"testing"

	"github.com/metnos/agent/testkit/tailnettest"
)

// TestMain runs the benchmarks in a network namespace holding only
// loopback, where TestTailnet runs its tailnet.
func TestMain(m *testing.M) {
	tailnettest.Main()
	os.Exit(m.Run())
}
