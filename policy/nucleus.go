package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// Host is the facts of this device the derivation needs: where the
// user's home is, which session endpoints exist and where the agent
// keeps its own secrets. The agent's command line builds it from its
// configuration and layout; tests build one by hand. The package reads
// no environment: every fact comes in here.
type Host struct {
	// Home is the user's home directory, absolute.
	Home string
	// UID is the user's numeric id, for /run/user/<uid>.
	UID int
	// RuntimeDir is $XDG_RUNTIME_DIR; it may be empty.
	RuntimeDir string
	// DBusSession is $DBUS_SESSION_BUS_ADDRESS; it may be empty.
	DBusSession string
	// SSHAuthSock is $SSH_AUTH_SOCK, the ssh-agent's socket; it may be
	// empty.
	SSHAuthSock string
	// AgentDataDirs are the agent's own folders (its data, cache and
	// configuration folders, wherever they are on this system). The
	// agent's key lives there, so they are masked.
	AgentDataDirs []string
	// SystemPaths are the candidates for Policy.System; those that
	// exist are mounted read-only. Empty means /usr, /bin, /sbin, /lib,
	// /lib64, /lib32, /etc, /opt and /var/lib/python3.
	SystemPaths []string
	// ProgramDirs are where the programs code:exec names are looked up.
	// Empty means the system's usual program folders (/usr/local/sbin,
	// /usr/local/bin, /usr/sbin, /usr/bin, /sbin, /bin; on macOS
	// /opt/homebrew/bin first); on Windows the caller lists them.
	ProgramDirs []string
	// PackageDBs are the candidates system:read installed_software
	// grants read-only, those that exist. Empty means dpkg's, apt's,
	// rpm's and pacman's usual places.
	PackageDBs []string
	// Never are the device owner's folders and files no executor may
	// read or write (limits.toml's never): absolute, or starting with
	// "~/". They join the nucleus, so that no grant, not even one of the
	// whole home, reaches them.
	Never []string
	// NetAllow and NetDeny are the device owner's network lists
	// (limits.toml's [network] allow and deny, or METNOS_NET_ALLOW and
	// METNOS_NET_DENY, which override them; read with
	// [ParseOwnerDest]):
	// NetAllow is added to the destinations of every run whose network
	// is narrowed, NetDeny to the default deny list, which wins.
	NetAllow, NetDeny []Dest
}

// defaultSystemPaths are the system paths every run may read (never
// write): programs, libraries, /etc and Python's shared data.
var defaultSystemPaths = []string{
	"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32",
	"/etc", "/opt", "/var/lib/python3",
}

// nucleusEntry is one path of the device nucleus. Paths starting with
// "~/" are relative to the user's home.
type nucleusEntry struct {
	path string
	kind MaskKind
}

// homeNucleus is the home-relative part of the device nucleus: the
// credentials, keys, browser profiles and password stores of the user.
// It is fixed here on purpose, not configurable: a change needs a
// change of code. The agent's own folders are not here: they come in as
// Host.AgentDataDirs.
var homeNucleus = []nucleusEntry{
	{"~/.ssh", MaskDir},
	{"~/.gnupg", MaskDir},
	{"~/.aws", MaskDir},
	{"~/.azure", MaskDir},
	{"~/.config/gcloud", MaskDir},
	{"~/.gcloud", MaskDir},
	{"~/.kube", MaskDir},
	{"~/.docker", MaskDir},
	{"~/.netrc", MaskFile},
	{"~/.pypirc", MaskFile},
	{"~/.npmrc", MaskFile},
	{"~/.password-store", MaskDir},
	{"~/.config/gh", MaskDir},
	{"~/.config/claude", MaskDir},
	{"~/.mozilla", MaskDir},
	{"~/.config/google-chrome", MaskDir},
	{"~/.config/chromium", MaskDir},
	{"~/.config/BraveSoftware", MaskDir},
	{"~/.config/microsoft-edge", MaskDir},
	{"~/.var/app", MaskDir}, // flatpak app data, browser profiles included
	{"~/.config/Bitwarden", MaskDir},
	{"~/.config/1Password", MaskDir},
	{"~/.local/share/keyrings", MaskDir},
	{"~/.pki", MaskDir},
	{"~/.git-credentials", MaskFile},
	{"~/.config/git/credentials", MaskFile},
	{"~/.vault-token", MaskFile},
	{"~/.config/rclone", MaskDir},
	{"~/.terraform.d", MaskDir},
	{"~/.m2/settings.xml", MaskFile},
	{"~/.cargo/credentials.toml", MaskFile},
}

// windowsHomeNucleus is the part of the nucleus Windows keeps in the
// user's profile folders: browser profiles, the credential and DPAPI
// stores, password managers and cloud tools' keys. Added on Windows
// only: elsewhere these paths mean nothing, and each mask costs every
// run.
var windowsHomeNucleus = []nucleusEntry{
	{"~/AppData/Local/Google/Chrome/User Data", MaskDir},
	{"~/AppData/Local/Microsoft/Edge/User Data", MaskDir},
	{"~/AppData/Local/BraveSoftware/Brave-Browser/User Data", MaskDir},
	{"~/AppData/Local/Chromium/User Data", MaskDir},
	{"~/AppData/Local/Vivaldi/User Data", MaskDir},
	{"~/AppData/Roaming/Opera Software", MaskDir},
	{"~/AppData/Roaming/Mozilla", MaskDir},
	{"~/AppData/Local/Mozilla", MaskDir},
	{"~/AppData/Roaming/Microsoft/Credentials", MaskDir},
	{"~/AppData/Local/Microsoft/Credentials", MaskDir},
	{"~/AppData/Roaming/Microsoft/Protect", MaskDir},
	{"~/AppData/Roaming/Microsoft/Crypto", MaskDir},
	{"~/AppData/Roaming/Microsoft/SystemCertificates", MaskDir},
	{"~/AppData/Roaming/Microsoft/Vault", MaskDir},
	{"~/AppData/Local/Microsoft/Vault", MaskDir},
	{"~/AppData/Roaming/Bitwarden", MaskDir},
	{"~/AppData/Local/1Password", MaskDir},
	{"~/AppData/Roaming/KeePass", MaskDir},
	{"~/AppData/Roaming/gcloud", MaskDir},
	{"~/AppData/Roaming/GitHub CLI", MaskDir},
	{"~/AppData/Roaming/rclone", MaskDir},
	{"~/AppData/Roaming/Docker", MaskDir},
}

// systemNucleus is the system part of the device nucleus. /root is
// added separately, unless it is the user's own home.
var systemNucleus = []nucleusEntry{
	{"/etc/shadow", MaskFile},
	{"/etc/gshadow", MaskFile},
	{"/etc/shadow-", MaskFile},
	{"/etc/gshadow-", MaskFile},
	{"/etc/ssh", MaskDir},
	{"/etc/sudoers", MaskFile},
	{"/etc/sudoers.d", MaskDir},
	{"/var/backups", MaskDir},
}

// Nucleus returns the masks of the device nucleus on h: the paths no
// grant can open, whether they exist or not. The list is fixed in code;
// to it are added h.AgentDataDirs, the owner's h.Never (a file that
// exists is masked as a file, anything else as a folder) and, for every
// entry that resolves elsewhere (a symlink, or beneath one), a second
// mask for the resolved path. Nucleus returns nil when h.Home is not
// absolute.
func Nucleus(h Host) []Mask {
	if !filepath.IsAbs(h.Home) {
		return nil
	}
	home := filepath.Clean(h.Home)
	var ms []Mask
	entries := homeNucleus
	if runtime.GOOS == "windows" {
		entries = append(append([]nucleusEntry(nil), homeNucleus...), windowsHomeNucleus...)
	}
	for _, e := range entries {
		ms = append(ms, Mask{Path: expandTilde(e.path, home), Kind: e.kind, Why: e.path})
	}
	for _, d := range h.AgentDataDirs {
		d = expandTilde(d, home)
		if !filepath.IsAbs(d) {
			continue
		}
		ms = append(ms, Mask{Path: filepath.Clean(d), Kind: MaskDir, Why: "agent data " + d})
	}
	for _, p := range h.Never {
		p = expandTilde(p, home)
		if !filepath.IsAbs(p) {
			continue
		}
		p = filepath.Clean(p)
		kind := MaskDir
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			kind = MaskFile
		}
		ms = append(ms, Mask{Path: p, Kind: kind, Why: "owner's never " + p})
	}
	for _, e := range systemNucleus {
		ms = append(ms, Mask{Path: e.path, Kind: e.kind, Why: e.path})
	}
	if !pathWithin(home, "/root") {
		ms = append(ms, Mask{Path: "/root", Kind: MaskDir, Why: "/root"})
	}
	return withLinkTargets(ms)
}

// SessionIPC returns the masks that hide the user's live session from
// the sandbox (without them a network cut is no cut): $XDG_RUNTIME_DIR, /run/user/<uid> and
// /tmp/.X11-unix, and the D-Bus session socket named by h.DBusSession
// when it lies outside those directories. Abstract sockets need no
// mask. The masks are returned whether or not the paths exist; an
// entry that resolves elsewhere gets a second mask for its target.
func SessionIPC(h Host) []Mask {
	var ms []Mask
	addDir := func(p, why string) {
		if !filepath.IsAbs(p) {
			return
		}
		p = filepath.Clean(p)
		for _, m := range ms {
			if m.Path == p {
				return
			}
		}
		ms = append(ms, Mask{Path: p, Kind: MaskDir, Why: why})
	}
	addDir(h.RuntimeDir, "session-ipc $XDG_RUNTIME_DIR")
	addDir("/run/user/"+strconv.Itoa(h.UID), "session-ipc /run/user/"+strconv.Itoa(h.UID))
	addDir("/tmp/.X11-unix", "session-ipc /tmp/.X11-unix")
	// Terminals and multiplexers: a command that can type into the
	// user's terminal or a tmux/screen session runs outside the sandbox.
	addDir("/dev/pts", "session-ipc /dev/pts")
	addDir("/run/screen", "session-ipc /run/screen")
	dirs := len(ms)
	if p := filepath.Clean(h.SSHAuthSock); filepath.IsAbs(p) {
		if _, ok := CoveredByMask(p, ms); !ok {
			ms = append(ms, Mask{Path: p, Kind: MaskFile, Why: "session-ipc $SSH_AUTH_SOCK"})
		}
	}
	for _, p := range dbusSocketPaths(h.DBusSession) {
		if _, ok := CoveredByMask(p, ms[:dirs]); ok {
			continue
		}
		if _, ok := CoveredByMask(p, ms[dirs:]); ok {
			continue
		}
		ms = append(ms, Mask{Path: p, Kind: MaskFile, Why: "session-ipc $DBUS_SESSION_BUS_ADDRESS"})
	}
	return withLinkTargets(ms)
}

// dbusSocketPaths returns the filesystem sockets of a D-Bus address
// list ("unix:path=/run/user/1000/bus;unix:abstract=/tmp/x"): the
// unescaped, cleaned path= values of its unix: entries.
func dbusSocketPaths(addr string) []string {
	var out []string
	for _, a := range strings.Split(addr, ";") {
		transport, params, ok := strings.Cut(strings.TrimSpace(a), ":")
		if !ok || transport != "unix" {
			continue
		}
		for _, kv := range strings.Split(params, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k != "path" {
				continue
			}
			if p, err := dbusUnescape(v); err == nil && filepath.IsAbs(p) {
				out = append(out, filepath.Clean(p))
			}
		}
	}
	return out
}

// dbusUnescape undoes the %xx escaping of D-Bus address values.
func dbusUnescape(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errors.New("sandbox: truncated escape in D-Bus address")
		}
		n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("sandbox: bad escape in D-Bus address: %w", err)
		}
		b.WriteByte(byte(n))
		i += 2
	}
	return b.String(), nil
}

// CoveredByMask reports whether path equals or lies beneath the path of
// one of masks, comparing whole path components ("/a/bc" is not beneath
// "/a/b"), and returns the first such mask. Both sides are cleaned;
// nothing is resolved.
func CoveredByMask(path string, masks []Mask) (Mask, bool) {
	for _, m := range masks {
		if pathWithin(path, m.Path) {
			return m, true
		}
	}
	return Mask{}, false
}

// pathWithin reports whether p equals dir or lies beneath it, by path
// components. Both are cleaned first.
func pathWithin(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	if p == dir {
		return true
	}
	if !strings.HasSuffix(dir, string(filepath.Separator)) {
		dir += string(filepath.Separator)
	}
	return strings.HasPrefix(p, dir)
}

// expandTilde replaces a leading "~" or "~/" with home. Other paths,
// "~user" among them, are returned unchanged.
func expandTilde(p, home string) string {
	if p == "~" {
		return home
	}
	if strings.HasPrefix(p, "~/") {
		return filepath.Join(home, p[2:])
	}
	return p
}

// withLinkTargets drops masks whose path is already listed and
// appends, for each mask whose path resolves to another path, a mask
// of the same kind for the resolved path.
func withLinkTargets(in []Mask) []Mask {
	seen := map[string]bool{}
	var ms []Mask
	add := func(m Mask) {
		if !seen[m.Path] {
			seen[m.Path] = true
			ms = append(ms, m)
		}
	}
	for _, m := range in {
		add(m)
	}
	// The masks share their ancestors (the home folder, ~/.config,
	// ~/.local/share...): each is resolved once per call.
	r := &linkResolver{}
	for _, m := range in {
		if t := r.resolveLoose(m.Path); t != m.Path {
			add(Mask{Path: t, Kind: m.Kind, Why: m.Why + " (link target)"})
		}
	}
	return ms
}

// maxLinkHops bounds how many dangling symlinks resolveLoose follows.
const maxLinkHops = 40

// resolveLoose resolves the symlinks of an absolute path that need not
// exist: the longest existing prefix is resolved with
// filepath.EvalSymlinks, a dangling symlink right after it is followed
// by hand, and the missing rest is appended unchanged.
func resolveLoose(p string) string { return (&linkResolver{}).resolveLoose(p) }

// linkResolver resolves paths as resolveLoose does, remembering what
// filepath.EvalSymlinks answered for each path it asked about: one
// resolver serves one derivation, whose paths share their ancestors.
type linkResolver struct {
	seen map[string]evalResult
	// absent holds the resolved paths an lstat found missing: nothing
	// to read a link from.
	absent map[string]bool
}

type evalResult struct {
	path string
	err  error
}

// evalSymlinks is filepath.EvalSymlinks(p) for a clean path p, asked
// once per resolver and path: an absolute path is resolved from its
// parent's answer, with one lstat of its last element, unless that
// element is itself a symbolic link, which filepath.EvalSymlinks
// follows. (On Windows, whose reparse points are more than symbolic
// links, filepath.EvalSymlinks answers every path itself.)
func (r *linkResolver) evalSymlinks(p string) (string, error) {
	if e, ok := r.seen[p]; ok {
		return e.path, e.err
	}
	var t string
	var err error
	if parent := filepath.Dir(p); runtime.GOOS == "windows" || !filepath.IsAbs(p) || parent == p {
		t, err = filepath.EvalSymlinks(p)
	} else if t, err = r.evalSymlinks(parent); err == nil {
		t = filepath.Join(t, filepath.Base(p))
		var fi os.FileInfo
		if fi, err = os.Lstat(t); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			t, err = filepath.EvalSymlinks(p)
		} else if errors.Is(err, fs.ErrNotExist) {
			if r.absent == nil {
				r.absent = map[string]bool{}
			}
			r.absent[t] = true
		}
	}
	if r.seen == nil {
		r.seen = map[string]evalResult{}
	}
	r.seen[p] = evalResult{t, err}
	return t, err
}

// resolveLoose is [resolveLoose] with r's memory.
func (r *linkResolver) resolveLoose(p string) string {
	p = filepath.Clean(p)
	for hops := 0; hops < maxLinkHops; hops++ {
		if r, err := r.evalSymlinks(p); err == nil {
			return r
		}
		// Find the deepest ancestor that resolves.
		dir, rest := p, []string(nil)
		var base string
		for {
			parent := filepath.Dir(dir)
			if parent == dir {
				return p
			}
			rest = append([]string{filepath.Base(dir)}, rest...)
			dir = parent
			if t, err := r.evalSymlinks(dir); err == nil {
				base = t
				break
			}
		}
		next := filepath.Join(base, rest[0])
		if r.absent[next] {
			return filepath.Join(append([]string{base}, rest...)...)
		}
		target, err := os.Readlink(next)
		if err != nil {
			// Missing (or unreadable): nothing more to resolve.
			return filepath.Join(append([]string{base}, rest...)...)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(base, target)
		}
		p = filepath.Join(append([]string{target}, rest[1:]...)...)
	}
	return p
}
