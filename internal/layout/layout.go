// Package layout owns every path of the agent: its two per-user folders
// (data and cache), each file and folder the agent keeps in them, the
// folders the sandbox must hide from executors, and the few places
// outside them the agent writes to, on Linux, macOS and Windows.
//
// [For] computes a [Layout] for any operating system on any other, from
// an environment and a home directory, touching nothing; [Current] does
// it for this process.
//
// What it guarantees:
//
//   - The data and cache folders are the Metnos Rust client's (docs/protocol.md
//     §2.4), and the names inside them are its names (docs/protocol.md §14), so
//     either client finds the other's key, pairing, spool and runtime.
//     METNOS_DATA_DIR and METNOS_CACHE_DIR move the folders, never the
//     names inside them.
//   - It is the one place the agent spells those paths: every other
//     package takes them from a Layout. What a package keeps privately
//     inside a folder named here (the journal's and the audit log's
//     files, one spool file per invocation id, an executor bundle's
//     files, a download's .part files next to its destination) stays
//     that package's business.
//   - The paths are absolute and clean, in the separator of the
//     Layout's operating system.
//   - [Layout.AgentDirs] holds every folder where this or the Rust client
//     keeps a key, on the Layout's operating system and, as the sandbox
//     always masked them, in the Linux places under the home folder on
//     every operating system.
//
// What it does not guarantee: that a path exists, is writable, is
// private to the user or is not a symbolic link; the package creates,
// reads and checks nothing on disk. Nor does it decide what the
// environment says beyond the paths: that is package config's.
package layout

import (
	"errors"
	"fmt"
	"os/user"
	"path"
	"path/filepath"
	"runtime"
	"strings"
)

// Layout is where one user's agent keeps everything, on one operating
// system. [For] and [Current] fill it in; a Layout built by hand (a
// test's, the demo's) uses this process's operating system, and its
// [Layout.AgentDirs] holds Data, Cache and the folders under Home.
type Layout struct {
	// Data is the data folder: the device key, state.json, the lock, the
	// log, the spool, shimdata, the history journal, the audit log and
	// the tailnet node's state.
	Data string
	// Cache is the cache folder: executor bundles, the shim and the
	// Python runtime. On Windows it is the data folder.
	Cache string
	// Home is the user's home folder; it is empty only when it could not
	// be found and both METNOS_DATA_DIR and METNOS_CACHE_DIR made it
	// unnecessary.
	Home string

	goos string
	// osDirs are the folders the environment adds to AgentDirs, in order,
	// before Data and Cache.
	osDirs []string
	// config is the configuration folder on goos ("" when the home
	// folder it needs is unknown): see [Layout.ConfigDir].
	config string
	// configHome is $XDG_CONFIG_HOME when it is absolute.
	configHome string
	// runtimeDir is $XDG_RUNTIME_DIR when it is absolute.
	runtimeDir string
}

// Environment variables For reads through its getenv.
const (
	// DataDirEnv and CacheDirEnv move the data and cache folders.
	DataDirEnv  = "METNOS_DATA_DIR"
	CacheDirEnv = "METNOS_CACHE_DIR"
)

// For returns the layout on goos for a user whose environment is getenv
// and whose home folder is home. The folders are the Rust client's, as
// its dirs crate (v5) computes them:
//
//	         Data                                 Cache
//	linux    $XDG_DATA_HOME/metnos                $XDG_CACHE_HOME/metnos
//	         (else ~/.local/share/metnos)         (else ~/.cache/metnos)
//	darwin   ~/Library/Application Support/metnos ~/Library/Caches/metnos
//	windows  %LOCALAPPDATA%\metnos                %LOCALAPPDATA%\metnos
//
// unless $METNOS_DATA_DIR or $METNOS_CACHE_DIR names another folder:
// an absolute path, or one starting with "~/" (the home folder). A
// relative override is an error here: [CurrentWith] makes it absolute
// against the working folder first. An XDG variable that is not an
// absolute path is ignored, as the dirs crate does; so is %APPDATA%.
// Other Unix systems follow Linux. The home folder must be absolute
// unless the overrides make it unnecessary (on Windows it is optional).
func For(goos string, getenv func(string) string, home string) (Layout, error) {
	l := Layout{goos: goos}
	if l.abs(home) {
		l.Home = l.clean(home)
	}
	data, err := l.override(getenv, DataDirEnv)
	if err != nil {
		return Layout{}, err
	}
	cache, err := l.override(getenv, CacheDirEnv)
	if err != nil {
		return Layout{}, err
	}
	def, derr := l.defaults(getenv, home)
	if data == "" || cache == "" {
		if derr != nil {
			return Layout{}, derr
		}
	}
	if data == "" {
		data = def.data
	}
	if cache == "" {
		cache = def.cache
	}
	l.Data, l.Cache = data, cache

	// The folders to mask, in the order the sandbox always listed them:
	// the Linux places under the home folder, their XDG variants, then
	// this operating system's own (the Rust client's).
	if l.Home != "" {
		l.osDirs = append(l.osDirs,
			l.join(l.Home, ".config", "metnos"),
			l.join(l.Home, ".local", "share", "metnos"),
			l.join(l.Home, ".cache", "metnos"))
	}
	for _, x := range []string{"XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"} {
		if d := getenv(x); l.abs(d) {
			l.osDirs = append(l.osDirs, l.join(d, "metnos"))
		}
	}
	if derr == nil {
		l.osDirs = append(l.osDirs, def.data, def.cache, def.config)
		l.config = def.config
	}
	if c := getenv("XDG_CONFIG_HOME"); goos != "windows" && goos != "darwin" && l.abs(c) {
		l.configHome = l.clean(c)
	}
	if r := getenv("XDG_RUNTIME_DIR"); goos != "windows" && l.abs(r) {
		l.runtimeDir = l.clean(r)
	}
	return l, nil
}

// osDefaults are the Rust client's folders on one operating system.
type osDefaults struct{ data, cache, config string }

// defaults returns the Rust client's folders on l.goos: its data and
// cache folders and the dirs crate's config folder (where the Rust
// client keeps nothing today, masked all the same).
func (l Layout) defaults(getenv func(string) string, home string) (osDefaults, error) {
	switch l.goos {
	case "windows":
		lad := getenv("LOCALAPPDATA")
		if !winAbs(lad) {
			return osDefaults{}, fmt.Errorf(`layout: %%LOCALAPPDATA%% is %q, not an absolute path; set it (normally C:\Users\<you>\AppData\Local) or set %s and %s`, lad, DataDirEnv, CacheDirEnv)
		}
		d := l.join(lad, "metnos")
		config := d
		if ad := getenv("APPDATA"); winAbs(ad) {
			config = l.join(ad, "metnos")
		}
		return osDefaults{data: d, cache: d, config: config}, nil
	case "darwin":
		if l.Home == "" {
			return osDefaults{}, noHome(home)
		}
		d := l.join(l.Home, "Library", "Application Support", "metnos")
		return osDefaults{data: d, cache: l.join(l.Home, "Library", "Caches", "metnos"), config: d}, nil
	}
	if l.Home == "" {
		return osDefaults{}, noHome(home)
	}
	xdg := func(name string, fallback ...string) string {
		if d := getenv(name); strings.HasPrefix(d, "/") {
			return l.join(d, "metnos")
		}
		return l.join(append(append([]string{l.Home}, fallback...), "metnos")...)
	}
	return osDefaults{
		data:   xdg("XDG_DATA_HOME", ".local", "share"),
		cache:  xdg("XDG_CACHE_HOME", ".cache"),
		config: xdg("XDG_CONFIG_HOME", ".config"),
	}, nil
}

// noHome is the error of a layout that needs the home folder and was
// given none that is absolute.
func noHome(home string) error {
	return fmt.Errorf("layout: the home folder %q is not an absolute path; set $HOME, or %s and %s", home, DataDirEnv, CacheDirEnv)
}

// override reads the folder the variable name moves one of the agent's
// folders to: "" when it is unset.
func (l Layout) override(getenv func(string) string, name string) (string, error) {
	v := getenv(name)
	if v == "" {
		return "", nil
	}
	if v == "~" || strings.HasPrefix(v, "~/") {
		if l.Home == "" {
			return "", fmt.Errorf("layout: %s=%q starts with ~ but the home folder is not known", name, v)
		}
		v = l.join(l.Home, strings.TrimPrefix(strings.TrimPrefix(v, "~"), "/"))
	}
	if !l.abs(v) {
		return "", fmt.Errorf("layout: %s=%q is not an absolute path", name, v)
	}
	return l.clean(v), nil
}

// CurrentWith returns the layout on this operating system for this
// user, with the environment getenv: [For] with the home folder of
// $HOME (%USERPROFILE% on Windows) or, where that is empty, of the user
// database, and with a relative METNOS_DATA_DIR or METNOS_CACHE_DIR
// made absolute against the working folder, as the agent always did.
func CurrentWith(getenv func(string) string) (Layout, error) {
	home, herr := homeDir(getenv)
	env := func(name string) string {
		v := getenv(name)
		if (name == DataDirEnv || name == CacheDirEnv) && v != "" && v != "~" && !strings.HasPrefix(v, "~/") && !filepath.IsAbs(v) {
			if abs, err := filepath.Abs(v); err == nil {
				return abs
			}
		}
		return v
	}
	l, err := For(runtime.GOOS, env, home)
	if err != nil && herr != nil {
		return Layout{}, fmt.Errorf("%w (%w)", err, herr)
	}
	return l, err
}

// homeDir returns the current user's home folder: $HOME (%USERPROFILE%
// on Windows) as getenv gives it, or the user database's answer when
// $HOME is empty, as the dirs crate falls back to getpwuid.
func homeDir(getenv func(string) string) (string, error) {
	if runtime.GOOS == "windows" {
		if h := getenv("USERPROFILE"); h != "" {
			return h, nil
		}
		return "", errors.New("layout: finding the home folder: %USERPROFILE% is not set")
	}
	if h := getenv("HOME"); h != "" {
		return h, nil
	}
	u, err := user.Current()
	if err == nil && u.HomeDir != "" {
		return u.HomeDir, nil
	}
	if err == nil {
		err = errors.New("the user database gives none")
	}
	return "", fmt.Errorf("layout: finding the home folder ($HOME is empty): %w", err)
}

// AgentDirs are the agent's own folders, which the sandbox masks from
// every executor whatever it is granted: the Linux places under the home
// folder (~/.config/metnos, ~/.local/share/metnos, ~/.cache/metnos),
// their $XDG_CONFIG_HOME, $XDG_DATA_HOME and $XDG_CACHE_HOME variants,
// the Rust client's data, cache and config folders on this operating
// system (with %APPDATA%\metnos on Windows), then Data and Cache
// wherever METNOS_DATA_DIR and METNOS_CACHE_DIR put them. Each folder is
// listed once, in that order.
func (l Layout) AgentDirs() []string {
	var out []string
	add := func(d string) {
		for _, o := range out {
			if o == d {
				return
			}
		}
		out = append(out, d)
	}
	dirs := l.osDirs
	if l.goos == "" && l.Home != "" {
		dirs = []string{
			l.join(l.Home, ".config", "metnos"),
			l.join(l.Home, ".local", "share", "metnos"),
			l.join(l.Home, ".cache", "metnos"),
		}
	}
	for _, d := range dirs {
		add(d)
	}
	for _, d := range []string{l.Data, l.Cache} {
		if d != "" {
			add(d)
		}
	}
	return out
}

// os is the Layout's operating system.
func (l Layout) os() string {
	if l.goos == "" {
		return runtime.GOOS
	}
	return l.goos
}

// abs reports whether p is an absolute path on l's operating system.
func (l Layout) abs(p string) bool {
	if l.os() == "windows" {
		return winAbs(p)
	}
	return strings.HasPrefix(p, "/")
}

// join joins elem with l's separator and cleans the result.
func (l Layout) join(elem ...string) string {
	if l.os() == "windows" {
		return winClean(strings.Join(elem, `\`))
	}
	return path.Join(elem...)
}

// clean cleans p with l's separator.
func (l Layout) clean(p string) string { return l.join(p) }

// winAbs reports whether p is an absolute Windows path: a drive letter
// and a separator, or a UNC path.
func winAbs(p string) bool {
	if strings.HasPrefix(p, `\\`) {
		return len(p) > 2
	}
	return len(p) >= 3 && p[1] == ':' && (p[2] == '\\' || p[2] == '/') &&
		('a' <= p[0]|0x20 && p[0]|0x20 <= 'z')
}

// winClean cleans an absolute Windows path as filepath.Clean does there:
// backslashes, no repeated or trailing separator, no "." or "..". A UNC
// path keeps its leading \\.
func winClean(p string) string {
	vol, rest := "", p
	switch {
	case strings.HasPrefix(p, `\\`) || strings.HasPrefix(p, `//`):
		vol, rest = `\\`, p[2:]
	case len(p) >= 2 && p[1] == ':':
		vol, rest = p[:2], p[2:]
	}
	c := path.Clean("/" + strings.ReplaceAll(rest, `\`, "/"))
	c = strings.ReplaceAll(c, "/", `\`)
	if vol == `\\` {
		return vol + strings.TrimPrefix(c, `\`)
	}
	return vol + c
}
