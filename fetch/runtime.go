package fetch

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/wire"
)

// Source is a Python runtime archive to install: where it is and what
// it must be.
type Source struct {
	URL string
	Pin Pin
	// Filename is the archive's name in the cache (default: the URL's
	// last element).
	Filename string
}

// Runtime is an installed Python runtime.
type Runtime struct {
	// Dir is the runtime's "python" folder (versions/<sha16>/python).
	Dir string `json:"dir"`
	// Interpreter is the python executable inside it.
	Interpreter string `json:"interpreter"`
	// SHA256 is the pin of the archive it came from.
	SHA256 string `json:"sha256"`
	// Version is what the interpreter says ("3.12.13").
	Version string `json:"version,omitempty"`
}

// safeArchiveName is unbounded; its users check the length (240): a
// bounded repeat compiles to a program that long, at every start.
var safeArchiveName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._+-]+$`) })

// Install downloads (or finds, already verified, in lay's cache) the
// archive of src, to [layout.Layout.RuntimeArchive], extracts it into a
// new <sha16> folder of [layout.Layout.RuntimeVersions], runs its
// interpreter once, and only then points [layout.Layout.RuntimePython]
// at it; older versions are removed after the switch. One install runs
// at a time (a lock on [layout.Layout.RuntimeLock]): a second one fails
// at once.
func Install(ctx context.Context, lay layout.Layout, src Source, o Options) (Runtime, error) {
	o.defaults()
	versions := lay.RuntimeVersions()
	if src.Filename == "" {
		src.Filename = filepath.Base(strings.SplitN(src.URL, "?", 2)[0])
	}
	if len(src.Filename) > 240 || !safeArchiveName().MatchString(src.Filename) || strings.Contains(src.Filename, "..") {
		return Runtime{}, fmt.Errorf("runtime: archive name %q is not a plain file name", src.Filename)
	}
	if err := os.MkdirAll(versions, 0o755); err != nil {
		return Runtime{}, fmt.Errorf("runtime: %w", err)
	}
	lock, err := lockfile.Lock(lay.RuntimeLock())
	if err != nil {
		return Runtime{}, fmt.Errorf("runtime: another install is running: %w", err)
	}
	defer lock.Release()

	// Leftovers of an install that crashed.
	if stale, _ := filepath.Glob(filepath.Join(versions, ".staging-*")); len(stale) > 0 {
		for _, p := range stale {
			os.RemoveAll(p)
		}
	}
	archive := lay.RuntimeArchive(src.Filename)
	if err := os.MkdirAll(filepath.Dir(archive), 0o755); err != nil {
		return Runtime{}, fmt.Errorf("runtime: %w", err)
	}
	if err := File(ctx, src.URL, archive, src.Pin, o); err != nil {
		return Runtime{}, err
	}
	pin := strings.ToLower(src.Pin.SHA256)
	final := filepath.Join(versions, pin[:16])
	previous, _ := Current(lay)
	rt, err := unpacked(ctx, archive, final, pin, o.Logger)
	var bad *ArchiveError
	switch {
	// The verified archive is what it is: unpacking it again cannot
	// help, and keeping it in the cache neither.
	case errors.As(err, &bad):
		discard(archive)
		// Named as the user gave it: its copy in the cache is gone.
		bad = &ArchiveError{Archive: ShowURL(src.URL), Problem: bad.Problem, Err: bad.Err}
		return Runtime{}, fmt.Errorf("runtime: %w; nothing was installed, the previous runtime stays, and the cache keeps nothing of it: give a whole python-build-standalone archive (…install_only.tar.gz) and its sha256", bad)
	case errors.Is(err, ErrUnsafeArchive):
		discard(archive)
		return Runtime{}, fmt.Errorf("runtime %s: the archive matches its pin but is not safe to unpack, so nothing was installed and the previous runtime stays: %w", src.Filename, err)
	case errors.Is(err, errNotRuntime):
		discard(archive)
		return Runtime{}, fmt.Errorf("runtime %s: the archive matches its pin but %w: give a python-build-standalone archive (…install_only.tar.gz); nothing was installed and the previous runtime stays", src.Filename, err)
	}
	if err != nil {
		// A damaged copy (a crash, a disk error): once more from the archive.
		o.Logger.Warn("the unpacked runtime does not run; unpacking it again", "dir", final, "err", err)
		os.RemoveAll(final)
		if rt, err = unpacked(ctx, archive, final, pin, o.Logger); err != nil {
			return Runtime{}, fmt.Errorf("runtime %s: the interpreter does not run here, the previous runtime stays: %w", src.Filename, err)
		}
	}
	if rt, err = switchTo(lay, rt); err != nil {
		return Runtime{}, err
	}
	b, _ := json.Marshal(rt)
	atomicfile.WriteFile(lay.RuntimeCurrent(), b, 0o644)
	// Older versions go once the new one is in place, but for the one
	// that was current until now: an executor started by a running agent
	// may still be using it.
	ents, _ := os.ReadDir(versions)
	for _, e := range ents {
		p := filepath.Join(versions, e.Name())
		if p == final || (previous.Dir != "" && fspath.Within(previous.Dir, p)) {
			continue
		}
		os.RemoveAll(p)
	}
	o.Logger.Info("python runtime installed", "version", rt.Version, "dir", rt.Dir)
	return rt, nil
}

// discard removes from the cache what it keeps of a refused archive:
// the archive, and what a download of it may leave beside it (see
// [File]). The runtime lock is held: no install is downloading it.
func discard(archive string) {
	for _, p := range []string{archive, archive + ".part", archive + ".part.json", archive + ".part.lock"} {
		os.Remove(p)
	}
}

// unpacked returns the runtime unpacked in final, unpacking the archive
// there first when final is not a complete copy (its .complete marker,
// written only after every file was synced to disk, is completeMark);
// the interpreter must run.
func unpacked(ctx context.Context, archive, final, pin string, log *slog.Logger) (Runtime, error) {
	if b, err := os.ReadFile(filepath.Join(final, ".complete")); err != nil || strings.TrimSpace(string(b)) != completeMark(pin) {
		os.RemoveAll(final)
		staging := filepath.Join(filepath.Dir(final), fmt.Sprintf(".staging-%d", time.Now().UnixNano()))
		if err := Extract(archive, staging, Limits{}); err != nil {
			return Runtime{}, err
		}
		interp, err := interpreterIn(filepath.Join(staging, "python"))
		if err != nil {
			// Straight from the verified archive: not a damaged copy.
			os.RemoveAll(staging)
			return Runtime{}, fmt.Errorf("%w (%w)", errNotRuntime, err)
		}
		log.Info("compiling the runtime's standard library to bytecode, once", "dir", final)
		if err := compileStdlib(ctx, interp); err != nil {
			// It still runs, each start compiling what it imports.
			log.Warn("the runtime's standard library was not all compiled to bytecode; executors start slower", "dir", final, "err", err)
		}
		if err := syncTree(staging); err != nil {
			os.RemoveAll(staging)
			return Runtime{}, fmt.Errorf("runtime: %w", err)
		}
		if err := atomicfile.WriteFile(filepath.Join(staging, ".complete"), []byte(completeMark(pin)+"\n"), 0o644); err != nil {
			os.RemoveAll(staging)
			return Runtime{}, fmt.Errorf("runtime: %w", err)
		}
		if err := os.Rename(staging, final); err != nil {
			os.RemoveAll(staging)
			return Runtime{}, fmt.Errorf("runtime: %w", err)
		}
		atomicfile.SyncDir(filepath.Dir(final))
	}
	rt := Runtime{Dir: filepath.Join(final, "python"), SHA256: pin}
	var err error
	if rt.Interpreter, err = interpreterIn(rt.Dir); err != nil {
		return Runtime{}, err
	}
	// It must run before it replaces anything.
	if rt.Version, err = probe(ctx, rt.Interpreter); err != nil {
		return Runtime{}, err
	}
	return rt, nil
}

// completeMark is what a complete copy's .complete marker holds: the
// pin, then "mtimes bytecode": its files keep the archive's modification
// times, and its standard library was compiled (compileStdlib). A copy
// unpacked before either was done is unpacked again, once: Python
// compiled the modules it imports on every start there.
func completeMark(pin string) string { return pin + " mtimes bytecode" }

// compileScript compiles a runtime's standard library into __pycache__
// beside its modules, as timestamp .pyc files (valid while the sources
// keep the times [Extract] gave them), but for the test suites and
// tools no executor imports. python-build-standalone ships no bytecode,
// and the sandbox shows the runtime read-only: without this step every
// executor's start compiles the modules it imports, again and again.
const compileScript = `import compileall, py_compile, re, sys, sysconfig
skip = re.compile(r"[/\\](test|tests|idlelib|tkinter|turtledemo|lib2to3|ensurepip|site-packages)[/\\]|bad_coding|badsyntax")
ok = compileall.compile_dir(sysconfig.get_path("stdlib"), quiet=1, workers=0, rx=skip,
                            invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
sys.exit(0 if ok else 1)
`

// compileStdlib runs compileScript with interp, the runtime's own
// interpreter, outside any sandbox: it compiles the verified archive's
// sources, as the first start of any Python would.
func compileStdlib(ctx context.Context, interp string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, interp, "-I", "-c", compileScript)
	cmd.Env = []string{}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: compiling the standard library: %v: %s", interp, err, lastLines(string(out), 5))
	}
	return nil
}

// lastLines is the last n lines of s, trimmed.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// syncTree makes every file and folder under root durable.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}

// errNotRuntime is an archive that unpacks to no Python runtime.
var errNotRuntime = errors.New("is not a Python runtime")

// interpreterIn finds the interpreter of a python-build-standalone tree.
func interpreterIn(py string) (string, error) {
	for _, c := range []string{"bin/python3", "bin/python", "python.exe"} {
		p := filepath.Join(py, filepath.FromSlash(c))
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("the archive has no python/bin/python3 nor python/python.exe")
}

// probe runs the interpreter once: python -c 'import sys'.
func probe(ctx context.Context, interp string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, interp, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: %v: %s", interp, err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// Current returns the runtime [layout.Layout.RuntimePython] points at,
// if any.
func Current(lay layout.Layout) (Runtime, error) {
	real, err := filepath.EvalSymlinks(lay.RuntimePython())
	if err != nil {
		return Runtime{}, err
	}
	rt := Runtime{Dir: real}
	if b, err := os.ReadFile(lay.RuntimeCurrent()); err == nil {
		var c Runtime
		if json.Unmarshal(b, &c) == nil && c.Dir == real {
			rt = c
		}
	}
	if rt.Interpreter, err = interpreterIn(real); err != nil {
		return Runtime{}, err
	}
	return rt, nil
}

// Downloading reports the downloads in [layout.Layout.Runtime] that a
// state file says are under way (or were left half-way).
func Downloading(lay layout.Layout) []Progress {
	var out []Progress
	states, _ := filepath.Glob(filepath.Join(lay.Runtime(), "*.part.json"))
	for _, p := range states {
		var st state
		if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &st) == nil {
			total := st.Size
			if total == 0 {
				total = st.Total
			}
			out = append(out, Progress{URL: st.URL, Done: st.Committed, Total: total})
		}
	}
	return out
}

// switchTo points lay's RuntimePython at rt: a new link renamed over
// the old one on Unix, atomically. On Windows, where links need
// privileges, the unpacked folder itself is renamed into place (the
// previous one kept as python.prev until then), and rt is updated to
// say so.
func switchTo(lay layout.Layout, rt Runtime) (Runtime, error) {
	link := lay.RuntimePython()
	dir := filepath.Dir(link)
	if runtime.GOOS == "windows" {
		prev := link + ".prev"
		os.RemoveAll(prev)
		if _, err := os.Stat(link); err == nil {
			if err := os.Rename(link, prev); err != nil {
				return rt, fmt.Errorf("runtime: %w", err)
			}
		}
		if err := os.Rename(rt.Dir, link); err != nil {
			os.Rename(prev, link)
			return rt, fmt.Errorf("runtime: %w", err)
		}
		os.RemoveAll(prev)
		// The versions folder is spent: a later install unpacks again.
		os.RemoveAll(filepath.Dir(rt.Dir))
		rel, _ := filepath.Rel(rt.Dir, rt.Interpreter)
		rt.Dir, rt.Interpreter = link, filepath.Join(link, rel)
		return rt, nil
	}
	rel, err := filepath.Rel(dir, rt.Dir)
	if err != nil {
		return rt, fmt.Errorf("runtime: %w", err)
	}
	// A real folder there (the Rust client's) is moved aside first.
	if fi, err := os.Lstat(link); err == nil && fi.IsDir() {
		if err := os.Rename(link, filepath.Join(lay.RuntimeVersions(), fmt.Sprintf("previous-%d", time.Now().UnixNano()))); err != nil {
			return rt, fmt.Errorf("runtime: %w", err)
		}
	}
	tmp := link + ".new"
	os.Remove(tmp)
	if err := os.Symlink(rel, tmp); err != nil {
		return rt, fmt.Errorf("runtime: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		return rt, fmt.Errorf("runtime: %w", err)
	}
	atomicfile.SyncDir(dir)
	return rt, nil
}

// RuntimeDescriptor returns the verified descriptor of the runtime
// archive filename: get fetches the signed envelope from the paired
// server (the method RuntimeDescriptor of package client's Client:
// fetch knows no server path), which is checked against the pinned key
// and the name asked, and cached in [layout.Layout.RuntimeDescriptor];
// when get fails, the cached envelope is used instead (verified again).
func RuntimeDescriptor(ctx context.Context, lay layout.Layout, key ed25519.PublicKey, filename string, get func(ctx context.Context, filename string) ([]byte, error)) (wire.RuntimeDescriptor, error) {
	if !wire.ValidRuntimeName(filename) {
		return wire.RuntimeDescriptor{}, fmt.Errorf("runtime: %q is not a runtime archive name (…tar.gz)", filename)
	}
	cache := lay.RuntimeDescriptor()
	body, err := get(ctx, filename)
	fromCache := false
	if err != nil {
		cached, cerr := os.ReadFile(cache)
		if cerr != nil {
			return wire.RuntimeDescriptor{}, err
		}
		body, fromCache = cached, true
	}
	d, err := wire.VerifyRuntimeDescriptor(body, key, filename)
	if err != nil {
		if fromCache {
			return wire.RuntimeDescriptor{}, fmt.Errorf("%s: %w", cache, err)
		}
		return wire.RuntimeDescriptor{}, err
	}
	if !fromCache {
		os.MkdirAll(filepath.Dir(cache), 0o755)
		atomicfile.WriteFile(cache, body, 0o644)
	}
	return d, nil
}
