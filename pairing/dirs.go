package pairing

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// DataDir is where the device key, state.json, the spool and shimdata
// live: the Rust client's data_dir (protocol §2.4), $XDG_DATA_HOME/metnos
// or ~/.local/share/metnos on Linux, ~/Library/Application
// Support/metnos on macOS, %LOCALAPPDATA%\metnos on Windows.
func DataDir() (string, error) {
	switch runtime.GOOS {
	case "windows":
		d, err := os.UserCacheDir() // %LocalAppData%
		if err != nil {
			return "", fmt.Errorf("pairing: finding %%LOCALAPPDATA%%: %w", err)
		}
		return filepath.Join(d, "metnos"), nil
	case "darwin":
		d, err := os.UserConfigDir() // ~/Library/Application Support
		if err != nil {
			return "", fmt.Errorf("pairing: finding Application Support: %w", err)
		}
		return filepath.Join(d, "metnos"), nil
	}
	if d := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "metnos"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("pairing: finding the home directory: %w", err)
	}
	return filepath.Join(home, ".local", "share", "metnos"), nil
}

// CacheDir is where executor bundles, the shim and the Python runtime
// are cached: the Rust client's cache_dir, $XDG_CACHE_HOME/metnos or
// ~/.cache/metnos on Linux, ~/Library/Caches/metnos on macOS, and
// %LOCALAPPDATA%\metnos (the data directory) on Windows.
func CacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("pairing: finding the cache directory: %w", err)
	}
	return filepath.Join(d, "metnos"), nil
}
