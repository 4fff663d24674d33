package sandbox

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/sandbox/shim"
)

// SweepOrphans kills the sandboxes of this user that nothing will ever
// end: bubblewrap's inner process (the one in the run's own user
// namespace) whose outer process is gone. bwrap's --die-with-parent
// ends it when the outer process dies, but only once it is set up: an
// agent killed (kill -9, a power button) while bwrap was still setting
// a run up leaves the inner process waiting for a signal from the
// outer one that will never come, forever. It is harmless (the command
// never started) but it holds a process and its namespaces.
//
// A process is one of those when it is a bwrap whose arguments run the
// metnos shim, in a user namespace other than this process's, and its
// parent is not such a bwrap (a running sandbox's inner process has its
// outer one as parent). A dry run's bwrap (named [shim.LayerBwrap])
// runs its outer process in the layer stage's user namespace, a child
// of the agent's: only one in a namespace further down, its inner
// process, is taken for an orphan. Processes of other users, and ones
// this process cannot inspect, are left alone. It returns how many it
// killed.
func SweepOrphans(log *slog.Logger) int {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	self, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return 0
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	uid := os.Getuid()
	n := 0
	for _, dir := range procs {
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if !orphanSandbox(pid, uid, self) {
			continue
		}
		// A pidfd pins the process: checked again through it, the
		// signal cannot reach another process that took the pid.
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		if orphanSandbox(pid, uid, self) && unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
			n++
			log.Warn("sandbox: killed a sandbox left half set up by an agent that died while starting it", "pid", pid)
			if ppid, _ := procStat(pid); ppid == os.Getpid() {
				// Reparented to this subreaper: reap it.
				go unix.Wait4(pid, nil, unix.WALL, nil)
			}
		}
		unix.Close(fd)
	}
	return n
}

// orphanSandbox reports whether pid is an inner bwrap of a metnos run,
// owned by uid, outside the user namespace self, whose parent is not
// its outer bwrap.
func orphanSandbox(pid, uid int, self string) bool {
	layer := isLayerBwrap(pid)
	if (!isShimBwrap(pid) && !layer) || procUID(pid) != uid {
		return false
	}
	ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/user")
	if err != nil || ns == self {
		return false
	}
	ppid, _ := procStat(pid)
	if ppid <= 0 || isShimBwrap(ppid) || isLayerBwrap(ppid) {
		return false
	}
	// A dry run's outer bwrap, whose parent is its agent, lives in a
	// user namespace the agent made: its parent namespace is this
	// one. When that cannot be read, it is left alone.
	if layer {
		under, ok := userNSParentIs(pid, "/proc/self/ns/user")
		return ok && !under
	}
	return true
}

// nsGetParent is NS_GET_PARENT of linux/nsfs.h: _IO(0xb7, 0x2).
const nsGetParent = 0xb702

// userNSParentIs reports whether the parent of pid's user namespace is
// the namespace at nsPath; ok is false when that cannot be read.
func userNSParentIs(pid int, nsPath string) (is, ok bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/user")
	if err != nil {
		return false, false
	}
	defer f.Close()
	parent, err := unix.IoctlRetInt(int(f.Fd()), nsGetParent)
	if err != nil {
		return false, false
	}
	defer unix.Close(parent)
	var p, want unix.Stat_t
	if unix.Fstat(parent, &p) != nil || unix.Stat(nsPath, &want) != nil {
		return false, false
	}
	return p.Dev == want.Dev && p.Ino == want.Ino, true
}

// isShimBwrap reports whether pid runs bwrap with the metnos shim
// among its arguments.
func isShimBwrap(pid int) bool {
	args := cmdline(pid)
	return len(args) > 0 && filepath.Base(args[0]) == "bwrap" && runsShim(args)
}

// isLayerBwrap reports whether pid is a dry run's bwrap (argv[0]
// shim.LayerBwrap) with the metnos shim among its arguments.
func isLayerBwrap(pid int) bool {
	args := cmdline(pid)
	return len(args) > 0 && args[0] == shim.LayerBwrap && runsShim(args)
}

// cmdline is pid's arguments, nil when they cannot be read.
func cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	var out []string
	for _, a := range bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0}) {
		out = append(out, string(a))
	}
	return out
}

func runsShim(args []string) bool {
	for _, a := range args[1:] {
		if a == shim.Arg {
			return true
		}
	}
	return false
}

// procUID is the real uid of pid, -1 when unknown.
func procUID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				if u, err := strconv.Atoi(f[0]); err == nil {
					return u
				}
			}
		}
	}
	return -1
}
