package agent

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/metnos/agent/agent/internal/pyc"
	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
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
	// Note says which shell shims were skipped on the way, if any.
	Note string `json:"note,omitempty"`
	// Skipped are the interpreters passed over because the sandbox could
	// not run them, each "PATH: why" ("/root/.pyenv/…/python3.11: under
	// /root, which the sandbox hides").
	Skipped []string `json:"skipped,omitempty"`
}

// FindPython picks the interpreter: override (METNOS_PYTHON) when set
// (it must be a file), else the provisioned runtime of lay when present
// (lay.InterpreterCandidates), else the first python3 (or python) in
// the folders of path (the agent's PATH) that is a real interpreter
// rather than a version manager's shell shim (pyenv, asdf), which could
// not run inside the sandbox.
//
// Only an interpreter the sandbox can show its executors is chosen:
// with host the device the sandbox derives its policies for, one that
// lies (symlinks resolved) in a folder the sandbox masks (/root when it
// is not the home folder, ~/.ssh, the agent's own folders...) or whose
// installation it could not show without showing the whole home folder
// is skipped, and Skipped says why; an override that cannot run
// is an error. With the zero Host (the sandbox off) nothing is skipped
// for the sandbox's sake.
func FindPython(lay layout.Layout, host policy.Host, override, path string) (Python, error) {
	if p := override; p != "" {
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			return Python{}, fmt.Errorf("METNOS_PYTHON=%s is not an interpreter file: fix or unset it", p)
		}
		py, err := pythonAt(p, "env:METNOS_PYTHON", "")
		if err != nil {
			return Python{}, err
		}
		if why := sandboxCannotRun(py, host, lay); why != "" {
			return Python{}, fmt.Errorf("METNOS_PYTHON=%s (%s) cannot run in the sandbox: it is %s; set METNOS_PYTHON to an interpreter installed elsewhere, or unset it", p, py.Path, why)
		}
		return py, nil
	}
	var shims, skipped []string
	consider := func(p, source string) (Python, bool) {
		py, err := pythonAt(p, source, "")
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", p, err))
			return Python{}, false
		}
		if why := sandboxCannotRun(py, host, lay); why != "" {
			skipped = append(skipped, fmt.Sprintf("%s: %s", py.Path, why))
			return Python{}, false
		}
		if len(shims) > 0 {
			py.Note = "skipped shell shims " + strings.Join(shims, ", ")
		}
		py.Skipped = skipped
		return py, true
	}
	for _, p := range lay.InterpreterCandidates() {
		if isFile(p) {
			if py, ok := consider(p, "provisioned"); ok {
				return py, nil
			}
		}
	}
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
				shims = append(shims, p)
				continue
			}
			if py, ok := consider(p, "system:"+name); ok {
				return py, nil
			}
		}
	}
	if len(skipped) > 0 {
		return Python{Skipped: skipped}, fmt.Errorf("no Python interpreter the sandbox can run (skipped %s): install python3 outside those folders, or set METNOS_PYTHON to one", strings.Join(skipped, "; "))
	}
	return Python{}, fmt.Errorf("no Python interpreter: install python3, or set METNOS_PYTHON to one")
}

// sandboxCannotRun says why the sandbox could not run py for an
// executor on host, "" when it can: the same test [Agent.request]
// makes, on the policy of an executor that asks for nothing. With the
// zero Host it says nothing.
func sandboxCannotRun(py Python, host policy.Host, lay layout.Layout) string {
	if host.Home == "" {
		return ""
	}
	pol, err := policy.Derive(policy.DeriveInput{Host: host})
	if err != nil {
		return ""
	}
	if sandbox.Visible(pol, py.Path) {
		return ""
	}
	own := fspath.Within(py.Prefix, lay.Cache)
	if m, masked := policy.CoveredByMask(py.Path, pol.Masks); masked && !own {
		return fmt.Sprintf("under %s, which the sandbox hides", m.Path)
	}
	if py.Prefix == "/" || fspath.Within(host.Home, py.Prefix) {
		return fmt.Sprintf("installed in %s, which the sandbox would have to show whole", py.Prefix)
	}
	pol, err = policy.Derive(policy.DeriveInput{Host: host, Extra: []policy.Grant{{Path: py.Prefix, Access: policy.Read, Own: own, Why: "python"}}})
	if err != nil || !sandbox.Visible(pol, py.Path) {
		return fmt.Sprintf("in %s, which the sandbox cannot show", py.Prefix)
	}
	return ""
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

// bytecode is how the agent keeps the compiled bytecode of the shim and
// the executors: compiled by a.python, its lists authenticated with a
// key derived from the device key (which the sandbox never sees). Off
// (METNOS_BYTECODE=off), without an interpreter or without the device
// key, it keeps none.
func (a *Agent) bytecode() *pyc.Bytecode {
	if a.cfg.BytecodeOff || a.pyErr != nil {
		return &pyc.Bytecode{Off: true}
	}
	key, err := pairing.LoadKey(a.cfg.Layout)
	if err != nil {
		a.log.Warn("no compiled bytecode for the executors: the device key does not load", "err", err)
		return &pyc.Bytecode{Off: true}
	}
	return &pyc.Bytecode{Python: a.python.Path, Key: pyc.KeyFrom(key.Seed())}
}

// prepareBytecode makes the bytecode of dir (the shim's or an
// executor's folder, what) safe for the run: verified, or removed and
// compiled again from sources (slash paths in dir). A failure only
// means the run compiles from source.
func (a *Agent) prepareBytecode(log *slog.Logger, what, dir string, sources []string) {
	o := a.bc.Prepare(dir, sources)
	if o.Untrusted != nil {
		log.Warn("bytecode the agent did not write was found; all of the folder's bytecode was removed and compiled again", "folder", dir, "of", what, "err", o.Untrusted)
	}
	if o.Stale {
		log.Info("the bytecode was another interpreter's; compiled again", "folder", dir, "of", what, "python", a.python.Path)
	}
	if o.Err != nil {
		log.Warn("could not compile the bytecode; the run compiles from source", "folder", dir, "of", what, "err", o.Err)
	} else if o.Compiled {
		log.Debug("bytecode compiled", "folder", dir, "of", what)
	}
}
