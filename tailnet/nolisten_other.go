//go:build !linux

package tailnet

// DenyListen is not available here: the embedded node may open a
// kernel listener for its peer API.
func DenyListen() error { return nil }
