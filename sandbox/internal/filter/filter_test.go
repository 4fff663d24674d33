//go:build linux

package filter

import (
	"bytes"
	"encoding/binary"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/metnos/agent/sandbox/internal/filter/names"
)

var update = flag.Bool("update", false, "rewrite testdata/seccomp_<arch>.golden")

// seccompData lays out struct seccomp_data (nr, arch, instruction
// pointer, six 64-bit arguments) as a little-endian kernel presents it to
// a filter, for x/net/bpf's VM, which loads 32-bit words big-endian: each
// word sits where the kernel has it, in the VM's byte order.
func seccompData(nr int, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], uint32(nr))
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[20+8*i:], uint32(a>>32))
	}
	return b
}

func TestArgFilter(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the test lays out seccomp_data little-endian")
	}
	const (
		allow = unix.SECCOMP_RET_ALLOW
		deny  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	)
	hi := uint64(1) << 32 // high bits the kernel ignores for 32-bit arguments
	type Spec struct{ NetCut, Unix, NoMeta, NetView, Proxied bool }
	cases := []struct {
		name string
		spec Spec
		nr   int
		args []uint64
		want uint32
	}{
		{"netcut inet", Spec{NetCut: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET}, deny},
		{"netcut inet6", Spec{NetCut: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET6}, deny},
		{"netcut unix denied", Spec{NetCut: true}, unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, deny},
		{"netcut unix allowed", Spec{NetCut: true, Unix: true}, unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, allow},
		{"netcut unix allowed, inet denied", Spec{NetCut: true, Unix: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET}, deny},
		{"net inet", Spec{}, unix.SYS_SOCKET, []uint64{unix.AF_INET}, allow},
		{"net inet6", Spec{}, unix.SYS_SOCKET, []uint64{unix.AF_INET6}, allow},
		{"net netlink", Spec{}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK}, allow},
		{"net unix denied", Spec{}, unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, deny},
		{"net unix denied despite high bits", Spec{}, unix.SYS_SOCKET, []uint64{hi | unix.AF_UNIX}, deny},
		{"net packet", Spec{}, unix.SYS_SOCKET, []uint64{unix.AF_PACKET}, deny},
		{"net vsock", Spec{}, unix.SYS_SOCKET, []uint64{unix.AF_VSOCK}, deny},
		{"clone thread", Spec{}, unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_THREAD}, allow},
		{"clone newuser", Spec{}, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER}, deny},
		{"clone newnet", Spec{}, unix.SYS_CLONE, []uint64{uint64(unix.SIGCHLD) | unix.CLONE_NEWNET}, deny},
		{"ioctl tiocsti", Spec{}, unix.SYS_IOCTL, []uint64{0, unix.TIOCSTI}, deny},
		{"ioctl tiocsti high bits", Spec{}, unix.SYS_IOCTL, []uint64{0, hi | unix.TIOCSTI}, deny},
		{"ioctl tiocgwinsz", Spec{}, unix.SYS_IOCTL, []uint64{0, unix.TIOCGWINSZ}, allow},
		{"read", Spec{NetCut: true}, unix.SYS_READ, nil, allow},
		{"fchmodat setuid", Spec{}, unix.SYS_FCHMODAT, []uint64{0, 0, 0o4755}, deny},
		{"fchmodat setgid", Spec{}, unix.SYS_FCHMODAT, []uint64{0, 0, 0o2755}, deny},
		{"fchmodat plain", Spec{}, unix.SYS_FCHMODAT, []uint64{0, 0, 0o755}, allow},
		{"fchmod setuid", Spec{}, unix.SYS_FCHMOD, []uint64{3, 0o4755}, deny},
		{"openat create setuid", Spec{}, unix.SYS_OPENAT, []uint64{0, 0, unix.O_CREAT | unix.O_WRONLY, 0o4755}, deny},
		{"openat create plain", Spec{}, unix.SYS_OPENAT, []uint64{0, 0, unix.O_CREAT | unix.O_WRONLY, 0o644}, allow},
		{"openat read, mode garbage", Spec{}, unix.SYS_OPENAT, []uint64{0, 0, unix.O_RDONLY, 0o4755}, allow},
		{"mkdirat setgid", Spec{}, unix.SYS_MKDIRAT, []uint64{0, 0, 0o2775}, deny},
		{"utimensat path, fallback", Spec{NoMeta: true}, unix.SYS_UTIMENSAT, []uint64{0, 0x7f00, 0, 0}, deny},
		{"utimensat fd, fallback", Spec{NoMeta: true}, unix.SYS_UTIMENSAT, []uint64{3, 0, 0, 0}, allow},
		{"utimensat path, bwrap", Spec{}, unix.SYS_UTIMENSAT, []uint64{0, 0x7f00, 0, 0}, allow},
		{"prlimit self", Spec{}, unix.SYS_PRLIMIT64, []uint64{0, unix.RLIMIT_NOFILE}, allow},
		{"prlimit other", Spec{}, unix.SYS_PRLIMIT64, []uint64{1234, unix.RLIMIT_NOFILE}, deny},
		{"sched_setaffinity other", Spec{}, unix.SYS_SCHED_SETAFFINITY, []uint64{1234}, deny},
		{"sched_setattr self", Spec{}, unix.SYS_SCHED_SETATTR, []uint64{0}, allow},
		{"setpriority self", Spec{}, unix.SYS_SETPRIORITY, []uint64{unix.PRIO_PROCESS, 0, 10}, allow},
		{"setpriority other", Spec{}, unix.SYS_SETPRIORITY, []uint64{unix.PRIO_PROCESS, 1234, 10}, deny},
		{"setpriority own user", Spec{}, unix.SYS_SETPRIORITY, []uint64{unix.PRIO_USER, 0, 10}, deny},
		{"ioprio_set self", Spec{}, unix.SYS_IOPRIO_SET, []uint64{1, 0, 0}, allow},
		{"ioprio_set user", Spec{}, unix.SYS_IOPRIO_SET, []uint64{3, 0, 0}, deny},
		{"socketpair", Spec{NetCut: true}, unix.SYS_SOCKETPAIR, []uint64{unix.AF_UNIX}, allow},
		{"netcut netlink route denied", Spec{NetCut: true}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, deny},
		{"netview netlink route", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE}, allow},
		{"netview netlink route, high bits", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{hi | unix.AF_NETLINK, unix.SOCK_DGRAM, hi | unix.NETLINK_ROUTE}, allow},
		{"netview netlink usersock", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_USERSOCK}, deny},
		{"netview netlink sock_diag", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG}, deny},
		{"netview netlink uevent", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_KOBJECT_UEVENT}, deny},
		{"netview netlink generic", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC}, deny},
		{"netview inet", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_DGRAM, 0}, deny},
		{"netview inet6", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_DGRAM, 0}, deny},
		{"netview packet", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0}, deny},
		{"netview unix denied", Spec{NetCut: true, NetView: true}, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, deny},
		{"netview unix allowed", Spec{NetCut: true, NetView: true, Unix: true}, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, allow},
		{"netview unix allowed, usersock denied", Spec{NetCut: true, NetView: true, Unix: true}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_USERSOCK}, deny},
		{"proxied tcp", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_CLOEXEC, 0}, allow},
		{"proxied tcp6 ipproto_tcp", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_STREAM | unix.SOCK_NONBLOCK, unix.IPPROTO_TCP}, allow},
		{"proxied tcp, high bits", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{hi | unix.AF_INET, hi | unix.SOCK_STREAM, hi}, allow},
		{"proxied udp", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_DGRAM, 0}, deny},
		{"proxied udp6", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_DGRAM | unix.SOCK_CLOEXEC, 0}, deny},
		{"proxied raw", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}, deny},
		{"proxied sctp stream", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP}, deny},
		{"proxied mptcp", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM, 262}, deny},
		{"proxied seqpacket", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_SEQPACKET, 0}, deny},
		{"proxied packet", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_RAW, 0}, deny},
		{"proxied netlink", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, deny},
		{"proxied unix denied", Spec{NetCut: true, Proxied: true}, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, deny},
		{"proxied unix allowed", Spec{NetCut: true, Proxied: true, Unix: true}, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, allow},
		{"netcut tcp denied", Spec{NetCut: true}, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, deny},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vm, err := bpf.NewVM(argFilter(c.spec.NetCut, c.spec.Unix, !c.spec.NoMeta, c.spec.NetView, c.spec.Proxied))
			if err != nil {
				t.Fatalf("filter does not load: %v", err)
			}
			got, err := vm.Run(seccompData(c.nr, c.args...))
			if err != nil {
				t.Fatal(err)
			}
			if uint32(got) != c.want {
				t.Errorf("filter returned %#x, want %#x", got, c.want)
			}
		})
	}
}

func TestFilterPolicyGolden(t *testing.T) {
	pol, err := names.Policy(true, false)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := pol.Dump(&buf); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join("testdata", "seccomp_"+runtime.GOARCH+".golden")
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		t.Skipf("no golden filter for %s", runtime.GOARCH)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("the seccomp filter changed; review it and run go test ./sandbox/internal/filter -update:\n%s", buf.String())
	}
}

func TestProgramsAssemble(t *testing.T) {
	for _, o := range []Options{{NetCut: true, Metadata: true}, {NetCut: true, Unix: true, Metadata: true}, {Metadata: true}, {Unix: true}, {NetCut: true, Metadata: true, HostPIDs: true}, {NetCut: true, Metadata: true, HostPIDs: true, NetView: true}} {
		progs, err := Programs(o)
		if err != nil {
			t.Fatal(err)
		}
		if len(progs) != 3 {
			t.Fatalf("got %d programs, want 3", len(progs))
		}
		for i, p := range progs {
			if len(p) == 0 || len(p)%8 != 0 {
				t.Errorf("program %d is %d bytes, not whole sock_filters", i, len(p))
			}
		}
	}
}

// TestHostPIDsCalls checks the name filter of a run that shares the
// host's PID namespace: pidfd_open and the other calls that take a host
// pid are refused there and only there, and kill stays allowed (the
// command may signal its own children; Landlock's scope keeps it from
// the others).
func TestHostPIDsCalls(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the test lays out seccomp_data little-endian")
	}
	info, err := names.Info()
	if err != nil {
		t.Fatal(err)
	}
	const deny = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	for _, c := range []struct {
		name     string
		nr       int
		hostPIDs bool
		want     uint32
	}{
		{"pidfd_open, host pids", unix.SYS_PIDFD_OPEN, true, deny},
		{"pidfd_open, own pid namespace", unix.SYS_PIDFD_OPEN, false, unix.SECCOMP_RET_ALLOW},
		{"move_pages, host pids", unix.SYS_MOVE_PAGES, true, deny},
		{"migrate_pages, host pids", unix.SYS_MIGRATE_PAGES, true, deny},
		{"ptrace, host pids", unix.SYS_PTRACE, true, deny},
		{"process_vm_readv, host pids", unix.SYS_PROCESS_VM_READV, true, deny},
		{"pidfd_getfd, host pids", unix.SYS_PIDFD_GETFD, true, deny},
		{"kcmp, host pids", unix.SYS_KCMP, true, deny},
		{"kill, host pids", unix.SYS_KILL, true, unix.SECCOMP_RET_ALLOW},
	} {
		t.Run(c.name, func(t *testing.T) {
			pol, err := names.Policy(true, c.hostPIDs)
			if err != nil {
				t.Fatal(err)
			}
			prog, err := pol.Assemble()
			if err != nil {
				t.Fatal(err)
			}
			vm, err := bpf.NewVM(prog)
			if err != nil {
				t.Fatal(err)
			}
			data := seccompData(c.nr)
			binary.BigEndian.PutUint32(data[4:], uint32(info.ID))
			got, err := vm.Run(data)
			if err != nil {
				t.Fatal(err)
			}
			if uint32(got) != c.want {
				t.Errorf("filter returned %#x, want %#x", got, c.want)
			}
		})
	}
}
