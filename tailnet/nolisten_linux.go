//go:build linux

package tailnet

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/sandbox"
)

// DenyListen makes listen(2) fail with EPERM for the rest of this
// process's life. The embedded node would otherwise open a kernel TCP
// listener for its peer API on every interface, and the agent serves
// nothing: it only dials out. (Denied, the node serves its peer API
// from its own network stack instead, to tailnet peers only; [Start]
// closes that too.)
//
// What it does, exactly:
//
//   - It is process-wide: a seccomp filter on every thread at once
//     (SECCOMP_FILTER_FLAG_TSYNC), not only the caller's.
//   - It is irreversible: a seccomp filter cannot be removed.
//   - It is inherited by every child the process starts afterwards,
//     executors and their sandbox included, and by theirs: none of them
//     can listen either.
//   - It sets no_new_privs, as an unprivileged seccomp filter requires,
//     and that too is inherited: a child cannot gain privileges through
//     setuid or file capabilities.
//   - One call is let through: listen on descriptor
//     [shim.ProxyListenFD] with backlog [shim.ProxyBacklog], the sandbox
//     shim's egress proxy socket in a run's own network namespace.
//     Nothing of the agent's own listens with that pair (Go's listeners
//     use the system's somaxconn as backlog); what a run's command could
//     do with it stays in its namespace, where Landlock lets it bind
//     nothing.
//
// The agent calls it from one place, when a command joins a tailnet
// (cmd/metnos-agent/cli's connect step), and only then: without a tailnet
// configured, nothing is filtered.
func DenyListen() error {
	b, err := sandbox.ListenFilter()
	if err != nil {
		return fmt.Errorf("tailnet: denying listen(2) to the agent: %w", err)
	}
	if len(b) == 0 || len(b)%8 != 0 {
		return fmt.Errorf("tailnet: denying listen(2) to the agent: the filter is %d bytes, not a whole program", len(b))
	}
	prog := make([]unix.SockFilter, len(b)/8)
	for i := range prog {
		w := b[8*i:]
		prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(w), Jt: w[2], Jf: w[3], K: binary.NativeEndian.Uint32(w[4:])}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("tailnet: denying listen(2) to the agent: failed to set no_new_privs with prctl: %w", err)
	}
	// With TSYNC the call returns the id of a thread it could not
	// synchronise (a positive value), or fails with an errno.
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	switch {
	case errno == unix.ENOSYS:
		return fmt.Errorf("tailnet: denying listen(2) to the agent: failed loading seccomp filter: seccomp is not supported by the kernel: %w", errno)
	case errno != 0:
		return fmt.Errorf("tailnet: denying listen(2) to the agent: failed loading seccomp filter: %w", errno)
	case r != 0:
		return fmt.Errorf("tailnet: denying listen(2) to the agent: thread %d could not take the filter", r)
	}
	return nil
}
