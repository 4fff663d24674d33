// Package pyc keeps the compiled bytecode of the Python code the agent
// runs: an executor's modules and the shim's, compiled once, outside
// the sandbox, by the interpreter the executors run with, into the
// standard __pycache__/<stem>.<cache_tag>.pyc files with the
// checked-hash invalidation mode (PEP 552), so that Python checks each
// one against its source's hash before using it.
//
// What it guarantees: beside the files it compiles it writes a list
// ([ListName]) of every bytecode file in the folder with its SHA-256,
// the interpreter they were compiled by and the folder, authenticated
// with HMAC-SHA256 under a key the caller derives from a secret the
// sandbox never sees (the device key). [Bytecode.Prepare], called on
// every use, trusts the bytecode of a folder only when every file under
// its __pycache__ folders (and every .pyc anywhere in it) is listed
// with its digest by a list that authenticates: anything else removes
// all of the folder's bytecode, so a planted .pyc is never loaded.
// What it does not: check the sources (the caller verifies them first,
// see package bundle), or keep anyone who can write the folder between
// the check and Python's read of it from swapping a file (the same
// window as for the sources).
package pyc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ListName is the file, in the folder's root, that lists the folder's
// bytecode. It is not a Python module name, so nothing imports it.
const ListName = ".metnos-pyc"

// CacheDir is the folder name Python reads bytecode from.
const CacheDir = "__pycache__"

// compileScript compiles the files named by its arguments, each to the
// path importlib reads it from, with checked-hash headers; it reads no
// other input. One that fails is reported and left to run from source.
const compileScript = `import sys, py_compile, importlib.util
bad = 0
for src in sys.argv[1:]:
    try:
        py_compile.compile(src, cfile=importlib.util.cache_from_source(src), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    except Exception as e:
        bad += 1
        print("%s: %s" % (src, e), file=sys.stderr)
sys.exit(1 if bad else 0)
`

// Bytecode compiles and checks a folder's bytecode. The zero Bytecode
// (or one with Off set) keeps none: Prepare removes what there is.
type Bytecode struct {
	// Python is the interpreter the executors run with (symlinks
	// resolved): the bytecode is compiled by it and trusted only for it.
	Python string
	// Key authenticates the lists; without one nothing is compiled.
	Key []byte
	// Off keeps no bytecode (METNOS_BYTECODE=off).
	Off bool
	// Timeout bounds one compilation (0: 30 s).
	Timeout time.Duration
}

// KeyFrom derives the lists' key from a device secret (the Ed25519
// seed of the device key): the HMAC of a fixed label under it, so the
// secret itself never serves two purposes.
func KeyFrom(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("metnos-agent pyc list v1"))
	return m.Sum(nil)
}

// Outcome is what [Bytecode.Prepare] found and did.
type Outcome struct {
	// Trusted says the folder's bytecode verified (or was just
	// compiled) and Python may load it.
	Trusted bool
	// Compiled says Prepare compiled the folder's sources.
	Compiled bool
	// Untrusted, when not nil, says why bytecode found in the folder
	// was not trusted and was removed: log it as a warning.
	Untrusted error
	// Stale says the bytecode was for another interpreter and was
	// compiled again.
	Stale bool
	// Err is a compilation or write failure: the folder runs from
	// source.
	Err error
}

// enabled reports whether b keeps bytecode.
func (b *Bytecode) enabled() bool {
	return b != nil && !b.Off && b.Python != "" && len(b.Key) > 0
}

// Prepare makes dir's bytecode trustworthy before a run: it verifies
// it, and when that fails removes it all and compiles sources (paths
// relative to dir, slash-separated) again. Disabled, it removes any
// bytecode dir holds. It never fails the run: Outcome.Err says what
// went wrong, and Python then runs from source.
func (b *Bytecode) Prepare(dir string, sources []string) Outcome {
	if !b.enabled() {
		if found, err := present(dir); err != nil || found {
			if err := Remove(dir); err != nil {
				return Outcome{Err: err}
			}
		}
		return Outcome{}
	}
	var o Outcome
	err := b.Verify(dir)
	switch {
	case err == nil:
		return Outcome{Trusted: true}
	case errors.Is(err, errStale):
		o.Stale = true
	case errors.Is(err, fs.ErrNotExist):
		// Nothing compiled yet, or the list is gone: anything
		// there is not trusted.
		if found, _ := present(dir); found {
			o.Untrusted = err
		}
	default:
		o.Untrusted = err
	}
	if err := Remove(dir); err != nil {
		o.Err = err
		return o
	}
	if err := b.Compile(dir, sources); err != nil {
		o.Err = err
		// What did compile may still be listed and used.
	}
	o.Compiled = true
	if err := b.writeList(dir); err != nil {
		Remove(dir)
		o.Err = errors.Join(o.Err, err)
		return o
	}
	o.Trusted = true
	return o
}

// Compile compiles the .py files among sources (relative to dir) with
// b's interpreter, run with -I -S -B, an empty environment and a time
// limit, given nothing but the files' paths.
func (b *Bytecode) Compile(dir string, sources []string) error {
	args := []string{"-I", "-S", "-B", "-c", compileScript}
	n := 0
	for _, s := range sources {
		if strings.HasSuffix(s, ".py") {
			args = append(args, filepath.Join(dir, filepath.FromSlash(s)))
			n++
		}
	}
	if n == 0 {
		return nil
	}
	timeout := b.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Python, args...)
	cmd.Env = []string{}
	cmd.Dir = filepath.Dir(b.Python)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("compiling %d Python files in %s with %s: %v: %s", n, dir, b.Python, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// errStale marks a list written for another interpreter.
var errStale = errors.New("the bytecode is another interpreter's")

// interpreter identifies b's interpreter: its path, size and mtime,
// which change when it is replaced or upgraded.
func (b *Bytecode) interpreter() (string, error) {
	fi, err := os.Stat(b.Python)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %d %d", strconv.Quote(b.Python), fi.Size(), fi.ModTime().UnixNano()), nil
}

// files returns the bytecode files under dir (relative, slash-separated,
// sorted): every entry under a __pycache__ folder, and every .pyc
// anywhere. A non-regular one is an error.
func files(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		inCache := slices.Contains(strings.Split(rel, "/"), CacheDir)
		if !inCache && !strings.HasSuffix(rel, ".pyc") {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s in %s is not a file", rel, dir)
		}
		out = append(out, rel)
		return nil
	})
	slices.Sort(out)
	return out, err
}

// present reports whether dir holds any bytecode or a list.
func present(dir string) (bool, error) {
	rels, err := files(dir)
	if len(rels) > 0 || err != nil {
		return true, err
	}
	_, err = os.Lstat(filepath.Join(dir, ListName))
	return err == nil, nil
}

// Remove removes all of dir's bytecode: its __pycache__ folders, any
// .pyc elsewhere, and the list.
func Remove(dir string) error {
	var errs []error
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		if p == dir {
			return nil
		}
		if d.IsDir() && d.Name() == CacheDir {
			errs = append(errs, os.RemoveAll(p))
			return fs.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(d.Name(), ".pyc") || !d.Type().IsRegular() && filepath.Base(filepath.Dir(p)) == CacheDir) {
			errs = append(errs, os.Remove(p))
		}
		return nil
	})
	if err := os.Remove(filepath.Join(dir, ListName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing the bytecode of %s: %w", dir, err)
	}
	return nil
}

// body is the authenticated part of dir's list for the files given.
func (b *Bytecode) body(dir string, rels []string) ([]byte, error) {
	id, err := b.interpreter()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "metnos-pyc 1\nfolder %s\npython %s\n", strconv.Quote(dir), id)
	for _, rel := range rels {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&buf, "%x %s\n", sum, strconv.Quote(rel))
	}
	return buf.Bytes(), nil
}

// mac is the list body's HMAC line.
func (b *Bytecode) mac(body []byte) string {
	m := hmac.New(sha256.New, b.Key)
	m.Write(body)
	return "hmac " + hex.EncodeToString(m.Sum(nil)) + "\n"
}

// writeList lists dir's bytecode as it is now.
func (b *Bytecode) writeList(dir string) error {
	rels, err := files(dir)
	if err != nil {
		return err
	}
	body, err := b.body(dir, rels)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ListName+".tmp")
	if err := os.WriteFile(tmp, append(body, b.mac(body)...), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, ListName))
}

// Verify checks dir's bytecode against its list: the list authenticates
// under b's key, names this folder and b's interpreter (else the error
// wraps errStale), and lists exactly the bytecode files there are, each
// with its digest. A missing list is an error wrapping fs.ErrNotExist.
func (b *Bytecode) Verify(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, ListName))
	if err != nil {
		return fmt.Errorf("the bytecode list of %s: %w", dir, err)
	}
	i := bytes.LastIndex(raw[:max(len(raw)-1, 0)], []byte("\n"))
	if i < 0 {
		return fmt.Errorf("the bytecode list of %s is not one", dir)
	}
	body, tail := raw[:i+1], raw[i+1:]
	if !hmac.Equal(tail, []byte(b.mac(body))) {
		return fmt.Errorf("the bytecode list of %s is not the agent's (its HMAC does not verify)", dir)
	}
	rels, err := files(dir)
	if err != nil {
		return err
	}
	id, err := b.interpreter()
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	want := map[string]string{}
	for n := 0; sc.Scan(); n++ {
		line := sc.Text()
		switch n {
		case 0:
			if line != "metnos-pyc 1" {
				return fmt.Errorf("the bytecode list of %s is of another version", dir)
			}
		case 1:
			if line != "folder "+strconv.Quote(dir) {
				return fmt.Errorf("the bytecode list of %s is another folder's", dir)
			}
		case 2:
			if line != "python "+id {
				return fmt.Errorf("%w: %s was compiled by %s, not %s", errStale, dir, strings.TrimPrefix(line, "python "), id)
			}
		default:
			sum, q, ok := strings.Cut(line, " ")
			rel, err := strconv.Unquote(q)
			if !ok || err != nil {
				return fmt.Errorf("the bytecode list of %s has a bad line %q", dir, line)
			}
			want[rel] = sum
		}
	}
	for _, rel := range rels {
		sum, ok := want[rel]
		if !ok {
			return fmt.Errorf("%s in %s is not bytecode the agent wrote", rel, dir)
		}
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return err
		}
		got := sha256.Sum256(data)
		if hex.EncodeToString(got[:]) != sum {
			return fmt.Errorf("%s in %s is not the bytecode the agent wrote (its digest differs)", rel, dir)
		}
		delete(want, rel)
	}
	for rel := range want {
		return fmt.Errorf("%s in %s, which the agent wrote, is missing", rel, dir)
	}
	return nil
}
