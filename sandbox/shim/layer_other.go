//go:build !linux

package shim

import (
	"fmt"
	"os"
	"runtime"
)

func layer(status *os.File, spec LayerSpec, argv []string) int {
	return failLayer(status, fmt.Errorf("a dry run's layer is not implemented on %s", runtime.GOOS))
}
