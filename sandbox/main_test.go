package sandbox

import (
	"os"
	"testing"

	"github.com/metnos/agent/sandbox/shim"
)

func TestMain(m *testing.M) {
	shim.MainIfShim()
	orphanHelperMain()
	os.Exit(m.Run())
}
