package update

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Files are the paths an update uses beside the executable.
type Files struct {
	// Exe is the executable the supervisor starts.
	Exe string
	// New is where the new build is downloaded (with fetch's .part
	// files beside it), Old where the build it replaces is kept until
	// the new one confirms, Failed where a rolled-back build is kept.
	New, Old, Failed string
}

// FilesFor returns the files of an update of exe: exe.new, exe.old and
// exe.failed, or on Windows name.new.exe, name.old.exe and
// name.failed.exe (which Windows can still run by hand).
func FilesFor(exe string) Files {
	if ext := filepath.Ext(exe); strings.EqualFold(ext, ".exe") {
		base := strings.TrimSuffix(exe, ext)
		return Files{Exe: exe, New: base + ".new" + ext, Old: base + ".old" + ext, Failed: base + ".failed" + ext}
	}
	return Files{Exe: exe, New: exe + ".new", Old: exe + ".old", Failed: exe + ".failed"}
}

// Executable is the running executable's path with symbolic links
// resolved: the file a supervisor starts, and the one an update
// replaces. It must be found before any swap.
func Executable() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding this executable: %w", err)
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	return exe, nil
}

// FileSHA256 is the hex SHA-256 of the file at path.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// step, when set (by tests), is called after each step of an update
// that changes a file, with the step's name.
var step func(name string)

func at(name string) {
	if step != nil {
		step(name)
	}
}

// copyFile copies src to dst (created, 0755) and fsyncs it: the
// fallback where a hard link cannot be made.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
	}
	return err
}
