//go:build linux

// Package names holds the seccomp name filter's lists and assembles the
// filter with go-seccomp-bpf, whose syscall tables cover every
// architecture and cost a few hundred microseconds to build at every
// start of a program that links them. Package filter uses it at run time
// only on architectures it has no assembled copy of (see
// filter/native_amd64.go and native_arm64.go, which its test checks
// against this package and regenerates with -update); the lists are unexported, and read only
// here, so that no importer can weaken the filter.
package names

import (
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"
)

// deniedCalls lists the syscalls the filter always refuses with EPERM (the
// usual container deny list and what other sandboxes' escape tests taught): tracing other
// processes, kernel and module control, mounts and namespaces, eBPF,
// keyrings, io_uring, and handle-based opens that sidestep path checks.
// Names this architecture lacks are skipped. It is unexported, and read
// only here, so that no importer can weaken the filter.
var deniedCalls = []string{
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise", "kcmp",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "uselib", "vhangup",
	"sethostname", "setdomainname", "settimeofday", "clock_settime", "clock_adjtime", "iopl", "ioperm",
	"mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
	"open_tree", "move_mount", "mount_setattr", "unshare", "setns",
	"bpf", "userfaultfd", "perf_event_open", "lookup_dcookie",
	"keyctl", "add_key", "request_key",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"open_by_handle_at", "name_to_handle_at",
}

// metadataCalls lists the calls that change a file's mode, owner, times or
// extended attributes by path. Landlock has no hook for them, so without
// bwrap's mount view they would reach any file of the user's, masked
// ones included (and, for a root agent, any file at all): the fallback
// denies them. fchmod and friends on a descriptor stay allowed, since
// opening one needs Landlock's leave. Unexported, like deniedCalls.
var metadataCalls = []string{
	"chmod", "fchmodat", "fchmodat2", "chown", "lchown", "fchownat",
	"utime", "utimes", "futimesat",
	"setxattr", "lsetxattr", "removexattr", "lremovexattr", "setxattrat", "removexattrat",
}

// hostPIDsCalls lists the calls that take another process's pid or
// pidfd and that deniedCalls allows, denied to a run that shares the
// host's PID namespace, where every process is a pid away: pidfd_open
// (a handle on any host process), process_mrelease, and the NUMA calls
// that move another process's pages. Landlock's ptrace check and the
// user namespace already refuse most of them; this refuses them by
// name. Signals are Landlock's signal scope (ABI 6), which seccomp
// could not tell apart from the command signalling its own children.
// Unexported, like deniedCalls.
var hostPIDsCalls = []string{"pidfd_open", "process_mrelease", "migrate_pages", "move_pages", "get_robust_list"}

// Policy returns the name-based filter: a default-allow policy
// denying deniedCalls (and, with metadata false, metadataCalls; with
// hostPIDs, hostPIDsCalls) with EPERM and clone3 with ENOSYS (so that
// libc falls back to clone, whose flags the argument filter inspects).
func Policy(metadata, hostPIDs bool) (seccomp.Policy, error) {
	info, err := Info()
	if err != nil {
		return seccomp.Policy{}, err
	}
	return PolicyFor(info, metadata, hostPIDs), nil
}

// PolicyFor is [Policy] for the architecture info (the calls it lacks
// left out), which the policy assembles for only if the assembler is
// told so (see the filter tests' assembleFor); Policy's is this one's.
func PolicyFor(info *arch.Info, metadata, hostPIDs bool) seccomp.Policy {
	var names []string
	deny := append([]string(nil), deniedCalls...)
	if !metadata {
		deny = append(deny, metadataCalls...)
	}
	if hostPIDs {
		deny = append(deny, hostPIDsCalls...)
	}
	for _, n := range deny {
		if _, ok := info.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	groups := []seccomp.SyscallGroup{
		{Names: names, Action: seccomp.ActionErrno},
	}
	if _, ok := info.SyscallNames["clone3"]; ok {
		// openat2 takes its mode in a struct no filter can read.
		enosys := []string{"clone3"}
		if _, ok := info.SyscallNames["openat2"]; ok {
			enosys = append(enosys, "openat2")
		}
		groups = append(groups, seccomp.SyscallGroup{Names: enosys, Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)})
	}
	return seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: groups}
}

// Info is this architecture's syscall table.
func Info() (*arch.Info, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w (refusing to run unfiltered)", err)
	}
	return info, nil
}

// ListenPolicy is the filter tailnet.DenyListen loads into the agent:
// listen(2) refused with EPERM unless it is on descriptor fd with
// backlog backlog (the shim's egress proxy socket).
func ListenPolicy(fd, backlog uint64) seccomp.Policy {
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{
			{Name: "listen", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.NotEqual, Value: fd}}},
			{Name: "listen", Conditions: seccomp.ArgumentConditions{{Argument: 1, Operation: seccomp.NotEqual, Value: backlog}}},
		}}},
	}
}
