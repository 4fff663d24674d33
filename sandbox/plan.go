package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox/shim"
)

// within reports whether path equals root or lies beneath it, by whole
// path components.
func within(path, root string) bool {
	if root == "/" {
		return strings.HasPrefix(path, "/")
	}
	return path == root || strings.HasPrefix(path, root+"/")
}

// bind is one mount of the bwrap view, used to tell what a path is
// inside the sandbox.
type bind struct {
	path  string
	write bool
	host  bool // false for a private tmpfs (the host path is hidden)
}

// viewBinds lists the mounts bwrapArgs makes, shallowest first.
func viewBinds(p policy.Policy) []bind {
	var bs []bind
	switch {
	case p.RootWritable:
		bs = append(bs, bind{"/", true, true})
	case p.RootReadable:
		bs = append(bs, bind{"/", false, true})
	default:
		for _, s := range p.System {
			bs = append(bs, bind{s, false, true})
		}
	}
	if !p.RealDev {
		bs = append(bs, bind{"/dev", true, false})
	}
	bs = append(bs, bind{"/proc", false, false})
	bs = append(bs, bind{"/tmp", true, false})
	for _, g := range p.Grants {
		bs = append(bs, bind{g.Path, g.Access == policy.Write, true})
	}
	sort.SliceStable(bs, func(i, j int) bool { return len(bs[i].path) < len(bs[j].path) })
	return bs
}

// lookupView tells whether the host path is visible in the bwrap view
// and whether it is writable there.
func lookupView(bs []bind, path string) (visible, writable bool) {
	if b := deepestBind(bs, path); b != nil {
		return b.host, b.write
	}
	return false, false
}

// deepestBind returns the innermost bind covering path, nil if none.
func deepestBind(bs []bind, path string) *bind {
	var best *bind
	for i := range bs {
		if within(path, bs[i].path) && (best == nil || len(bs[i].path) >= len(best.path)) {
			best = &bs[i]
		}
	}
	return best
}

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
	if !p.SharePID {
		a = append(a, "--unshare-pid")
	}
	if !p.Network {
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

// hostPrivate are the host directories a broad rule (the root of the
// readonly and full profiles) never opens without bwrap, as bwrap's view
// replaces them too: /tmp, where other programs leave files and sockets,
// and /dev, whose raw disks would bypass every mask. The run gets its own
// temporary directory and [devFiles] instead; an explicit grant beneath
// them still works.
var hostPrivate = []string{"/tmp", "/dev"}

// devFiles are the device nodes a command gets without bwrap's private
// /dev.
var devFiles = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}

// landlockRules returns the Landlock rules mirroring p. Inside bwrap the
// mounts already hide masked paths and make read-only grants read-only,
// so the rules follow the binds one to one. Without bwrap (inBwrap
// false) Landlock is the only file boundary; since its rules only add
// rights, every rule whose directory holds a masked path, or a read-only
// grant beneath a writable rule, is split into rules for its entries,
// leaving out the masked ones: the split directory itself then gets no
// right at all (it cannot be listed, and nothing can be created directly
// in it). tmpDir is the run's private temporary directory (landlock-only
// mode).
func landlockRules(p layout, inBwrap bool, tmpDir string) []shim.Rule {
	var rules []shim.Rule
	switch {
	case p.RootWritable:
		rules = append(rules, shim.Rule{Path: "/", Write: true, Dev: p.RealDev})
	case p.RootReadable:
		rules = append(rules, shim.Rule{Path: "/"})
	default:
		for _, s := range p.System {
			rules = append(rules, shim.Rule{Path: s})
		}
	}
	rules = append(rules, shim.Rule{Path: "/proc"})
	if inBwrap {
		rules = append(rules, shim.Rule{Path: "/tmp", Write: true}, shim.Rule{Path: "/dev", Write: true, Dev: true})
	} else {
		if tmpDir != "" {
			rules = append(rules, shim.Rule{Path: tmpDir, Write: true})
		}
		for _, d := range devFiles {
			rules = append(rules, shim.Rule{Path: d, Write: true, File: true})
		}
	}
	for _, g := range p.Grants {
		if p.parentOf[g.Path] {
			rules = append(rules, shim.Rule{Path: g.Path, RemoveDir: true})
			continue
		}
		rules = append(rules, shim.Rule{Path: g.Path, Write: g.Access == policy.Write, File: isFile(g.Path)})
	}
	if inBwrap {
		// A nucleus entry that is itself a symbolic link cannot be
		// covered by a mount (bwrap mounts over its target): under a
		// writable rule the link could be removed and the path
		// recreated. Landlock then keeps the link's directory from
		// being written, by splitting the rule around it, as it does
		// for every mask without bwrap.
		var links []string
		for _, m := range p.Masks {
			// The entry itself, or any directory above it, may be the
			// link (a dotfile manager's ~/.config -> dotfiles/config).
			for d := m.Path; d != "/" && d != "."; d = filepath.Dir(d) {
				if fi, err := os.Lstat(d); err == nil && fi.Mode()&os.ModeSymlink != 0 && !slices.Contains(links, d) {
					links = append(links, d)
				}
			}
		}
		if len(links) == 0 {
			return rules
		}
		var out []shim.Rule
		for _, r := range rules {
			if excl := beneath(links, r.Path); r.Write && !r.File && !r.RemoveDir && len(excl) > 0 {
				out = splitRule(out, r, excl)
				continue
			}
			out = append(out, r)
		}
		return out
	}
	var masks, readOnly []string
	for _, m := range p.Masks {
		masks = append(masks, m.Path)
	}
	for _, g := range p.Grants {
		if g.Access == policy.Read {
			readOnly = append(readOnly, g.Path)
		}
	}
	var out []shim.Rule
	for _, r := range rules {
		excl := append(beneath(masks, r.Path), beneath(hostPrivate, r.Path)...)
		if r.Write {
			excl = append(excl, beneath(readOnly, r.Path)...)
		}
		if coveredByEarlier(p.Masks, r.Path) && !ownGrant(p.Policy, r.Path) {
			continue
		}
		if len(excl) == 0 || r.File || r.RemoveDir {
			out = append(out, r)
			continue
		}
		out = splitRule(out, r, excl)
	}
	return out
}

// beneath returns the paths strictly beneath root.
func beneath(paths []string, root string) []string {
	var out []string
	for _, p := range paths {
		if p != root && within(p, root) {
			out = append(out, p)
		}
	}
	return out
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir()
}

// splitRule replaces rule r by rules on the entries of its directory,
// recursing into entries that hold an excluded path and leaving out the
// excluded entries themselves. Symbolic links get no rule: access through
// one needs a right on its target.
func splitRule(out []shim.Rule, r shim.Rule, excl []string) []shim.Rule {
	ents, err := os.ReadDir(r.Path)
	if err != nil {
		return out
	}
	for _, e := range ents {
		child := filepath.Join(r.Path, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			continue
		}
		skip, deeper := false, false
		for _, x := range excl {
			if x == child {
				skip = true
			} else if within(x, child) {
				deeper = true
			}
		}
		switch {
		case skip:
		case deeper && e.IsDir():
			out = splitRule(out, shim.Rule{Path: child, Write: r.Write, Dev: r.Dev}, excl)
		case deeper:
		default:
			out = append(out, shim.Rule{Path: child, Write: r.Write, File: !e.IsDir(), Dev: r.Dev})
		}
	}
	return out
}

// Visible reports whether the absolute path appears inside the sandbox,
// as it is on the host, under p: beneath a bind of the host (a system
// path, a grant or the root of a root profile) and outside every mask.
// The private /tmp, /dev and /proc hide the host's, except where a grant
// opens a path beneath them.
func Visible(p policy.Policy, path string) bool {
	path = filepath.Clean(path)
	for _, g := range p.Grants {
		if g.Own && within(path, g.Path) {
			return true
		}
	}
	if _, masked := policy.CoveredByMask(path, p.Masks); masked {
		return false
	}
	for _, g := range p.Grants {
		if g.Via != "" && within(path, g.Via) {
			return true
		}
	}
	vis, _ := lookupView(viewBinds(p), path)
	return vis
}

// ownGrant reports whether path is the path of one of p's own grants.
func ownGrant(p policy.Policy, path string) bool {
	for _, g := range p.Grants {
		if g.Own && g.Path == path {
			return true
		}
	}
	return false
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

// layout is a Policy as one run mounts it: the Policy's grants, plus the
// parents that withRemovableParents mounts in place of removable grants.
// The zero maps mount every grant as it is.
type layout struct {
	policy.Policy
	// parentOf holds the paths of the grants made at run time for the
	// parent of a Removable grant: bound writable, but their Landlock
	// rule only allows removing empty directories.
	parentOf map[string]bool
	// inParent holds the paths of the writable grants left to the mount
	// of the writable grant around them: they are not bound.
	inParent map[string]bool
}

// withRemovableParents returns p laid out with the parent of every Removable
// grant mounted in its stead, where that is safe: Landlock applies
// (the parent's mount is writable, and only Landlock keeps it to
// removing empty directories), the parent is not "/" nor masked nor
// granted itself, no mask and no other grant lies directly in it, and
// no mask lies inside the grant (its pins would make it a mount point
// again), and, inside bwrap, the parent is not beneath the private /tmp
// or /dev, which the command may write as a whole. Then every writable grant inside another writable grant is
// left to that grant's mount rather than mounted again (the view is
// the same), so that the command can remove it: a mount point cannot
// be removed (EBUSY, protocol §12.15).
func withRemovableParents(p policy.Policy, inBwrap bool) layout {
	l := layout{parentOf: map[string]bool{}, inParent: map[string]bool{}}
	grants := append([]policy.Grant(nil), p.Grants...)
	hasMaskIn := func(dir string) bool {
		for _, m := range p.Masks {
			if within(m.Path, dir) {
				return true
			}
		}
		return false
	}
	for _, g := range grants {
		if !g.Removable || g.Access != policy.Write || g.Own || g.Via != "" || hasMaskIn(g.Path) {
			continue
		}
		a := filepath.Dir(g.Path)
		if a == "/" || a == g.Path || l.parentOf[a] || (inBwrap && (within(a, "/tmp") || within(a, "/dev"))) || systemParent(a) {
			continue
		}
		if _, masked := policy.CoveredByMask(a, p.Masks); masked {
			continue
		}
		ok := true
		for _, m := range p.Masks {
			// Landlock's REMOVE_DIR holds for the whole tree beneath the
			// parent: without bwrap (whose masks are mount points, which
			// cannot be removed) no mask may lie anywhere beneath it.
			if filepath.Dir(m.Path) == a || (!inBwrap && within(m.Path, a)) {
				ok = false
			}
		}
		for _, o := range grants {
			switch {
			case within(a, o.Path) || (filepath.Dir(o.Path) == a && !o.Removable):
				ok = false // already inside a grant, or a sibling grant
			case !inBwrap && o.Access != policy.Write && within(o.Path, a):
				// Without bwrap a read-only grant beneath is no mount
				// point: its empty directories would be removable.
				ok = false
			}
		}
		if ok {
			l.parentOf[a] = true
			grants = append(grants, policy.Grant{Path: a, Access: policy.Write, Why: "parent of removable " + g.Path})
		}
	}
	for _, g := range grants {
		if g.Access != policy.Write || g.Own || g.Via != "" || l.parentOf[g.Path] || hasMaskIn(g.Path) {
			continue
		}
		// Only into the innermost grant around it, and only when that
		// one is writable: a read-only grant in between must stay
		// mounted over it.
		var h *policy.Grant
		for j := range grants {
			if grants[j].Path != g.Path && within(g.Path, grants[j].Path) && (h == nil || len(grants[j].Path) > len(h.Path)) {
				h = &grants[j]
			}
		}
		if h != nil && h.Access == policy.Write && h.Via == "" && !h.Own {
			l.inParent[g.Path] = true
		}
	}
	sort.SliceStable(grants, func(i, j int) bool { return grants[i].Path < grants[j].Path })
	p.Grants = grants
	l.Policy = p
	return l
}

// systemParent reports whether dir is a system path or a shared root
// ([policy.Protected]): never mounted writable as the parent of a
// removable grant.
func systemParent(dir string) bool {
	if policy.Protected(dir) {
		return true
	}
	// A sticky, world-writable directory (/tmp, /var/tmp) holds
	// everyone's files too.
	if fi, err := os.Stat(dir); err == nil && fi.Mode()&os.ModeSticky != 0 && fi.Mode().Perm()&0o002 != 0 {
		return true
	}
	return false
}
