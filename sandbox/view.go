package sandbox

import (
	"path/filepath"
	"sort"
	"strings"

	"github.com/metnos/agent/policy"
)

// What the sandbox shows of the host under a Policy: the mounts of the
// bwrap view, and Visible, which callers ask before they run.

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
