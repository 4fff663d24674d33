package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	script := "#!/bin/sh\necho 3.99.0\n"
	tw.WriteHeader(&tar.Header{Name: "python/bin/python3", Mode: 0o755, Size: int64(len(script)), Typeflag: tar.TypeReg})
	tw.Write([]byte(script))
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()
	archive := gz.Bytes()
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
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	script := "#!/bin/sh\necho 3.99.1\n"
	tw.WriteHeader(&tar.Header{Name: "python/bin/python3", Mode: 0o755, Size: int64(len(script)), Typeflag: tar.TypeReg})
	tw.Write([]byte(script))
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()
	archive := filepath.Join(t.TempDir(), "cpython-3.99.1-test.tar.gz")
	if err := os.WriteFile(archive, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(gz.Bytes())
	pin := hex.EncodeToString(sum[:])
	code, out, errs := runCLI(t, "runtime", "install", "--url", archive, "--sha256", pin, "--size", strconv.Itoa(gz.Len()+1))
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
