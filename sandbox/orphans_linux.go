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
// outer one as parent). Processes of other users, and ones this process
// cannot inspect, are left alone. It returns how many it killed.
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
	if !isShimBwrap(pid) || procUID(pid) != uid {
		return false
	}
	ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/user")
	if err != nil || ns == self {
		return false
	}
	ppid, _ := procStat(pid)
	return ppid > 0 && !isShimBwrap(ppid)
}

// isShimBwrap reports whether pid runs bwrap with the metnos shim
// among its arguments.
func isShimBwrap(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return false
	}
	args := bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0})
	if filepath.Base(string(args[0])) != "bwrap" {
		return false
	}
	for _, a := range args[1:] {
		if string(a) == shim.Arg {
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
