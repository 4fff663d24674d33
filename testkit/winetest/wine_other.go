//go:build !windows

package winetest

// UnderWine is false: only a Windows build can run under Wine.
func UnderWine() bool { return false }
