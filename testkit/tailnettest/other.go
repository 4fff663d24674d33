//go:build !linux

package tailnettest

// Knobs are the tailnet test settings (unused off Linux).
var Knobs []string

// Main does nothing off Linux: the tailnet tests run on Linux only.
func Main() {}
