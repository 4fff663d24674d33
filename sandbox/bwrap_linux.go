package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/metnos/agent/policy"
)

// The bwrap translator: a Policy, laid out for one run, as bubblewrap's
// arguments, and what the mount view needs from the host beforehand.

// placeholder is a mount point bwrap creates on the host to mask an
// absent nucleus path beneath a writable bind; Created lists the path
// components that did not exist, deepest last.
type placeholder struct {
	Path    string
	Created []string
}

// bwrapArgs returns bubblewrap's arguments for p, up to and including
// "--" and the shim executable, and the placeholders it will create.
// grantFDs, when it has a grant's path, names the descriptor (as bwrap
// will see it) of that grant, opened when the run started: bwrap then
// binds that very directory, whatever the path has become since.
func bwrapArgs(p layout, shimExe, dir string, grantFDs map[string]int) ([]string, []placeholder, error) {
	a := []string{"--unshare-user", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"}
	// Without a PID namespace (HostPIDs) bwrap's --proc binds the host's
	// /proc: every process is listed; the user namespace, Landlock's
	// ptrace check and signal scope, and seccomp keep the command from
	// their environment, memory and descriptors and from signalling them
	// (planFor refuses the run where they are missing).
	if !p.SharePID && !p.HostPIDs {
		a = append(a, "--unshare-pid")
	}
	// With HostNetView the run keeps the host's network namespace, to
	// read its interfaces; the seccomp filter (AF_NETLINK
	// NETLINK_ROUTE and AF_UNIX only) and Landlock (no TCP
	// bind/connect) cut the network instead (planFor refuses the run
	// without them).
	if !p.Network && !p.HostNetView {
		a = append(a, "--unshare-net")
	}
	a = append(a, "--die-with-parent", "--new-session", "--cap-drop", "ALL")
	switch {
	case p.RootWritable && p.RealDev:
		a = append(a, "--dev-bind", "/", "/", "--dev-bind", "/dev", "/dev")
	case p.RootWritable:
		a = append(a, "--bind", "/", "/")
	case p.RootReadable:
		a = append(a, "--ro-bind", "/", "/")
	default:
		for _, s := range p.System {
			// On a merged-/usr system /bin, /lib... are links into
			// /usr: recreate the link instead of mounting /usr twice.
			if target, ok := systemLink(p.System, s); ok {
				a = append(a, "--symlink", target, s)
				continue
			}
			a = append(a, "--ro-bind", s, s)
		}
	}
	if !p.RealDev {
		a = append(a, "--dev", "/dev")
	}
	a = append(a, "--proc", "/proc")
	// Every profile gets a private /tmp, full-fs-no-net too: the host's
	// holds the user's live session sockets (tmux, ssh-agent, editors),
	// and one of them is a way out of any sandbox.
	a = append(a, "--tmpfs", "/tmp")
	binds := viewBinds(p.Policy)
	bindGrant := func(a []string, g policy.Grant) []string {
		fd, byFD := grantFDs[g.Path]
		switch {
		case byFD && g.Access == policy.Write:
			a = append(a, "--bind-fd", strconv.Itoa(fd), g.Path)
		case byFD:
			a = append(a, "--ro-bind-fd", strconv.Itoa(fd), g.Path)
		case g.Access == policy.Write:
			a = append(a, "--bind", g.Path, g.Path)
		default:
			a = append(a, "--ro-bind", g.Path, g.Path)
		}
		return a
	}
	// The agent's own folders inside a mask are mounted after it (see
	// below); every other grant now.
	var through []policy.Grant
	for _, g := range p.Grants {
		if p.inParent[g.Path] {
			continue // inside its parent's bind: not a mount point
		}
		if _, masked := policy.CoveredByMask(g.Path, p.Masks); g.Own && masked {
			through = append(through, g)
			continue
		}
		a = bindGrant(a, g)
	}
	for _, g := range p.Grants {
		if g.Via != "" {
			if vis, _ := lookupView(binds, g.Via); !vis {
				a = append(a, "--symlink", g.Path, g.Via)
			}
		}
	}
	if shimExe != "" {
		a = append(a, "--ro-bind", shimExe, shimExe)
	}
	// Masks: an empty read-only tmpfs over a directory, /dev/null over a
	// file, a placeholder where an absent path could be created.
	var phs []placeholder
	var masks, remounts []string
	var mounted []string
	for i, m := range p.Masks {
		if coveredByEarlier(p.Masks[:i], m.Path) {
			continue
		}
		vis, wr := lookupView(binds, m.Path)
		if !vis {
			continue
		}
		fi, err := os.Lstat(m.Path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			// A directory made unreadable (by an earlier command, say)
			// must not pass for an absent one.
			return nil, nil, fmt.Errorf("sandbox: cannot inspect the masked path %s: %w (refusing to run without knowing what to hide)", m.Path, err)
		}
		switch {
		case err == nil && fi.Mode()&os.ModeSymlink != 0:
			// The link's target carries its own mask.
			continue
		case err == nil && fi.IsDir():
			masks, remounts = tmpfsMask(masks, remounts, m.Path, through)
		case err == nil:
			masks = append(masks, "--ro-bind", "/dev/null", m.Path)
		case wr && creatable(m.Path):
			phs = append(phs, placeholder{Path: m.Path, Created: missingComponents(m.Path)})
			if m.Kind == policy.MaskFile {
				masks = append(masks, "--ro-bind", "/dev/null", m.Path)
			} else {
				masks, remounts = tmpfsMask(masks, remounts, m.Path, through)
			}
		default:
			continue
		}
		mounted = append(mounted, m.Path)
	}
	// A mask is a mount point, so it cannot be renamed or removed; but
	// its parents could be, taking the mask along and leaving the path
	// free for the next run. Under a writable bind every directory
	// between the bind and a mask is first bound onto itself, which makes
	// it a mount point too; the masks then go on top. (bwrap takes bind
	// sources from the host, so these come before the masks, and the
	// directories must exist: see run.)
	pinned := map[string]bool{}
	for _, g := range p.Grants {
		pinned[g.Path] = true
	}
	for _, path := range mounted {
		root, ok := writableBindOf(binds, path)
		if !ok {
			continue
		}
		for _, anc := range ancestorsBelow(path, root) {
			if pinned[anc] {
				continue
			}
			pinned[anc] = true
			if fi, err := os.Lstat(anc); err == nil && !fi.IsDir() {
				continue
			}
			a = append(a, "--bind", anc, anc)
		}
	}
	a = append(a, masks...)
	// The agent's own folders open through their mask: bound while the
	// mask's tmpfs is still writable (bwrap makes the mount points),
	// before it is made read-only (not recursively: the binds keep
	// their own access).
	for _, g := range through {
		a = bindGrant(a, g)
	}
	a = append(a, remounts...)
	if dir != "" {
		a = append(a, "--chdir", dir)
	}
	a = append(a, "--")
	if shimExe != "" {
		a = append(a, shimExe)
	}
	return a, phs, nil
}

// systemLink reports whether the system path s is a symbolic link whose
// target is another system path (or beneath one), and returns the link's
// text.
func systemLink(system []string, s string) (string, bool) {
	target, err := os.Readlink(s)
	if err != nil {
		return "", false
	}
	resolved, err := filepath.EvalSymlinks(s)
	if err != nil {
		return "", false
	}
	for _, o := range system {
		if o != s && within(resolved, o) {
			if _, err := os.Readlink(o); err != nil {
				return target, true
			}
		}
	}
	return "", false
}

// writableBindOf returns the deepest bind covering path, when it is a
// writable bind of the host.
func writableBindOf(bs []bind, path string) (string, bool) {
	if b := deepestBind(bs, path); b != nil && b.host && b.write {
		return b.path, true
	}
	return "", false
}

// ancestorsBelow lists the directories strictly between root and path,
// shallowest first.
func ancestorsBelow(path, root string) []string {
	var out []string
	for d := filepath.Dir(path); d != root && within(d, root) && d != "/"; d = filepath.Dir(d) {
		out = append([]string{d}, out...)
	}
	return out
}

func coveredByEarlier(ms []policy.Mask, path string) bool {
	for _, m := range ms {
		if within(path, m.Path) {
			return true
		}
	}
	return false
}

// creatable reports whether a process of this user without capabilities
// (as the sandboxed command runs) could create path: whether the nearest
// existing ancestor grants it write permission by its mode bits. Only
// then does an absent masked path need a placeholder; bwrap could not
// create one anyway where the command could not.
func creatable(path string) bool {
	dir := filepath.Dir(path)
	for {
		fi, err := os.Stat(dir)
		if err == nil {
			if !fi.IsDir() {
				return false
			}
			return writableByMode(fi)
		}
		if dir == "/" {
			return false
		}
		dir = filepath.Dir(dir)
	}
}

// missingComponents lists path and those of its parents that do not
// exist, shallowest first.
func missingComponents(path string) []string {
	var out []string
	for p := path; p != "/" && p != "."; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		out = append([]string{p}, out...)
	}
	return out
}

// tmpfsMask hides the directory path behind an empty tmpfs made
// read-only. When one of the agent's own folders lies beneath it, the
// tmpfs is made read-only only after that folder is bound (remounts).
func tmpfsMask(masks, remounts []string, path string, through []policy.Grant) ([]string, []string) {
	masks = append(masks, "--tmpfs", path)
	for _, g := range through {
		if within(g.Path, path) {
			return masks, append(remounts, "--remount-ro", path)
		}
	}
	return append(masks, "--remount-ro", path), remounts
}
