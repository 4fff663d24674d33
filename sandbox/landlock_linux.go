package sandbox

import (
	"os"
	"path/filepath"
	"slices"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox/shim"
)

// The Landlock rules the shim applies, mirroring a Policy laid out for
// one run, with bwrap or without it.

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

// ownGrant reports whether path is the path of one of p's own grants.
func ownGrant(p policy.Policy, path string) bool {
	for _, g := range p.Grants {
		if g.Own && g.Path == path {
			return true
		}
	}
	return false
}
