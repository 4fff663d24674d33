//go:build linux

// Package filter builds the seccomp filters the sandbox shim installs.
// They are assembled here, in the agent, with x/net/bpf and, for the
// name filter, go-seccomp-bpf (pure Go, so release builds stay static),
// and travel to the shim as raw sock_filter programs: the shim, started
// for every run, links no assembler and no syscall tables. On amd64 the
// name filter and the few syscall numbers the other filters need are
// kept assembled (native_amd64.go, checked against go-seccomp-bpf by the
// tests), so that the agent does not link go-seccomp-bpf's tables of
// every architecture, which cost every start of the agent (every `exec`)
// their building; other architectures assemble them at run time
// (native_other.go, package names).
//
// [Programs] returns three filters, installed in order; the kernel runs
// them all and the strictest answer wins:
//
//  1. the architecture check: a syscall made through a foreign ABI (i386
//     int 0x80 on amd64) kills the process, since the other filters only
//     know native numbers;
//  2. the argument filter (argFilter): clone with namespace flags,
//     terminal-injection ioctls, and socket families the policy does not
//     allow, compared on the low 32 bits the kernel actually reads;
//  3. the name filter (names.Policy): the deniedCalls syscalls with EPERM,
//     clone3 with ENOSYS (libc then falls back to clone, whose flags
//     filter 2 sees), x32 calls with ENOSYS.
package filter

import (
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Namespace flags of clone(2); a clone asking for any of them is refused.
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// archFilter kills the process on any syscall made through a foreign
// ABI (i386 int 0x80 on amd64, for instance): the deny-list filter only
// knows the native numbers, so a foreign call would otherwise pass.
func archFilter(id uint32) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: id, SkipTrue: 1},
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
// terminal-injection ioctls TIOCSTI and TIOCLINUX; calls that change
// another process's limits or scheduling (prlimit64, sched_set*,
// setpriority, ioprio_set with a target other than the caller itself,
// which Landlock does not cover); and socket(2) for any family the spec
// does not allow. With the network cut only AF_UNIX may be allowed; with
// it open, AF_INET, AF_INET6 and AF_NETLINK (which getaddrinfo uses),
// plus AF_UNIX when allowed. socketpair(2) stays allowed: it reaches
// nothing outside.
func argFilter(netCut, unixOK, metadata, netView, proxied bool) []bpf.Instruction {
	var families []uint32
	if !netCut {
		families = append(families, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK)
	}
	if unixOK {
		families = append(families, unix.AF_UNIX)
	}
	var sock []bpf.Instruction
	sock = append(sock, argLo(0))
	if netCut && proxied {
		// AF_INET and AF_INET6 stream sockets of protocol 0 or TCP only,
		// to reach the run's egress proxy: no UDP, no raw or packet
		// socket, no SCTP or MPTCP (which Landlock's TCP rules do not
		// cover). The type's low 4 bits are the type; the rest are
		// SOCK_NONBLOCK and SOCK_CLOEXEC.
		sock = append(sock,
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET, SkipTrue: 1},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET6, SkipFalse: 7},
			argLo(1),
			bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SOCK_STREAM, SkipFalse: 4},
			argLo(2),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipTrue: 1},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.IPPROTO_TCP, SkipFalse: 1},
			retAllow,
			argLo(0),
		)
	}
	if netCut && netView {
		// AF_NETLINK with protocol NETLINK_ROUTE only: the interfaces,
		// addresses and routes, read from the kernel. Without
		// CAP_NET_ADMIN over the host's network namespace (which a run
		// in a user namespace of its own, or with its capabilities
		// dropped, does not have) rtnetlink changes nothing and
		// reaches no other socket (a unicast to a port id or a
		// multicast send needs that capability); other protocols
		// (NETLINK_USERSOCK, sock_diag, audit, ...) stay denied.
		sock = append(sock,
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_NETLINK, SkipFalse: 3},
			argLo(2),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.NETLINK_ROUTE, SkipFalse: 1},
			retAllow,
			argLo(0),
		)
	}
	for i, f := range families {
		// Jump to the final "allow" (len(families)-i) instructions ahead.
		sock = append(sock, bpf.JumpIf{Cond: bpf.JumpEqual, Val: f, SkipTrue: uint8(len(families) - i)})
	}
	sock = append(sock, retDeny, retAllow)

	clone := []bpf.Instruction{
		argLo(0),
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: cloneNewFlags, SkipFalse: 1},
		retDeny, retAllow,
	}
	ioctl := []bpf.Instruction{
		argLo(1),
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.TIOCSTI, SkipTrue: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.TIOCLINUX, SkipFalse: 1},
		retDeny, retAllow,
	}
	// self allows the call only when argument i is 0 (the caller).
	self := func(i uint32) []bpf.Instruction {
		return []bpf.Instruction{argLo(i), bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 1}, retAllow, retDeny}
	}
	// whoSelf allows setpriority/ioprio_set only for which == kind and
	// who == 0: the calling process alone, not its group or its user.
	whoSelf := func(kind uint32) []bpf.Instruction {
		return []bpf.Instruction{
			argLo(0), bpf.JumpIf{Cond: bpf.JumpEqual, Val: kind, SkipFalse: 3},
			argLo(1), bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 1},
			retAllow, retDeny,
		}
	}
	// setid refuses a mode with the set-user-ID or set-group-ID bit
	// (argument m): a file made setuid by a command that runs as root
	// would hand root to any local user (systemd's RestrictSUIDSGID).
	setid := func(m uint32) []bpf.Instruction {
		return []bpf.Instruction{argLo(m), bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: unix.S_ISUID | unix.S_ISGID, SkipFalse: 1}, retDeny, retAllow}
	}
	// setidCreate does the same for open calls, only when they create
	// (flags in argument f, mode in argument m).
	setidCreate := func(f, m uint32) []bpf.Instruction {
		return []bpf.Instruction{
			argLo(f), bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: unix.O_CREAT | oTmpfileBit, SkipFalse: 3},
			argLo(m), bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: unix.S_ISUID | unix.S_ISGID, SkipFalse: 1},
			retDeny, retAllow,
		}
	}
	type block struct {
		nr   uint32
		code []bpf.Instruction
	}
	var blocks []block
	// Calls this architecture may lack (the legacy ones are x86 only)
	// are looked up by name.
	for _, c := range []struct {
		name string
		code []bpf.Instruction
	}{
		{"chmod", setid(1)}, {"fchmod", setid(1)}, {"fchmodat", setid(2)}, {"fchmodat2", setid(2)},
		{"mkdir", setid(1)}, {"mkdirat", setid(2)}, {"mknod", setid(1)}, {"mknodat", setid(2)},
		{"creat", setid(1)}, {"open", setidCreate(1, 2)}, {"openat", setidCreate(2, 3)},
	} {
		if nr, ok := syscallNr(c.name); ok {
			blocks = append(blocks, block{nr, c.code})
		}
	}
	blocks = append(blocks, []block{
		{unix.SYS_SOCKET, sock},
		{unix.SYS_CLONE, clone},
		{unix.SYS_IOCTL, ioctl},
		{unix.SYS_PRLIMIT64, self(0)},
		{unix.SYS_SCHED_SETAFFINITY, self(0)},
		{unix.SYS_SCHED_SETSCHEDULER, self(0)},
		{unix.SYS_SCHED_SETPARAM, self(0)},
		{unix.SYS_SCHED_SETATTR, self(0)},
		{unix.SYS_SETPRIORITY, whoSelf(unix.PRIO_PROCESS)},
		{unix.SYS_IOPRIO_SET, whoSelf(1)}, // IOPRIO_WHO_PROCESS
	}...)
	if !metadata {
		// utimensat with a path (futimens passes none) is a metadata
		// call by path: see metadataCalls.
		blocks = append(blocks, block{unix.SYS_UTIMENSAT, []bpf.Instruction{
			bpf.LoadAbsolute{Off: 24, Size: 4}, bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 3},
			bpf.LoadAbsolute{Off: 28, Size: 4}, bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 1},
			retAllow, retDeny,
		}})
	}
	// Dispatch on the syscall number: one jump per block, then "allow";
	// each block ends in a return.
	prog := []bpf.Instruction{bpf.LoadAbsolute{Off: 0, Size: 4}}
	offset := 0
	for k, b := range blocks {
		// From after jump k, skip the remaining jumps, the "allow" and
		// the blocks before block k.
		skip := (len(blocks) - k - 1) + 1 + offset
		if skip > 255 {
			panic("filter: argument filter too long for one BPF jump")
		}
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: b.nr, SkipTrue: uint8(skip)})
		offset += len(b.code)
	}
	prog = append(prog, retAllow)
	for _, b := range blocks {
		prog = append(prog, b.code...)
	}
	return prog
}

// oTmpfileBit is __O_TMPFILE: O_TMPFILE creates a file too.
const oTmpfileBit = 0o20000000

var (
	retAllow = bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	retDeny  = bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)}
)

var cache sync.Map // Options -> [][]byte

// Options chooses a run's variant of the filters.
type Options struct {
	// NetCut denies every socket family but AF_UNIX.
	NetCut bool
	// Unix allows AF_UNIX sockets.
	Unix bool
	// Metadata allows the metadataCalls; false denies them (runs without
	// bwrap's mount view).
	Metadata bool
	// HostPIDs denies the hostPIDsCalls too (a run that shares the
	// host's PID namespace).
	HostPIDs bool
	// NetView, with NetCut, also allows AF_NETLINK sockets of protocol
	// NETLINK_ROUTE: a run in the host's network namespace that reads
	// its interfaces and addresses and sends nothing
	// (system:read network_interfaces).
	NetView bool
	// Proxied, with NetCut, also allows AF_INET and AF_INET6 stream
	// sockets (protocol 0 or TCP): a run whose network namespace holds
	// nothing but its egress proxy's listener.
	Proxied bool
}

// Programs returns the three filters for a run, each as raw struct
// sock_filter bytes in native byte order, ready for seccomp(2).
// Results are cached: a long-running agent assembles each variant once.
func Programs(o Options) ([][]byte, error) {
	if v, ok := cache.Load(o); ok {
		return v.([][]byte), nil
	}
	id, err := auditArch()
	if err != nil {
		return nil, err
	}
	names, err := nameProgram(o.Metadata, o.HostPIDs)
	if err != nil {
		return nil, err
	}
	var raws [][]bpf.RawInstruction
	for _, prog := range [][]bpf.Instruction{archFilter(id), argFilter(o.NetCut, o.Unix, o.Metadata, o.NetView, o.Proxied)} {
		raw, err := bpf.Assemble(prog)
		if err != nil {
			return nil, fmt.Errorf("seccomp: assembling: %w", err)
		}
		raws = append(raws, raw)
	}
	var out [][]byte
	for _, raw := range append(raws, names) {
		out = append(out, encode(raw))
	}
	cache.Store(o, out)
	return out, nil
}

// ListenFilter is the filter tailnet.DenyListen loads into the agent
// (listen(2) refused but on the shim's egress proxy socket), as raw
// struct sock_filter bytes in native byte order.
func ListenFilter() ([]byte, error) {
	raw, err := listenProgram()
	if err != nil {
		return nil, err
	}
	return encode(raw), nil
}

// encode lays raw out as struct sock_filter in native byte order.
func encode(raw []bpf.RawInstruction) []byte {
	b := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		b = binary.NativeEndian.AppendUint16(b, r.Op)
		b = append(b, r.Jt, r.Jf)
		b = binary.NativeEndian.AppendUint32(b, r.K)
	}
	return b
}

// Supported reports whether this kernel has the seccomp syscall: strict
// mode takes no flags, so asking for it with one fails with EINVAL where
// the call exists and is allowed.
func Supported() bool {
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_STRICT, 1, 0)
	return errno == unix.EINVAL
}
