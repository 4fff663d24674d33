package cli

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFetchCommand: exit 0 only with a verified file; a wrong pin exits
// 1 with the reason and installs nothing; progress goes to the log when
// stderr is not a terminal.
func TestFetchCommand(t *testing.T) {
	data := bytes.Repeat([]byte("metnos"), 5000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "f", time.Unix(0, 0), bytes.NewReader(data))
	}))
	defer srv.Close()
	sum := sha256.Sum256(data)
	pin := hex.EncodeToString(sum[:])
	dir := t.TempDir()
	for _, tc := range []struct {
		sha  string
		code int
		out  string
	}{
		{pin, 0, "verified"},
		{strings.Repeat("1", 64), 1, "pin or the upstream file is wrong"},
	} {
		dst := filepath.Join(dir, tc.sha[:8])
		var out, errb bytes.Buffer
		code := run(stdio{in: os.Stdin, out: &out, err: &errb}, []string{"fetch", srv.URL, "--sha256", tc.sha, "-o", dst, "--chunk", "7000"})
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.out) {
			t.Errorf("sha %s…: exit %d, want %d with %q\nstdout: %s\nstderr: %s", tc.sha[:8], code, tc.code, tc.out, out.String(), errb.String())
		}
		if _, err := os.Stat(dst); (err == nil) != (tc.code == 0) {
			t.Errorf("sha %s…: file present %v after exit %d", tc.sha[:8], err == nil, code)
		}
		if tc.code == 0 && !strings.Contains(errb.String(), "download progress") {
			t.Errorf("no progress in the log: %s", errb.String())
		}
	}
	if code := run(stdio{in: os.Stdin, out: &bytes.Buffer{}, err: &bytes.Buffer{}}, []string{"fetch", srv.URL}); code != exitUsage {
		t.Errorf("fetch without a pin: exit %d, want %d", code, exitUsage)
	}
}

// TestRuntimeCommands: runtime install from a URL and a pin, then
// runtime status, and the Python selection picks the provisioned one.
func TestRuntimeCommands(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CACHE_HOME", filepath.Join(home, "cache"))
	t.Setenv("XDG_DATA_HOME", filepath.Join(home, "data"))
	t.Setenv("METNOS_PYTHON", "")
	archive := targz("#!/bin/sh\necho 3.99.0\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "a", time.Unix(0, 0), bytes.NewReader(archive))
	}))
	defer srv.Close()
	sum := sha256.Sum256(archive)
	var out, errb bytes.Buffer
	std := stdio{in: os.Stdin, out: &out, err: &errb}
	if code := run(std, []string{"runtime", "install", "--url", srv.URL + "/cpython-3.99.0-test.tar.gz", "--sha256", hex.EncodeToString(sum[:])}); code != 0 || !strings.Contains(out.String(), "installed Python 3.99.0") {
		t.Fatalf("install: exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run(std, []string{"runtime", "status"}); code != 0 || !strings.Contains(out.String(), "installed:  Python 3.99.0") || !strings.Contains(out.String(), "(provisioned)") {
		t.Fatalf("status: exit %d\n%s", code, out.String())
	}
}

// TestDoctorShowsDownload: a runtime download under way (or left
// half-way) shows in doctor.
func TestDoctorShowsDownload(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CACHE_HOME", filepath.Join(home, "cache"))
	rt := filepath.Join(home, "cache", "metnos", "runtime")
	os.MkdirAll(rt, 0o755)
	os.WriteFile(filepath.Join(rt, "cpython.tar.gz.verified.part.json"), []byte(`{"url":"http://mirror/cpython.tar.gz","sha256":"x","size":30000000,"committed":8000000}`), 0o644)
	var out bytes.Buffer
	run(stdio{in: os.Stdin, out: &out, err: &bytes.Buffer{}}, []string{"doctor"})
	if !strings.Contains(out.String(), "http://mirror/cpython.tar.gz: 8000000 of 30000000 bytes") {
		t.Fatalf("doctor:\n%s", out.String())
	}
}

// TestFetchDestinations: -o naming a folder puts the file in it under
// the URL's name; -o in a missing folder is refused and creates
// nothing; a success leaves no FILE.part* behind; flags may follow the
// URL.
func TestFetchDestinations(t *testing.T) {
	data := bytes.Repeat([]byte("metnos"), 3000)
	var requests int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests++
		http.ServeContent(w, r, "f", time.Unix(0, 0), bytes.NewReader(data))
	}))
	defer srv.Close()
	sum := sha256.Sum256(data)
	pin := hex.EncodeToString(sum[:])
	dir := t.TempDir()

	code, out, errs := runCLI(t, "fetch", srv.URL+"/python.tar.gz", "-o", dir, "--sha256", pin)
	got, err := os.ReadFile(filepath.Join(dir, "python.tar.gz"))
	if code != 0 || err != nil || !bytes.Equal(got, data) {
		t.Errorf("-o FOLDER: exit %d, %v\n%s%s", code, err, out, errs)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.part*")); len(left) > 0 {
		t.Errorf("left behind: %q", left)
	}

	requests = 0
	missing := filepath.Join(dir, "nope")
	code, _, errs = runCLI(t, "fetch", srv.URL+"/f", "-o", filepath.Join(missing, "f"), "--sha256", pin)
	if code != exitFailure || !strings.Contains(errs, "folder "+missing+" does not exist") || requests != 0 {
		t.Errorf("-o in a missing folder: exit %d, %d requests, stderr %s", code, requests, errs)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("%s was created", missing)
	}

	code, _, errs = runCLI(t, "fetch", srv.URL+"/", "-o", dir, "--sha256", pin)
	if code != exitUsage || !strings.Contains(errs, "names no file") {
		t.Errorf("-o FOLDER with a URL naming no file: exit %d, stderr %s", code, errs)
	}
}

// TestRuntimeInstallLocalArchive: runtime install --url takes a local
// archive (the first thing a user tries), verified against its pin; a
// size that contradicts the pin fails at once and installs nothing.
func TestRuntimeInstallLocalArchive(t *testing.T) {
	gz := targz("#!/bin/sh\necho 3.99.1\n")
	archive := filepath.Join(t.TempDir(), "cpython-3.99.1-test.tar.gz")
	if err := os.WriteFile(archive, gz, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(gz)
	pin := hex.EncodeToString(sum[:])
	code, out, errs := runCLI(t, "runtime", "install", "--url", archive, "--sha256", pin, "--size", strconv.Itoa(len(gz)+1))
	if code != exitFailure || !strings.Contains(errs, "the pin says") || strings.Contains(errs, "attempt") {
		t.Errorf("a size contradicting the pin: exit %d (want 1, at once, not retried)\n%s%s", code, out, errs)
	}
	for _, u := range []string{archive, "file://" + archive} {
		code, out, errs = runCLI(t, "runtime", "install", "--url", u, "--sha256", pin)
		if code != 0 || !strings.Contains(out, "installed Python 3.99.1") {
			t.Errorf("runtime install --url %s: exit %d\n%s%s", u, code, out, errs)
		}
	}
}

// TestFetchUsageErrors: a bad --sha256, --size or --chunk is a usage
// error (exit 2) said in one line, before any request or file; a
// failed download's error starts on the first line of stderr.
func TestFetchUsageErrors(t *testing.T) {
	var requests int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests++
		http.NotFound(w, r)
	}))
	defer srv.Close()
	pin := strings.Repeat("a", 64)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sha256", "xyz"}, `--sha256 "xyz" is not 64 hex digits`},
		{[]string{"--sha256", pin, "--size", "-5"}, "--size -5 is negative"},
		{[]string{"--sha256", pin, "--chunk", "0"}, "--chunk 0: give a positive number of bytes"},
		{[]string{"--sha256", pin, "--chunk", "-1"}, "--chunk -1: give a positive number of bytes"},
	} {
		dir := t.TempDir()
		dst := filepath.Join(dir, "f.bin")
		var out, errb bytes.Buffer
		code := run(stdio{in: os.Stdin, out: &out, err: &errb}, append([]string{"fetch", srv.URL + "/f.bin", "-o", dst}, tc.args...))
		if code != exitUsage || !strings.HasPrefix(errb.String(), "metnos-agent: ") || !strings.Contains(errb.String(), tc.want) || strings.Count(errb.String(), "\n") != 1 {
			t.Errorf("%q: exit %d, want %d with one line saying %q\nstderr: %s", tc.args, code, exitUsage, tc.want, errb.String())
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("%q: left %v", tc.args, left)
		}
	}
	if requests != 0 {
		t.Errorf("%d requests for usage errors", requests)
	}
	dir := t.TempDir()
	var errb bytes.Buffer
	code := run(stdio{in: os.Stdin, out: &bytes.Buffer{}, err: &errb}, []string{"fetch", srv.URL + "/f.bin", "--sha256", pin, "-o", filepath.Join(dir, "f.bin")})
	if code != exitFailure || !strings.HasPrefix(errb.String(), "metnos-agent: fetch ") || !strings.Contains(errb.String(), "404") {
		t.Errorf("404: exit %d, stderr %q: want 1 and the error on the first line", code, errb.String())
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("404 left %v", left)
	}
}

// cacheTree is each path under dir, with its type and size.
func cacheTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	tree := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		tree[p] = fmt.Sprintf("%v %d", fi.Mode().Type(), fi.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// TestRuntimeInstallNotAnArchive: runtime install given a file that is
// no gzip/xz/zstd tar archive (or a truncated one), as a path, a
// file:// URL or an http:// URL with its sha256, says what is wrong
// with it, naming it as it was given, and the cache keeps nothing of it
// (no copy, .part or staging folder); the runtime installed before, and
// the rest of the cache, stay. It said "the interpreter does not run
// here" and kept the 300 kB copy.
func TestRuntimeInstallNotAnArchive(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the stand-in interpreter is a shell script")
	}
	home := t.TempDir()
	cache := filepath.Join(home, "cache")
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, "config"))
	t.Setenv("XDG_DATA_HOME", filepath.Join(home, "data"))
	t.Setenv("XDG_STATE_HOME", filepath.Join(home, "state"))
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("METNOS_PYTHON", "")
	install := func(url string, b []byte) (int, string) {
		sum := sha256.Sum256(b)
		var out, errb bytes.Buffer
		code := run(stdio{in: os.Stdin, out: &out, err: &errb}, []string{"runtime", "install", "--url", url, "--sha256", hex.EncodeToString(sum[:])})
		return code, "\n" + out.String() + errb.String() // every line after a "\n"
	}
	dir := t.TempDir()

	// A fresh cache: the refused file leaves only the install's lock
	// and its (empty) versions folder.
	random := make([]byte, 300_000)
	r := rand.New(rand.NewPCG(26, 3))
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	bad := filepath.Join(dir, "cpython-bad.tar.gz")
	os.WriteFile(bad, random, 0o644)
	if code, msg := install(bad, random); code != exitFailure || !strings.Contains(msg, "\nmetnos-agent: runtime: "+bad+": not a gzip/xz/zstd tar archive;") {
		t.Errorf("a fresh cache: exit %d\n%s", code, msg)
	}
	rt := filepath.Join(cache, "metnos", "runtime")
	want := map[string]string{cache: "d--------- ", filepath.Join(cache, "metnos"): "d--------- ", rt: "d--------- ",
		filepath.Join(rt, "versions"): "d--------- ", filepath.Join(rt, ".lock"): "---------- "}
	for p, kind := range cacheTree(t, cache) {
		if w, ok := want[p]; !ok || !strings.HasPrefix(kind, w) {
			t.Errorf("a fresh cache holds %s (%s) after the refused file", p, kind)
		}
	}

	// A runtime installed, then non-archives given every way.
	goodFile := filepath.Join(dir, "cpython-3.99.5.tar.gz")
	good := targz("#!/bin/sh\necho 3.99.5\n")
	os.WriteFile(goodFile, good, 0o644)
	if code, msg := install(goodFile, good); code != 0 || !strings.Contains(msg, "installed Python 3.99.5") {
		t.Fatalf("install: exit %d\n%s", code, msg)
	}
	before := cacheTree(t, cache)
	var zipped bytes.Buffer
	zw := zip.NewWriter(&zipped)
	f, _ := zw.Create("python/bin/python3")
	f.Write(random)
	zw.Close()
	big := targz(string(random))
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "a", time.Unix(0, 0), bytes.NewReader(body))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"random", random, "not a gzip/xz/zstd tar archive;"},
		{"text", []byte(strings.Repeat("a line of text\n", 20_000)), "not a gzip/xz/zstd tar archive (it is text);"},
		{"zip", zipped.Bytes(), "not a gzip/xz/zstd tar archive (it is a zip archive);"},
		{"truncated", big[:len(big)/2], "a damaged archive: its gzip stream is cut short (a truncated download or copy?)"},
	} {
		body = tc.b
		os.WriteFile(bad, tc.b, 0o644)
		for _, url := range []string{bad, "file://" + bad, srv.URL + "/cpython-bad.tar.gz"} {
			code, msg := install(url, tc.b)
			if code != exitFailure || !strings.Contains(msg, "\nmetnos-agent: runtime: "+url+": "+tc.want) || !strings.Contains(msg, "the cache keeps nothing of it") || strings.Contains(msg, "does not run") {
				t.Errorf("%s from %s: exit %d, want 1 and %q\n%s", tc.name, url, code, url+": "+tc.want, msg)
			}
			if after := cacheTree(t, cache); !maps.Equal(after, before) {
				t.Errorf("%s from %s: the cache holds\n%v\nit held\n%v", tc.name, url, after, before)
			}
		}
	}
	var out bytes.Buffer
	if code := run(stdio{in: os.Stdin, out: &out, err: &bytes.Buffer{}}, []string{"runtime", "status"}); code != 0 || !strings.Contains(out.String(), "installed:  Python 3.99.5") {
		t.Errorf("status after the refused files: exit %d\n%s", code, out.String())
	}
}

// targz is a stand-in python-build-standalone archive: a tar.gz whose
// python/bin/python3 is the script body.
func targz(body string) []byte {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	tw.WriteHeader(&tar.Header{Name: "python/bin/python3", Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write([]byte(body))
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()
	return gz.Bytes()
}
