package sandbox

import (
	"os"
	"path/filepath"
	"sort"

	"github.com/metnos/agent/policy"
)

// The layout of a run: where a removable grant's parent is mounted in
// its stead, so that the command can remove it.

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
// be removed (EBUSY, docs/protocol.md §12.6).
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
