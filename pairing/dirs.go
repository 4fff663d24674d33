package pairing

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"runtime"
	"strings"
)

// Dirs are the agent's two per-user directories on one operating
// system: the Rust client's data_dir and cache_dir (protocol §2.4 and
// Appendix A), so that either client finds the other's key and pairing.
type Dirs struct {
	// Data holds the device key, state.json, the lock, the log, the
	// spool and shimdata.
	Data string
	// Cache holds executor bundles, the shim and the Python runtime.
	Cache string
}

// DirsFor returns the directories on goos for a user whose environment
// is getenv and whose home directory is home, as the Rust client's dirs
// crate (v5) computes them:
//
//	         Data                                 Cache
//	linux    $XDG_DATA_HOME/metnos                $XDG_CACHE_HOME/metnos
//	         (else ~/.local/share/metnos)         (else ~/.cache/metnos)
//	darwin   ~/Library/Application Support/metnos ~/Library/Caches/metnos
//	windows  %LOCALAPPDATA%\metnos                %LOCALAPPDATA%\metnos
//
// An XDG variable that is not an absolute path is ignored, as the dirs
// crate does. Other Unix systems follow Linux. The paths are built with
// goos's separator, so any OS's answer can be computed (and tested) on
// any other.
func DirsFor(goos string, getenv func(string) string, home string) (Dirs, error) {
	if goos == "windows" {
		lad := getenv("LOCALAPPDATA")
		if !winAbs(lad) {
			return Dirs{}, fmt.Errorf(`pairing: %%LOCALAPPDATA%% is %q, not an absolute path; set it (normally C:\Users\<you>\AppData\Local) or set METNOS_DATA_DIR and METNOS_CACHE_DIR`, lad)
		}
		d := strings.TrimRight(lad, `\/`) + `\metnos`
		return Dirs{Data: d, Cache: d}, nil
	}
	if !strings.HasPrefix(home, "/") {
		return Dirs{}, fmt.Errorf("pairing: the home directory %q is not an absolute path; set $HOME, or METNOS_DATA_DIR and METNOS_CACHE_DIR", home)
	}
	join := func(elem ...string) string { return path.Join(elem...) }
	if goos == "darwin" {
		return Dirs{
			Data:  join(home, "Library", "Application Support", "metnos"),
			Cache: join(home, "Library", "Caches", "metnos"),
		}, nil
	}
	xdg := func(name string, fallback ...string) string {
		if d := getenv(name); strings.HasPrefix(d, "/") {
			return join(d, "metnos")
		}
		return join(append([]string{home}, append(fallback, "metnos")...)...)
	}
	return Dirs{
		Data:  xdg("XDG_DATA_HOME", ".local", "share"),
		Cache: xdg("XDG_CACHE_HOME", ".cache"),
	}, nil
}

// winAbs reports whether p is an absolute Windows path: a drive letter
// and a separator, or a UNC path.
func winAbs(p string) bool {
	if strings.HasPrefix(p, `\\`) {
		return len(p) > 2
	}
	return len(p) >= 3 && p[1] == ':' && (p[2] == '\\' || p[2] == '/') &&
		('a' <= p[0]|0x20 && p[0]|0x20 <= 'z')
}

// HomeDir returns the current user's home directory: $HOME, or the
// user database's answer when $HOME is empty (as the dirs crate falls
// back to getpwuid); %USERPROFILE% on Windows.
func HomeDir() (string, error) {
	if h, err := os.UserHomeDir(); err == nil {
		return h, nil
	} else if runtime.GOOS == "windows" {
		return "", fmt.Errorf("pairing: finding the home directory: %w", err)
	}
	u, err := user.Current()
	if err == nil && u.HomeDir != "" {
		return u.HomeDir, nil
	}
	if err == nil {
		err = errors.New("the user database gives none")
	}
	return "", fmt.Errorf("pairing: finding the home directory ($HOME is empty): %w", err)
}

// current returns this process's directories.
func current() (Dirs, error) {
	home := ""
	if runtime.GOOS != "windows" {
		h, err := HomeDir()
		if err != nil {
			return Dirs{}, err
		}
		home = h
	}
	d, err := DirsFor(runtime.GOOS, os.Getenv, home)
	if err != nil {
		return Dirs{}, err
	}
	return Dirs{Data: filepath.FromSlash(d.Data), Cache: filepath.FromSlash(d.Cache)}, nil
}

// DataDir is where the device key, state.json, the spool and shimdata
// live: [DirsFor]'s Data for this process.
func DataDir() (string, error) {
	d, err := current()
	return d.Data, err
}

// CacheDir is where executor bundles, the shim and the Python runtime
// are cached: [DirsFor]'s Cache for this process.
func CacheDir() (string, error) {
	d, err := current()
	return d.Cache, err
}
