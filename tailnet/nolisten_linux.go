//go:build linux

package tailnet

import (
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"

	"github.com/metnos/agent/sandbox/shim"
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
	f := seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagTSync,
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionAllow,
			Syscalls: []seccomp.SyscallGroup{{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "listen", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.NotEqual, Value: shim.ProxyListenFD}}},
				{Name: "listen", Conditions: seccomp.ArgumentConditions{{Argument: 1, Operation: seccomp.NotEqual, Value: shim.ProxyBacklog}}},
			}}},
		},
	}
	if err := seccomp.LoadFilter(f); err != nil {
		return fmt.Errorf("tailnet: denying listen(2) to the agent: %w", err)
	}
	return nil
}
