//go:build linux && !amd64 && !arm64

package filter

import (
	"fmt"

	"golang.org/x/net/bpf"

	"github.com/metnos/agent/sandbox/internal/filter/names"
	"github.com/metnos/agent/sandbox/shim"
)

// Architectures without an assembled copy of the name filter (see
// native_amd64.go, native_arm64.go) assemble it, and look syscall numbers up, with
// go-seccomp-bpf at run time.

// auditArch is this architecture's AUDIT_ARCH_* value, as seccomp_data
// carries it.
func auditArch() (uint32, error) {
	info, err := names.Info()
	if err != nil {
		return 0, err
	}
	return uint32(info.ID), nil
}

// syscallNr is the number of the syscall name on this architecture;
// false where it has none.
func syscallNr(name string) (uint32, bool) {
	info, err := names.Info()
	if err != nil {
		return 0, false
	}
	nr, ok := info.SyscallNames[name]
	return uint32(nr), ok
}

// nameProgram is the name filter (names.Policy), assembled.
func nameProgram(metadata, hostPIDs bool) ([]bpf.RawInstruction, error) {
	pol, err := names.Policy(metadata, hostPIDs)
	if err != nil {
		return nil, err
	}
	prog, err := pol.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: assembling the filter: %w", err)
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assembling: %w", err)
	}
	return raw, nil
}

// listenProgram is names.ListenPolicy for the shim's egress proxy
// socket, assembled.
func listenProgram() ([]bpf.RawInstruction, error) {
	pol := names.ListenPolicy(shim.ProxyListenFD, shim.ProxyBacklog)
	prog, err := pol.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: assembling the listen filter: %w", err)
	}
	return bpf.Assemble(prog)
}
