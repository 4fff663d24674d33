//go:build !linux

package tailnet

// DenyListen does nothing off Linux (there is no seccomp): the embedded
// node may open a kernel listener for its peer API. On Linux it denies
// listen(2) to the whole process and its children for good; see the
// Linux build's doc.
func DenyListen() error { return nil }
