package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/metnos/agent/wire"
)

// Autonomy is the Metnos autonomy level: how far an executor may act
// without the user's confirmation (docs/protocol.md §12).
type Autonomy string

// The autonomy levels. The empty Autonomy means AutonomySupervised.
const (
	// AutonomyReadonly forces every grant to read-only.
	AutonomyReadonly Autonomy = "readonly"
	// AutonomySupervised applies the manifest as it is.
	AutonomySupervised Autonomy = "supervised"
	// AutonomyFull opens the network whatever the manifest says.
	AutonomyFull Autonomy = "full"
)

// DeriveInput is everything [Derive] reads.
type DeriveInput struct {
	// Manifest is the executor's manifest, as [ParseManifest] read it:
	// its capabilities and its minimum sandbox.
	Manifest Manifest
	// Args are the invocation arguments as decoded by encoding/json
	// (map[string]any, []any, string, float64, ...). The capabilities'
	// when clauses read them when they are a map[string]any (the
	// invocation's object); grants read only their strings.
	Args any
	// Autonomy is the autonomy level; "" means supervised.
	Autonomy Autonomy
	// Extra are grants the caller adds: the executor directory, the
	// shim directory, the interpreter root, the user data directory.
	// Their paths may be unresolved ("~" is expanded) and are resolved,
	// skipped when missing and dropped when masked like any other.
	Extra []Grant
	// Host is the device the policy is for.
	Host Host
}

// Derive builds the [ProfileManifest] Policy of one executor invocation
// from its manifest capabilities and arguments (docs/protocol.md §12.1).
// Each capability in force (its when clause, if any, holds for Args)
// means what the capability table says ([CapabilityTable]):
//
//   - fs:read and fs:write turn each hint into a grant of the hint's
//     root (the hint cut before its first glob segment), writable only
//     for fs:write; and every string in Args that is an anchored path
//     ("/…", "~", "~/…") adds its deepest existing directory, with the
//     strongest access of the fs capabilities;
//   - network:http and network:sites narrow the network to the
//     destinations their hints name (Egress), with the owner's allow
//     list added and the deny lists on top;
//   - system:read installed_software/package_database grant the package
//     databases read-only, processes/health set HostPIDs;
//   - code:exec puts the folders of the programs it names on ExecPath;
//   - the rest need nothing, or refuse the run.
//
// A capability refused on a device, or a capability, hint or when
// clause the table does not know, fails Derive with a
// [*CapabilityError] (wrapping [ErrCapabilityRefused]): nothing is ever
// silently ignored.
//
// Every grant path is resolved (symlinks included); missing paths are
// skipped and paths inside the nucleus or the session IPC are dropped.
// AutonomyReadonly forces every grant, Extra ones included, to Read;
// AutonomyFull opens the network.
func Derive(in DeriveInput) (Policy, error) {
	h := in.Host
	if err := checkHost(h); err != nil {
		return Policy{}, err
	}
	switch in.Autonomy {
	case "", AutonomyReadonly, AutonomySupervised, AutonomyFull:
	default:
		return Policy{}, fmt.Errorf("sandbox: unknown autonomy %q (want readonly, supervised or full)", in.Autonomy)
	}
	masks := append(Nucleus(h), SessionIPC(h)...)
	p := Policy{
		Profile:    ProfileManifest,
		System:     systemPaths(h),
		Masks:      masks,
		MinSandbox: in.Manifest.MinSandbox(),
	}
	home := filepath.Clean(h.Home)

	d := &derivation{h: h, home: home, masks: masks, p: &p, maxAccess: Read}
	named, _ := in.Args.(map[string]any)
	for _, c := range in.Manifest.caps {
		if !in.Manifest.inForce(c, named) {
			continue
		}
		if err := d.apply(c); err != nil {
			return Policy{}, err
		}
	}
	grants := d.grants
	if d.hasFS {
		maxAccess := d.maxAccess
		wire.WalkStrings(in.Args, func(s string) {
			named, ok := argPath(s, home)
			if !ok {
				return
			}
			dir, ok := deepestDir(named)
			if !ok {
				return
			}
			if g, ok := derivedGrant(dir, maxAccess, "arg "+s, masks); ok {
				// The argument names the directory itself: the command
				// may be asked to remove it.
				g.Removable = maxAccess == Write && dir == named && g.Via == "" && !strings.Contains(s, "{")
				grants = append(grants, g)
			}
		})
	}
	grants = guardSystem(grants)
	for _, e := range in.Extra {
		named := expandTilde(e.Path, home)
		if !filepath.IsAbs(named) {
			return Policy{}, fmt.Errorf("sandbox: extra grant %q is not an absolute path", e.Path)
		}
		access := e.Access
		if access != Write {
			access = Read
		}
		why := e.Why
		if why == "" {
			why = "extra"
		}
		guard := masks
		if e.Own {
			// The agent's own folders live in its masked directories;
			// they open through the mask (only they do).
			guard = nil
		}
		g, ok := derivedGrant(filepath.Clean(named), access, why, guard)
		if !ok {
			continue
		}
		g.Own = e.Own
		if g.Via == "" {
			g.Via = e.Via
		}
		grants = append(grants, g)
	}

	switch in.Autonomy {
	case AutonomyReadonly:
		for i := range grants {
			grants[i].Access = Read
		}
	case AutonomyFull:
		p.Network, p.Egress = true, nil
	}
	if p.Egress != nil {
		finishEgress(p.Egress, h)
	}
	p.Grants = sortGrants(grants)
	p.Normalize()
	return p, nil
}

// kernelPaths are never granted from a manifest or its arguments: the
// sandbox has a private /proc and /dev of its own, and a bind of the
// host's (/proc/sys, /sys/kernel) would hand the command the kernel's
// knobs.
var kernelPaths = []string{"/proc", "/sys", "/dev"}

// systemPaths are never granted writable from a manifest or its
// arguments, nor is anything that holds them ("/", "/var"): an executor
// that names "/etc" in its arguments gets to read it, not to rewrite the
// system (which, for an agent running as root, it otherwise could).
var protectedPaths = []string{"/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/run", "/sbin", "/usr", "/var/cache", "/var/lib", "/var/log", "/var/spool"}

// sharedRoots are the directories that hold everyone's files: a grant
// beneath one is fine, a writable grant of the whole (every user's home)
// is not.
var sharedRoots = []string{"/home", "/srv", "/mnt", "/media", "/var"}

// Protected reports whether dir is a system path or a shared root that
// no grant from a manifest may make writable: "/", /home, /srv, /mnt,
// /media, /var, or a directory that holds or lies beneath /etc, /usr,
// /var/lib and the other system paths. It only compares paths.
func Protected(dir string) bool {
	return dir == "/" || slices.Contains(sharedRoots, dir) || slices.ContainsFunc(protectedPaths, func(k string) bool {
		return pathWithin(dir, k) || pathWithin(k, dir)
	})
}

// guardSystem drops grants of kernel interfaces and makes grants of
// system paths read-only. It applies to what a manifest and its
// arguments ask for, not to the agent's own Extra grants.
func guardSystem(grants []Grant) []Grant {
	var out []Grant
	for _, g := range grants {
		if g.Path == "/" && g.Access == Read {
			out = append(out, g)
			continue
		}
		if slices.ContainsFunc(kernelPaths, func(k string) bool { return pathWithin(g.Path, k) }) {
			continue
		}
		if g.Access == Write && Protected(g.Path) {
			g.Access = Read
			g.Why += " (system path: read-only)"
		}
		out = append(out, g)
	}
	return out
}

// ProfileInput is what [ForProfile] reads to build one of the named
// profiles.
type ProfileInput struct {
	// Profile is readonly, supervised, full or full-fs-no-net.
	// ProfileManifest is built by [Derive] instead.
	Profile Profile
	// Read and Write are paths named explicitly (the CLI's --read and
	// --write). "~" is expanded and relative paths are made absolute
	// against the working directory. They must exist.
	Read, Write []string
	// Network asks for the network (the CLI's --net).
	Network bool
	// AllowNet narrows the network to these destinations (the CLI's
	// --allow-net), with the owner's allow list added and the deny
	// lists on top; it contradicts Network and the full profiles.
	AllowNet []Dest
	// Host is the device the policy is for.
	Host Host
}

// ForProfile builds the Policy of a named profile (docs/protocol.md §12) with the explicit grants of in added:
//
//   - readonly: the whole root readable, every grant read-only;
//   - supervised: the system paths and the grants only;
//   - full: the whole root writable, the network open;
//   - full-fs-no-net: the whole root writable, the real /dev, the host's
//     PIDs, Unix sockets, the network cut and no fallback to a weaker
//     sandbox; asking for the network with it is an error.
//
// The network follows in.Network for readonly and supervised. The
// nucleus and the session IPC are masked in every profile. Unlike
// [Derive], a path that does not exist or lies inside a mask is an
// error, since the user named it.
func ForProfile(in ProfileInput) (Policy, error) {
	h := in.Host
	if err := checkHost(h); err != nil {
		return Policy{}, err
	}
	p := Policy{
		Profile: in.Profile,
		System:  systemPaths(h),
		Masks:   append(Nucleus(h), SessionIPC(h)...),
		Network: in.Network,
	}
	switch in.Profile {
	case ProfileReadonly:
		p.RootReadable = true
	case ProfileSupervised:
	case ProfileFull:
		p.RootWritable = true
		p.Network = true
	case ProfileFullFSNoNet:
		if in.Network {
			return Policy{}, errors.New("sandbox: profile full-fs-no-net cuts the network; --net contradicts it")
		}
		p.RootWritable = true
		p.RealDev = true
		p.SharePID = true
		p.Network = false
		p.UnixSockets = true
		p.NoFallback = true
		p.MinSandbox = LevelFull
	case ProfileManifest:
		return Policy{}, errors.New("sandbox: profile manifest is built from an executor manifest by Derive (want readonly, supervised, full or full-fs-no-net)")
	default:
		return Policy{}, fmt.Errorf("sandbox: unknown profile %q (want readonly, supervised, full or full-fs-no-net)", in.Profile)
	}

	if len(in.AllowNet) > 0 {
		switch {
		case p.Network:
			return Policy{}, fmt.Errorf("sandbox: profile %s with --net opens the whole network; --allow-net narrows it, and contradicts that", in.Profile)
		case in.Profile == ProfileFullFSNoNet:
			return Policy{}, errors.New("sandbox: profile full-fs-no-net cuts the network; --allow-net contradicts it")
		}
		p.Egress = &Egress{Allow: append([]Dest(nil), in.AllowNet...)}
		finishEgress(p.Egress, h)
	}

	var grants []Grant
	add := func(flag, name string, access Access) error {
		if in.Profile == ProfileReadonly {
			access = Read
		}
		g, err := profileGrant(flag, name, access, h.Home, p.Masks)
		if err != nil {
			return err
		}
		if g.Path == "/" && access == Write && !p.RootWritable {
			return fmt.Errorf("sandbox: %s %s: the root can only be granted read-only (the full profiles make it writable)", flag, name)
		}
		grants = append(grants, g)
		return nil
	}
	for _, r := range in.Read {
		if err := add("--read", r, Read); err != nil {
			return Policy{}, err
		}
	}
	for _, w := range in.Write {
		if err := add("--write", w, Write); err != nil {
			return Policy{}, err
		}
	}
	p.Grants = sortGrants(grants)
	p.Normalize()
	return p, nil
}

// checkHost refuses a Host without an absolute home: the nucleus is
// home-relative, so it could not be masked.
func checkHost(h Host) error {
	if !filepath.IsAbs(h.Home) {
		return fmt.Errorf("sandbox: host home %q is not an absolute path", h.Home)
	}
	return nil
}

// systemPaths returns those of h.SystemPaths (or of the default list)
// that exist.
func systemPaths(h Host) []string {
	cands := h.SystemPaths
	if len(cands) == 0 {
		cands = defaultSystemPaths
	}
	var out []string
	for _, p := range cands {
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// hintRoot cuts a glob-style hint to the directory it is rooted at: the
// path up to its first segment holding a glob character ('*', '?',
// '[') or a template ("<account>"), so that "~/notes/**" gives "~/notes" and "/a/b*/c" gives "/a".
// Only anchored roots ("/…", "~", "~/…") are returned; "*", "**" and
// relative hints give ok == false. The root is not expanded.
func hintRoot(hint string) (root string, ok bool) {
	hint = strings.TrimSpace(hint)
	segs := strings.Split(hint, "/")
	for i, s := range segs {
		if strings.ContainsAny(s, "*?[<") {
			segs = segs[:i]
			break
		}
	}
	root = strings.Join(segs, "/")
	switch {
	case root == "" && strings.HasPrefix(hint, "/"):
		return "/", true // "/**"
	case strings.HasPrefix(root, "/"), root == "~", strings.HasPrefix(root, "~/"):
		return root, true
	}
	return "", false
}

// isWindowsAnchored reports whether s is an anchored Windows path:
// "C:\…", "C:/…", "\\server\…" or "~\…".
func isWindowsAnchored(s string) bool {
	if len(s) >= 3 && s[1] == ':' && (s[2] == '\\' || s[2] == '/') &&
		('a' <= s[0] && s[0] <= 'z' || 'A' <= s[0] && s[0] <= 'Z') {
		return true
	}
	return strings.HasPrefix(s, `\\`) || strings.HasPrefix(s, `~\`)
}

// argPath reports whether the argument string s looks like an anchored
// path and returns it cut at its first '{', with "~" expanded, cleaned.
// Windows forms are recognized but skipped on other systems, and so are
// strings holding a NUL or a line break, which no real path argument has.
func argPath(s, home string) (string, bool) {
	if strings.ContainsAny(s, "\x00\n\r") {
		return "", false
	}
	if filepath.Separator == '/' && isWindowsAnchored(s) {
		return "", false
	}
	if !strings.HasPrefix(s, "/") && s != "~" && !strings.HasPrefix(s, "~/") {
		return "", false
	}
	if i := strings.IndexByte(s, '{'); i >= 0 {
		s = s[:i]
	}
	return filepath.Clean(expandTilde(s, home)), true
}

// deepestDir returns the deepest existing directory at or above the
// absolute, clean path p.
func deepestDir(p string) (string, bool) {
	for {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return p, true
		}
		parent := filepath.Dir(p)
		if parent == p {
			return "", false
		}
		p = parent
	}
}

// resolveNamed resolves the symlinks of the absolute, clean path named
// and reports the mask covering it, if the named or the resolved path
// lies inside one.
func resolveNamed(named string, masks []Mask) (resolved string, mask Mask, masked bool, err error) {
	resolved, err = filepath.EvalSymlinks(named)
	if err != nil {
		return "", Mask{}, false, err
	}
	if m, ok := CoveredByMask(resolved, masks); ok {
		return resolved, m, true, nil
	}
	if m, ok := CoveredByMask(named, masks); ok {
		return resolved, m, true, nil
	}
	return resolved, Mask{}, false, nil
}

// derivedGrant resolves a grant for Derive: ok is false when the path
// is missing or masked.
func derivedGrant(named string, access Access, why string, masks []Mask) (Grant, bool) {
	resolved, _, masked, err := resolveNamed(named, masks)
	if err != nil || masked {
		return Grant{}, false
	}
	g := Grant{Path: resolved, Access: access, Why: why}
	if resolved != named {
		g.Via = named
	}
	return g, true
}

// profileGrant resolves a path the user named with flag for ForProfile:
// a missing or masked path is an error.
func profileGrant(flag, name string, access Access, home string, masks []Mask) (Grant, error) {
	if name == "" {
		return Grant{}, fmt.Errorf("sandbox: %s: empty path", flag)
	}
	named, err := filepath.Abs(expandTilde(name, filepath.Clean(home)))
	if err != nil {
		return Grant{}, fmt.Errorf("sandbox: %s %s: %w", flag, name, err)
	}
	resolved, m, masked, err := resolveNamed(named, masks)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return Grant{}, fmt.Errorf("sandbox: %s %s: %w", flag, name, err)
	}
	if masked {
		return Grant{}, fmt.Errorf("sandbox: %s %s: inside the device nucleus (%s); no grant can open it", flag, name, m.Why)
	}
	g := Grant{Path: resolved, Access: access, Why: flag + " " + name}
	if resolved != named {
		g.Via = named
	}
	return g, nil
}

// sortGrants orders grants by path, the strongest access and then the
// named path first, so that [Policy.Normalize] keeps the same Via and
// Why whatever order the capabilities and arguments came in.
func sortGrants(gs []Grant) []Grant {
	sort.SliceStable(gs, func(i, j int) bool {
		a, b := gs[i], gs[j]
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		if a.Access != b.Access {
			return a.Access > b.Access
		}
		if a.Via != b.Via {
			return a.Via < b.Via
		}
		return a.Why < b.Why
	})
	return gs
}
