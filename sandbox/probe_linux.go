package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"

	"github.com/metnos/agent/sandbox/internal/filter"
)

var (
	probeMu    sync.Mutex
	probeCache = map[string]Caps{}
	quickCache = map[string]Caps{}
)

// trustedBinDirs are the directories bwrap is taken from when it is
// found on PATH: system directories no user process can write to. A
// bwrap elsewhere on PATH (~/.local/bin, say, which a command with a
// home write grant could fill) runs outside every sandbox, so it is
// ignored unless Options.Bwrap names it.
var trustedBinDirs = []string{"/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin", "/usr/local/sbin", "/run/current-system/sw/bin"}

// bwrapPath is the bubblewrap binary to use: o.Bwrap, else the first
// bwrap on o.SearchPath that lies in a trusted system directory, is
// owned by root and is writable by nobody else; "" when there is none.
func bwrapPath(o Options) string {
	if bw := o.Bwrap; bw != "" {
		if abs, err := filepath.Abs(bw); err == nil {
			return abs
		}
		return bw
	}
	dirs := filepath.SplitList(o.SearchPath)
	if o.SearchPath == "" {
		dirs = trustedBinDirs
	}
	for _, dir := range dirs {
		dir = filepath.Clean(dir)
		if !slices.Contains(trustedBinDirs, dir) {
			continue
		}
		cand := filepath.Join(dir, "bwrap")
		if rootOwnedSealed(cand) && rootOwnedSealed(dir) {
			return cand
		}
	}
	return ""
}

// rootOwnedSealed reports whether path (symlinks followed) is owned by
// root and not writable by its group or others.
func rootOwnedSealed(path string) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == 0 && fi.Mode().Perm()&0o022 == 0
}

// Probe reports what this machine offers with o. bwrap is looked up on
// o.SearchPath (or is o.Bwrap) and run once to see whether its
// namespaces work here; the result is cached per bwrap path and
// o.Disabled for the life of the process.
func Probe(o Options) Caps { return cachedCaps(o, true) }

// runCaps is what Run plans with. It does not start bwrap to find out
// whether it works: that costs as much as a whole run. A bwrap that
// exists is taken as usable until a run fails before its command
// started, and then [Probe] decides (see run).
func runCaps(o Options) Caps { return cachedCaps(o, false) }

// cachedCaps returns the Caps for o's bwrap and o.Disabled,
// from the full probe when one was made, else from the kernel alone
// (full false) or by making the full probe (full true).
func cachedCaps(o Options, full bool) Caps {
	bw := bwrapPath(o)
	key := bw + "\x00" + o.Disabled
	probeMu.Lock()
	defer probeMu.Unlock()
	if c, ok := probeCache[key]; ok {
		return c
	}
	if c, ok := quickCache[key]; ok && !full {
		return c
	}
	c := kernelCaps(bw, o.Disabled)
	if !full {
		c.BwrapUsable = c.BwrapError == ""
		quickCache[key] = c
		return c
	}
	if c.BwrapError == "" {
		c.BwrapVersion, c.BwrapUsable, c.BwrapError = probeBwrap(bw)
	}
	c.Cgroup, c.CgroupNote = probeCgroup()
	probeCache[key] = c
	return c
}

// kernelCaps fills in everything but the bwrap run; disabled is
// Options.Disabled.
func kernelCaps(bw, disabled string) Caps {
	c := Caps{OS: "linux", Bwrap: bw, LandlockPinned: 7, Disabled: disabled}
	c.LandlockABI, _ = llsys.LandlockGetABIVersion()
	c.Seccomp = filter.Supported()
	if bw == "" {
		c.BwrapError = "bwrap not found in a system directory on PATH (install bubblewrap)"
	} else if fi, err := os.Stat(bw); err != nil || fi.IsDir() {
		c.BwrapError = "bwrap not found at " + bw
	}
	return c
}

// probeBwrap runs bwrap once with every namespace the sandbox asks for.
func probeBwrap(bw string) (version string, ok bool, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bw, "--version").Output(); err == nil {
		version = strings.TrimSpace(string(out))
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bw, "--unshare-user", "--unshare-ipc", "--unshare-uts", "--unshare-pid",
		"--unshare-net", "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
		"--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "/bin/true")
	cmd.Env = []string{}
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		hint := ""
		switch {
		case strings.Contains(msg, "uid map") || strings.Contains(msg, "RTM_NEWADDR"):
			hint = " (user namespaces are restricted here, e.g. by AppArmor's apparmor_restrict_unprivileged_userns)"
		case strings.Contains(msg, "No space left") || strings.Contains(msg, "Operation not permitted"):
			hint = " (user namespaces are disabled or exhausted: check user.max_user_namespaces)"
		}
		return version, false, "bwrap cannot create its namespaces: " + msg + hint
	}
	return version, true, ""
}

// probeCgroup tries what Run does: make a cgroup for a run (then removes
// it) and says which limits it would enforce.
func probeCgroup() (string, string) {
	cg := newRunCgroup(DefaultLimits().MaxProcs, DefaultLimits().MemoryBytes, weightsOf(priorityPlan(Priority{CPU: CPUNormal, IO: IONormal}, 0, 1)))
	if cg != nil && !cg.pids && !cg.memory {
		// One for the CPU weight alone: the limits use rlimits.
		cg.remove()
		cg = nil
	}
	if cg == nil {
		return "", "no cgroup this process may create with the pids and memory controllers (a delegated cgroup v2, or v1 hierarchies as root); limits use rlimits"
	}
	defer cg.remove()
	kind := "v1 (pids and memory hierarchies)"
	if cg.v2 {
		kind = "v2 under " + filepath.Dir(cg.dirs[0])
	}
	return cg.by(), fmt.Sprintf("cgroup %s; limits use %s", kind, cg.by())
}
