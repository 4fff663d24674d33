// Package pbstest builds, for tests and benchmarks, a
// python-build-standalone-layout archive from this machine's own
// Python: python/bin/python3.X, python/bin/python3 -> python3.X and
// python/lib/python3.X/... (sources only, as python-build-standalone
// ships them), which a standalone interpreter finds beside itself.
package pbstest

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrNoPython is returned where the machine has no Debian-style
// /usr/bin/python3.X with its /usr/lib/python3.X.
var ErrNoPython = errors.New("pbstest: no /usr/bin/python3.X with /usr/lib/python3.X here")

// System finds the machine's interpreter and standard library.
func System() (exe, lib, version string, err error) {
	for _, v := range []string{"3.13", "3.12", "3.11", "3.10"} {
		if _, err := os.Stat("/usr/bin/python" + v); err == nil {
			if _, err := os.Stat("/usr/lib/python" + v + "/os.py"); err == nil {
				return "/usr/bin/python" + v, "/usr/lib/python" + v, v, nil
			}
		}
	}
	return "", "", "", ErrNoPython
}

// skip are standard-library folders a runtime can do without, and the
// bytecode (__pycache__): python-build-standalone's install_only
// archives come without it.
var skip = map[string]bool{"__pycache__": true, "test": true, "idlelib": true, "tkinter": true, "ensurepip": true, "lib2to3": true, "turtledemo": true, "site-packages": true, "dist-packages": true, "pydoc_data": true}

// Write writes the archive, gzip-compressed at level, to w and returns
// the Python version ("3.11").
func Write(w io.Writer, level int) (string, error) {
	exe, lib, ver, err := System()
	if err != nil {
		return "", err
	}
	gz, err := gzip.NewWriterLevel(w, level)
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(gz)
	add := func(name string, fi fs.FileInfo, body io.Reader) error {
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name, h.Uname, h.Gname, h.Uid, h.Gid = name, "", "", 0, 0
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if body != nil {
			_, err = io.Copy(tw, body)
		}
		return err
	}
	fi, err := os.Stat(exe)
	if err != nil {
		return "", err
	}
	f, err := os.Open(exe)
	if err != nil {
		return "", err
	}
	err = add("python/bin/python"+ver, fi, f)
	f.Close()
	if err != nil {
		return "", err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "python/bin/python3", Typeflag: tar.TypeSymlink, Linkname: "python" + ver, Mode: 0o777}); err != nil {
		return "", err
	}
	err = filepath.WalkDir(lib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && skip[d.Name()] {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(lib, p)
		name := "python/lib/python" + ver
		if rel != "." {
			name += "/" + filepath.ToSlash(rel)
		}
		fi, err := d.Info()
		if err != nil || (!fi.Mode().IsRegular() && !fi.IsDir()) || strings.ContainsAny(rel, "\\") {
			return nil
		}
		if fi.IsDir() {
			return add(name+"/", fi, nil)
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		return add(name, fi, f)
	})
	if err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return ver, gz.Close()
}
