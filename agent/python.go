package agent

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/metnos/agent/internal/layout"
)

// Python is the interpreter executors run with, and where it came from.
type Python struct {
	// Path is the interpreter, symlinks resolved.
	Path string `json:"path"`
	// Source is "env:METNOS_PYTHON", "provisioned" or "system:python3".
	Source string `json:"source"`
	// Prefix is the installation's root (the directory above bin/),
	// which the sandbox must show read-only.
	Prefix string `json:"prefix"`
	// Note says what was skipped on the way, if anything.
	Note string `json:"note,omitempty"`
}

// FindPython picks the interpreter: override (METNOS_PYTHON) when set
// (it must be a file), else the provisioned runtime of lay when present
// (lay.InterpreterCandidates), else the first python3 (or python) in
// the folders of path (the agent's PATH) that is a real interpreter
// rather than a version manager's shell shim (pyenv, asdf), which could
// not run inside the sandbox.
func FindPython(lay layout.Layout, override, path string) (Python, error) {
	if p := override; p != "" {
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			return Python{}, fmt.Errorf("METNOS_PYTHON=%s is not an interpreter file: fix or unset it", p)
		}
		return pythonAt(p, "env:METNOS_PYTHON", "")
	}
	for _, p := range lay.InterpreterCandidates() {
		if isFile(p) {
			return pythonAt(p, "provisioned", "")
		}
	}
	var skipped []string
	for _, name := range []string{"python3", "python"} {
		for _, dir := range filepath.SplitList(path) {
			if dir == "" || !filepath.IsAbs(dir) {
				continue
			}
			p := filepath.Join(dir, name)
			if !isFile(p) {
				continue
			}
			if script(p) {
				skipped = append(skipped, p)
				continue
			}
			note := ""
			if len(skipped) > 0 {
				note = "skipped shell shims " + strings.Join(skipped, ", ")
			}
			return pythonAt(p, "system:"+name, note)
		}
	}
	return Python{}, fmt.Errorf("no Python interpreter: install python3, or set METNOS_PYTHON to one")
}

func pythonAt(p, source, note string) (Python, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return Python{}, fmt.Errorf("python %s: %w", p, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return Python{}, fmt.Errorf("python %s: %w", p, err)
	}
	prefix := filepath.Dir(filepath.Dir(real))
	if runtime.GOOS == "windows" {
		prefix = filepath.Dir(real)
	}
	return Python{Path: real, Source: source, Prefix: prefix, Note: note}, nil
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// script reports whether p is a "#!" script rather than a binary.
func script(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 2)
	n, _ := f.Read(b)
	return bytes.Equal(b[:n], []byte("#!"))
}

// Version runs the interpreter for its version ("3.11.2"), or returns
// the error.
func (p Python) Version() (string, error) {
	out, err := exec.Command(p.Path, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])").Output()
	if err != nil {
		return "", fmt.Errorf("python %s: %w", p.Path, err)
	}
	return strings.TrimSpace(string(out)), nil
}
