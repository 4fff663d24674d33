package shim

import (
	"fmt"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Denied lists the syscalls the filter always refuses with EPERM (seed
// 001 §7 and what the peers' escape tests taught): tracing other
// processes, kernel and module control, mounts and namespaces, eBPF,
// keyrings, io_uring, and handle-based opens that sidestep path checks.
// Names this architecture lacks are skipped.
var Denied = []string{
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

// Namespace flags of clone(2); a clone asking for any of them is refused.
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// FilterPolicy returns the name-based part of the seccomp filter: a
// default-allow policy denying [Denied] with EPERM and clone3 with ENOSYS
// (so that libc falls back to clone, whose flags [argFilter] inspects).
func FilterPolicy() (seccomp.Policy, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return seccomp.Policy{}, fmt.Errorf("seccomp: %w (refusing to run unfiltered)", err)
	}
	var names []string
	for _, n := range Denied {
		if _, ok := info.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	groups := []seccomp.SyscallGroup{
		{Names: names, Action: seccomp.ActionErrno},
	}
	if _, ok := info.SyscallNames["clone3"]; ok {
		groups = append(groups, seccomp.SyscallGroup{Names: []string{"clone3"}, Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)})
	}
	return seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: groups}, nil
}

// archFilter kills the process on any syscall made through a foreign
// ABI (i386 int 0x80 on amd64, for instance): the deny-list filter only
// knows the native numbers, so a foreign call would otherwise pass.
func archFilter(info *arch.Info) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
	}
}

// seccomp_data layout: nr at 0, arch at 4, args at 16 + 8*i. Only the
// low 32 bits of an argument are compared: the kernel reads socket's
// family and ioctl's request as 32-bit ints, so a check on all 64 bits
// could be dodged by setting the high ones.
func argLo(i uint32) bpf.LoadAbsolute { return bpf.LoadAbsolute{Off: 16 + 8*i, Size: 4} }

// argFilter denies, with EPERM: clone(2) asking for a new namespace; the
// terminal-injection ioctls TIOCSTI and TIOCLINUX; and socket(2) for any
// family the spec does not allow. With the network cut only AF_UNIX may
// be allowed; with it open, AF_INET, AF_INET6 and AF_NETLINK (which
// getaddrinfo uses), plus AF_UNIX when allowed. socketpair(2) stays
// allowed: it reaches nothing outside.
func argFilter(spec Spec) []bpf.Instruction {
	const (
		allow = unix.SECCOMP_RET_ALLOW
		deny  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	)
	var families []uint32
	if !spec.NetCut {
		families = append(families, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK)
	}
	if spec.Unix {
		families = append(families, unix.AF_UNIX)
	}
	var sock []bpf.Instruction
	sock = append(sock, argLo(0))
	for i, f := range families {
		// Jump to the final "allow" (len(families)-i) instructions ahead.
		sock = append(sock, bpf.JumpIf{Cond: bpf.JumpEqual, Val: f, SkipTrue: uint8(len(families) - i)})
	}
	sock = append(sock, bpf.RetConstant{Val: deny}, bpf.RetConstant{Val: allow})

	clone := []bpf.Instruction{
		argLo(0),
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: cloneNewFlags, SkipFalse: 1},
		bpf.RetConstant{Val: deny},
		bpf.RetConstant{Val: allow},
	}
	ioctl := []bpf.Instruction{
		argLo(1),
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.TIOCSTI, SkipTrue: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.TIOCLINUX, SkipFalse: 1},
		bpf.RetConstant{Val: deny},
		bpf.RetConstant{Val: allow},
	}
	// Dispatch on the syscall number; each block ends in a return.
	prog := []bpf.Instruction{bpf.LoadAbsolute{Off: 0, Size: 4}}
	blocks := [][]bpf.Instruction{sock, clone, ioctl}
	nrs := []uint32{unix.SYS_SOCKET, unix.SYS_CLONE, unix.SYS_IOCTL}
	// Header: one jump per block, then "allow"; block k starts after the
	// header and the blocks before it.
	header := len(nrs) + 1
	offset := 0
	for k, nr := range nrs {
		target := header - (k + 1) + offset // instructions to skip from after this jump
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: uint8(target)})
		offset += len(blocks[k])
	}
	prog = append(prog, bpf.RetConstant{Val: allow})
	for _, b := range blocks {
		prog = append(prog, b...)
	}
	return prog
}

func applySeccomp(spec Spec) error {
	info, err := arch.GetInfo("")
	if err != nil {
		return fmt.Errorf("seccomp: %w (refusing to run unfiltered)", err)
	}
	pol, err := FilterPolicy()
	if err != nil {
		return err
	}
	insts, err := pol.Assemble()
	if err != nil {
		return fmt.Errorf("seccomp: assembling the filter: %w", err)
	}
	for _, prog := range [][]bpf.Instruction{archFilter(info), argFilter(spec), insts} {
		if err := loadFilter(prog); err != nil {
			return err
		}
	}
	return nil
}

// loadFilter installs prog on the calling thread only (no TSYNC): the
// shim execs from this thread, and the new program inherits its filter.
func loadFilter(prog []bpf.Instruction) error {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return fmt.Errorf("seccomp: assembling: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("seccomp: loading the filter: %w", errno)
	}
	return nil
}
