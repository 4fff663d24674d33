//go:build !linux

package sandbox

func orphanHelperMain() {}
