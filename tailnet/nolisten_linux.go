//go:build linux

package tailnet

import (
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
)

// DenyListen makes listen(2) fail with EPERM in this process and in
// everything it starts, all threads at once, for good. The embedded
// node would otherwise open a kernel TCP listener for its peer API on
// every interface (it falls back to its own netstack when it cannot),
// and the agent serves nothing: it only dials out. It sets
// no_new_privs, as an unprivileged seccomp filter requires.
func DenyListen() error {
	f := seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagTSync,
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionAllow,
			Syscalls:      []seccomp.SyscallGroup{{Action: seccomp.ActionErrno, Names: []string{"listen"}}},
		},
	}
	if err := seccomp.LoadFilter(f); err != nil {
		return fmt.Errorf("tailnet: denying listen(2) to the agent: %w", err)
	}
	return nil
}
