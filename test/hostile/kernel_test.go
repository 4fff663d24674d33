//go:build linux

package hostile

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// probe is one syscall the seccomp filter must refuse with EPERM. Its
// arguments are chosen so that, outside, the kernel answers with
// something else than EPERM whoever runs it (success, or an error found
// before any privilege check): an EPERM inside then comes from the
// filter, not from missing privileges.
type probe struct{ name, py string }

var probes = []probe{
	{"mount", `sc(165, b"none", b"/nonexistent-metnos-hostile", b"tmpfs", ctypes.c_ulong(0), None)`},
	{"umount2", `sc(166, b"/nonexistent-metnos-hostile", 0)`},
	{"chroot", `sc(161, b"/nonexistent-metnos-hostile")`},
	{"setns", `sc(308, -1, 0)`},
	{"unshare-user", `fresh(lambda: sc(272, 0x10000000))`},
	{"unshare-user-mount-net", `fresh(lambda: sc(272, 0x10000000 | 0x00020000 | 0x40000000))`},
	{"clone-newuser", `fresh(clone_newuser)`},
	{"io_uring_setup", `sc(425, 1, None)`},
	{"keyctl", `sc(250, 0, ctypes.c_long(-3), 0)`},
	{"bpf", `sc(321, 0, None, 1 << 20)`},
	{"perf_event_open", `sc(298, None, 0, -1, -1, 0)`},
	{"userfaultfd", `sc(323, 1)`},
	{"name_to_handle_at", `sc(303, ctypes.c_int(-100), b"/", ctypes.create_string_buffer(8), ctypes.byref(ctypes.c_int()), 0)`},
	{"process_vm_readv", `sc(310, os.getpid(), None, 0, None, 0, 0)`},
	{"ptrace", `sc(101, 0x4206, 0, 0, 0)`}, // PTRACE_SEIZE of pid 0: ESRCH outside
	{"ioctl-TIOCSTI", `sc(16, 0, 0x5412, ctypes.byref(ctypes.c_char(b"x")))`},
	{"socket-AF_INET", `sc(41, 2, 1, 0)`},
	{"socket-AF_INET-high-bits", `sc(41, ctypes.c_long(2 | (1 << 32)), 1, 0)`},
	{"socket-AF_INET6", `sc(41, 10, 1, 0)`},
	{"socket-AF_NETLINK", `sc(41, 16, 3, 0)`},
	{"socket-AF_UNIX", `sc(41, 1, 1, 0)`},
}

const pyProbes = `
def fresh(f):
    # Run f in a child, so that a namespace it enters does not change
    # the later probes.
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(wr, ("%d %d" % f()).encode())
        os._exit(0)
    os.close(wr)
    data = os.read(rd, 100)
    os.waitpid(pid, 0)
    r, e = data.split()
    return int(r), int(e)
def clone_newuser():
    r, e = sc(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER|SIGCHLD)
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
    return r, e
`

func probeScript() string {
	var b strings.Builder
	b.WriteString(pyProbes)
	for _, p := range probes {
		b.WriteString("r, e = " + p.py + "\n")
		b.WriteString(`print("PROBE ` + p.name + ` %d %s" % (r, ename(e) if r < 0 else "ok"), flush=True)` + "\n")
	}
	return b.String()
}

func parseProbes(out string) map[string]string {
	got := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "PROBE" {
			got[f[1]] = f[3]
		}
	}
	return got
}

// TestKernelSurface: the syscalls that reach kernel attack surface
// (mounts, namespaces, io_uring, keyrings, eBPF, handles, tracing,
// terminal injection, sockets with the network cut) fail with EPERM
// inside and not outside.
func TestKernelSurface(t *testing.T) {
	requireSandbox(t, false)
	fx := newFixture(t)
	outside := runOutside(t, fx, pyArgv(probeScript()), 0)
	og := parseProbes(outside.stdout)
	forModes(t, func(t *testing.T, m mode) {
		r := runInside(t, fx, m, supervised(nil, []string{"{{WORK}}"})(t, fx), pyArgv(probeScript()), sandbox.Limits{})
		ig := parseProbes(r.stdout)
		for _, p := range probes {
			t.Run(p.name, func(t *testing.T) {
				switch o := og[p.name]; o {
				case "":
					t.Fatalf("the probe did not run outside\n%s", outside)
				case "EPERM":
					t.Fatalf("%s fails with EPERM outside the sandbox already, so this test proves nothing\n%s", p.name, outside)
				}
				if ig[p.name] != "EPERM" {
					t.Errorf("%s inside the sandbox gave %q, want EPERM from the seccomp filter (outside: %s)\n%s", p.name, ig[p.name], og[p.name], r)
				}
			})
		}
		attack(t, fx, m, attackCase{
			name:   "unshare-U-command",
			policy: supervised(nil, []string{"{{WORK}}"}),
			sh:     "unshare -U true && unshare -U -r true",
		})
		mount := attackCase{
			name:   "mount-tmpfs-command",
			policy: supervised(nil, []string{"{{WORK}}"}),
			setup:  func(t *testing.T, fx *fixture) { mkdir(t, fx.Work+"/mnt", 0o755) },
			sh:     "mount -t tmpfs none {{WORK}}/mnt && umount {{WORK}}/mnt",
		}
		if !isRoot() {
			mount.outsideFails = "only root can mount on the host"
		}
		attack(t, fx, m, mount)
	})
}

// TestInForce: inside, every capability set is empty, no_new_privs is
// set, a seccomp filter is installed and Landlock itself (not only the
// mounts) refuses what no rule allows.
func TestInForce(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		r := runInside(t, fx, m, supervised(nil, []string{"{{WORK}}"})(t, fx), shArgv("cat /proc/self/status"), sandbox.Limits{})
		st := map[string]string{}
		for _, line := range strings.Split(r.stdout, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				st[k] = strings.TrimSpace(v)
			}
		}
		want := map[string]string{
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
			"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
			"NoNewPrivs": "1", "Seccomp": "2",
		}
		if !m.bwrap && !isRoot() {
			// Without a user namespace an unprivileged process cannot
			// shrink its bounding set (CAP_SETPCAP); with no_new_privs
			// and empty sets, nothing can be gained from it.
			t.Logf("CapBnd inside is %s (not checked: uid %d has no CAP_SETPCAP outside a user namespace)", st["CapBnd"], os.Getuid())
			delete(want, "CapBnd")
		}
		for k, want := range want {
			if st[k] != want {
				t.Errorf("/proc/self/status inside: %s is %q, want %q", k, st[k], want)
			}
		}
		if st["Seccomp_filters"] == "" || st["Seccomp_filters"] == "0" {
			t.Errorf("/proc/self/status inside: Seccomp_filters is %q, want at least 1", st["Seccomp_filters"])
		}

		// Landlock, proven on its own: in bwrap's view "/" is a tmpfs
		// the sandbox user owns, so only Landlock stops a mkdir there;
		// without bwrap, the host file is writable by this user, so
		// only Landlock stops the write.
		py := `
try:
    os.mkdir("/metnos-landlock-probe")
    print("mkdir ok")
except OSError as e:
    print("mkdir", ename(e.errno))
`
		if !m.bwrap {
			py = `
try:
    open("{{OUTSIDE}}/target.txt", "a").write("PWNED")
    print("write ok")
except OSError as e:
    print("write", ename(e.errno))
`
			// The same write outside succeeds.
			fx.reset(t)
			o := runOutside(t, fx, pyArgv(fx.expand(py)), 0)
			if !strings.Contains(o.stdout, "write ok") {
				t.Fatalf("the write does not work outside the sandbox, so this test proves nothing\n%s", o)
			}
			fx.reset(t)
		}
		r = runInside(t, fx, m, supervised(nil, []string{"{{WORK}}"})(t, fx), pyArgv(fx.expand(py)), sandbox.Limits{})
		if !strings.Contains(r.stdout, " EACCES") {
			t.Errorf("a write no Landlock rule allows was not refused with EACCES (Landlock not in force?)\n%s", r)
		}
		if fileHas(fx.Outside+"/target.txt", "PWNED") {
			t.Errorf("host file outside every grant changed: %s/target.txt", fx.Outside)
		}
	})
}

// TestSysctlWrite: the command cannot write kernel settings. Only root
// can on the host, so the outside half runs only as root (it writes the
// current value back, which changes nothing).
func TestSysctlWrite(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		c := attackCase{
			sh: "v=$(cat /proc/sys/vm/swappiness) && echo \"$v\" > /proc/sys/vm/swappiness && echo WROTE-SYSCTL",
			landed: func(t *testing.T, fx *fixture, r result) []string {
				if strings.Contains(r.stdout, "WROTE-SYSCTL") {
					return []string{"/proc/sys/vm/swappiness written from inside"}
				}
				return nil
			},
		}
		if !isRoot() {
			c.outsideFails = "only root can write /proc/sys on the host"
		}
		for _, rp := range []readPolicy{
			// Not the full profiles: as root they may write what root
			// owns, by definition.
			{name: "supervised", policy: supervised(nil, []string{"{{WORK}}"})},
			{name: "readonly-profile", policy: profileOnly(policy.ProfileReadonly)},
		} {
			if rp.bwrapOnly && !m.bwrap {
				continue
			}
			c.name, c.policy = rp.name, rp.policy
			attack(t, fx, m, c)
		}
	})
}

// TestInheritedFDs: a descriptor the agent itself inherited without
// close-on-exec (from a shell, a service manager, a careless parent) does
// not reach the command: an open directory (~/.ssh) or an open file
// (~/.ssh/id_rsa) would give the command the masked key.
func TestInheritedFDs(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		for _, c := range []struct{ name, rel string }{
			{"open-dir-inherited-by-agent", ".ssh"},
			{"open-file-inherited-by-agent", ".ssh/id_rsa"},
		} {
			fd := -1
			attack(t, fx, m, attackCase{
				name:   c.name,
				policy: supervised(nil, []string{"{{WORK}}"}),
				setup: func(t *testing.T, fx *fixture) {
					var err error
					// No O_CLOEXEC: as if the agent's parent had leaked it.
					if fd, err = unix.Open(fx.path(c.rel), unix.O_RDONLY, 0); err != nil {
						t.Fatal(err)
					}
				},
				cleanup: func(t *testing.T, fx *fixture) { unix.Close(fd) },
				py: `
for fd in range(3, 1024):
    try:
        f = os.open("id_rsa", os.O_RDONLY, dir_fd=fd)
    except NotADirectoryError:
        f = fd
    except OSError:
        continue
    try:
        print("fd", fd, os.pread(f, 200, 0).decode(errors="replace"))
    except OSError:
        pass
`,
				secrets: []string{fx.Secrets[0].Token},
			})
		}
	})
}
