//go:build !linux

package shim

import (
	"fmt"
	"os"
	"runtime"
)

func run(status *os.File, spec Spec, argv []string) int {
	return fail(status, fmt.Errorf("the sandbox shim is not implemented on %s", runtime.GOOS))
}
