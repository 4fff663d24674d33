package fetch

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/testkit/pbstest"
	"github.com/metnos/agent/testkit/testbin"
)

// standaloneFromSystem is pbstest's archive of this machine's Python.
func standaloneFromSystem(t *testing.T) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	ver, err := pbstest.Write(&buf, gzip.BestSpeed)
	if errors.Is(err, pbstest.ErrNoPython) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), ver
}

// TestRuntimeFromSystemPython: a real runtime, served over loopback,
// installed, and an executor run with it through sandbox.Run.
func TestRuntimeFromSystemPython(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the sandbox part is Linux's")
	}
	archive, ver := standaloneFromSystem(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "py.tar.gz", time.Unix(0, 0), bytes.NewReader(archive))
	}))
	defer srv.Close()
	sum := sha256.Sum256(archive)
	lay := layout.Layout{Cache: t.TempDir()}
	name := "cpython-" + ver + "+test-x86_64-unknown-linux-gnu-install_only.tar.gz"
	rt, err := Install(context.Background(), lay, Source{URL: srv.URL + "/" + name, Pin: Pin{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(archive))}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rt.Version, ver) {
		t.Errorf("the runtime says it is %q, want %s.x", rt.Version, ver)
	}
	cur, err := Current(lay)
	if err != nil || cur.Dir != rt.Dir {
		t.Fatalf("Current: %+v %v", cur, err)
	}
	// The agent's path for the provisioned runtime resolves to it.
	if p, err := filepath.EvalSymlinks(filepath.Join(lay.Cache, "runtime", "python", "bin", "python3")); err != nil || !strings.HasPrefix(p, rt.Dir) {
		t.Fatalf("runtime/python/bin/python3 -> %s (%v)", p, err)
	}

	// An executor, run with it in the sandbox.
	exDir := t.TempDir()
	os.WriteFile(filepath.Join(exDir, "echo.py"), []byte("import json, sys\nargs = json.load(sys.stdin)\nprint(json.dumps({'ok': True, 'prefix': sys.prefix, 'echo': args}))\n"), 0o644)
	host, err := testbin.Host()
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Derive(policy.DeriveInput{Host: host, Extra: []policy.Grant{
		{Path: rt.Dir, Access: policy.Read, Own: true}, {Path: exDir, Access: policy.Read, Own: true}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := sandbox.Run(context.Background(), sandbox.Request{
		// Resolved, as the agent's FindPython gives it; -v: Python says
		// where each module's code came from.
		Argv:  []string{rt.Interpreter, "-v", filepath.Join(exDir, "echo.py")},
		Stdin: strings.NewReader(`{"q":"città"}`), Env: []string{"PATH=/usr/bin:/bin"}, Policy: pol, Limits: sandbox.Limits{Timeout: 30 * time.Second}, Options: testbin.SandboxOptions(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		OK     bool
		Prefix string
		Echo   map[string]string
	}
	if json.Unmarshal(out.Stdout, &r) != nil || !r.OK || r.Echo["q"] != "città" || r.Prefix != rt.Dir {
		t.Fatalf("the executor under %s: %s / %s", out.Sandbox, out.Stdout, out.Stderr)
	}
	t.Logf("ran with the installed runtime under %s, sys.prefix %s", out.Sandbox, r.Prefix)
	// The standard library's bytecode, compiled at the install (the
	// archive has none), is what the read-only runtime runs.
	stderr := string(out.Stderr)
	used := "code object from '" + filepath.Join(rt.Dir, "lib", "python"+ver, "json", "__pycache__")
	if !strings.Contains(stderr, used) || strings.Contains(stderr, "bytecode is stale") {
		t.Errorf("json did not come from the runtime's compiled bytecode (want %q):\n%s", used, testbin.Grep(stderr, "json"))
	}

	// A second archive whose interpreter does not run: the first stays.
	bad := tarball(t, "gz", []entry{{name: "python/bin/python3", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/false\n"}})
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "b", time.Unix(0, 0), bytes.NewReader(bad))
	}))
	defer srv2.Close()
	bsum := sha256.Sum256(bad)
	if _, err := Install(context.Background(), lay, Source{URL: srv2.URL + "/bad.tar.gz", Pin: Pin{SHA256: hex.EncodeToString(bsum[:])}}, Options{}); err == nil || !strings.Contains(err.Error(), "previous runtime stays") {
		t.Fatalf("a runtime that does not run: %v", err)
	}
	if cur, err := Current(lay); err != nil || cur.Dir != rt.Dir {
		t.Fatalf("after a failed install the runtime is %+v (%v)", cur, err)
	}
}

// TestInstallSwitchAndLock: a second runtime replaces the first, whose
// folder then goes; an install while another holds the lock fails at
// once and changes nothing.
func TestInstallSwitchAndLock(t *testing.T) {
	lay := layout.Layout{Cache: t.TempDir()}
	serve := func(version string) (Source, func()) {
		arc := tarball(t, "gz", []entry{{name: "python/bin/python3", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho " + version + "\n"}})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.ServeContent(w, r, "a", time.Unix(0, 0), bytes.NewReader(arc))
		}))
		sum := sha256.Sum256(arc)
		return Source{URL: srv.URL + "/cpython-" + version + ".tar.gz", Pin: Pin{SHA256: hex.EncodeToString(sum[:])}}, srv.Close
	}
	s1, c1 := serve("3.99.1")
	defer c1()
	s2, c2 := serve("3.99.2")
	defer c2()
	r1, err := Install(context.Background(), lay, s1, Options{})
	if err != nil || r1.Version != "3.99.1" {
		t.Fatalf("first: %+v %v", r1, err)
	}
	lock, err := lockfile.Lock(filepath.Join(filepath.Join(lay.Cache, "runtime"), ".lock"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Install(context.Background(), lay, s2, Options{}); err == nil || !strings.Contains(err.Error(), "another install is running") {
		t.Fatalf("an install under the lock: %v", err)
	}
	if cur, _ := Current(lay); cur.Dir != r1.Dir {
		t.Fatal("the locked-out install changed the runtime")
	}
	lock.Release()
	r2, err := Install(context.Background(), lay, s2, Options{})
	if err != nil || r2.Version != "3.99.2" {
		t.Fatalf("second: %+v %v", r2, err)
	}
	if cur, _ := Current(lay); cur.Dir != r2.Dir || cur.Version != "3.99.2" {
		t.Fatalf("current after the switch: %+v", cur)
	}
	// The one current until now stays (an executor may be using it);
	// the one before goes.
	s3, c3 := serve("3.99.3")
	defer c3()
	r3, err := Install(context.Background(), lay, s3, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	ents, _ := os.ReadDir(filepath.Join(filepath.Join(lay.Cache, "runtime"), "versions"))
	for _, e := range ents {
		left = append(left, filepath.Join(filepath.Join(lay.Cache, "runtime"), "versions", e.Name(), "python"))
	}
	if len(left) != 2 || !slices.Contains(left, r3.Dir) || !slices.Contains(left, r2.Dir) {
		t.Fatalf("versions left: %v, want the current %s and the previous %s", left, r3.Dir, r2.Dir)
	}
}

// TestInstallRepairsDamagedCopy: an unpacked runtime without its
// completion marker (a crash before it was synced) is unpacked again.
func TestInstallRepairsDamagedCopy(t *testing.T) {
	lay := layout.Layout{Cache: t.TempDir()}
	arc := tarball(t, "gz", []entry{{name: "python/bin/python3", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho 3.99.9\n"}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "a", time.Unix(0, 0), bytes.NewReader(arc))
	}))
	defer srv.Close()
	sum := sha256.Sum256(arc)
	src := Source{URL: srv.URL + "/cpython.tar.gz", Pin: Pin{SHA256: hex.EncodeToString(sum[:])}}
	rt, err := Install(context.Background(), lay, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// What a power cut can leave: an empty interpreter, no marker.
	os.WriteFile(rt.Interpreter, nil, 0o755)
	os.Remove(filepath.Join(filepath.Dir(rt.Dir), ".complete"))
	if rt, err = Install(context.Background(), lay, src, Options{}); err != nil || rt.Version != "3.99.9" {
		t.Fatalf("after damage: %+v %v", rt, err)
	}
}

// TestInstallUnpacksOldCopyAgain: a copy unpacked by an agent whose
// extraction did not keep modification times (its marker names the pin
// alone) is unpacked again at the next install, and its files then have
// the archive's times.
func TestInstallUnpacksOldCopyAgain(t *testing.T) {
	lay := layout.Layout{Cache: t.TempDir()}
	when := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	arc := tarball(t, "gz", []entry{
		{name: "python/bin/python3", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho 3.99.9\n", mtime: when},
		{name: "python/lib/python3.99/os.py", typ: tar.TypeReg, body: "import sys\n", mtime: when},
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "a", time.Unix(0, 0), bytes.NewReader(arc))
	}))
	defer srv.Close()
	sum := sha256.Sum256(arc)
	pin := hex.EncodeToString(sum[:])
	src := Source{URL: srv.URL + "/cpython.tar.gz", Pin: Pin{SHA256: pin}}
	rt, err := Install(context.Background(), lay, src, Options{})
	if err != nil {
		t.Fatal(err)
	}
	osPy := filepath.Join(rt.Dir, "lib", "python3.99", "os.py")
	if fi, err := os.Stat(osPy); err != nil || !fi.ModTime().Equal(when) {
		t.Fatalf("os.py after install: %v %v, want the archive's time %v", fi.ModTime(), err, when)
	}
	// What the earlier extraction left: every file of the time it was
	// unpacked, and a marker with the pin alone.
	now := time.Now()
	os.Chtimes(osPy, now, now)
	os.WriteFile(filepath.Join(filepath.Dir(rt.Dir), ".complete"), []byte(pin+"\n"), 0o644)
	if rt, err = Install(context.Background(), lay, src, Options{}); err != nil || rt.Version != "3.99.9" {
		t.Fatalf("install over the old copy: %+v %v", rt, err)
	}
	if fi, err := os.Stat(osPy); err != nil || !fi.ModTime().Equal(when) {
		t.Errorf("os.py after the second install: %v %v, want the archive's time %v (the old copy was kept)", fi.ModTime(), err, when)
	}
	// A copy with the current marker is kept as it is.
	os.Chtimes(osPy, now, now)
	if _, err = Install(context.Background(), lay, src, Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(osPy); !fi.ModTime().Equal(now) {
		t.Errorf("a complete copy was unpacked again (os.py's time %v)", fi.ModTime())
	}
}

// TestTwoDownloadsOfOneFile: a second download to the same file while
// one runs fails at once rather than cutting the first's .part.
func TestTwoDownloadsOfOneFile(t *testing.T) {
	m, srv := newMirror(t, 20_000)
	m.delay = 20 * time.Millisecond
	dst := filepath.Join(t.TempDir(), "f")
	errc := make(chan error)
	go func() { errc <- File(context.Background(), srv.URL, dst, m.pin(), quick()) }()
	for {
		if _, err := os.Stat(dst + ".part"); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	err := File(context.Background(), srv.URL, dst, m.pin(), quick())
	if err == nil || !strings.Contains(err.Error(), "another download") {
		t.Fatalf("the second download: %v", err)
	}
	check(t, dst, m, <-errc, "")
}

// TestInstallNotARuntime: an archive that matches its pin but holds no
// Python runtime is said to be so at once, not unpacked twice, and
// leaves no copy in the cache.
func TestInstallNotARuntime(t *testing.T) {
	lay := layout.Layout{Cache: t.TempDir()}
	arc := tarball(t, "gz", []entry{{name: "README", typ: tar.TypeReg, mode: 0o644, body: strings.Repeat("not python\n", 1000)}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "a", time.Unix(0, 0), bytes.NewReader(arc))
	}))
	defer srv.Close()
	sum := sha256.Sum256(arc)
	src := Source{URL: srv.URL + "/bad.tar.gz", Pin: Pin{SHA256: hex.EncodeToString(sum[:])}}
	var log bytes.Buffer
	_, err := Install(context.Background(), lay, src, Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err == nil || !strings.Contains(err.Error(), "matches its pin but is not a Python runtime") {
		t.Fatalf("error %v, want one saying it is not a Python runtime", err)
	}
	if strings.Contains(log.String(), "again") {
		t.Errorf("unpacked again:\n%s", log.String())
	}
	if left, _ := filepath.Glob(lay.RuntimeArchive("bad.tar.gz") + "*"); len(left) > 0 {
		t.Errorf("left in the cache: %v", left)
	}
	if ents, _ := os.ReadDir(lay.RuntimeVersions()); len(ents) > 0 {
		t.Errorf("left in %s: %v", lay.RuntimeVersions(), ents)
	}
}

// cacheFiles is what the cache at dir holds: each path under it, with
// its type and size.
func cacheFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		files[p] = fmt.Sprintf("%v %d", fi.Mode().Type(), fi.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestInstallNotAnArchive: a file that matches its pin but is no gzip,
// xz or zstd tar archive (or a damaged one) fails the install at once,
// says so naming the file as it was given, and the cache keeps nothing
// of it: the runtime installed before, and its archive, stay as they
// were. (It was unpacked twice, said "the interpreter does not run
// here", and its copy stayed in the cache.)
func TestInstallNotAnArchive(t *testing.T) {
	lay := layout.Layout{Cache: t.TempDir()}
	good := tarball(t, "gz", []entry{{name: "python/bin/python3", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho 3.99.7\n"}})
	gsum := sha256.Sum256(good)
	gsrc := filepath.Join(t.TempDir(), "cpython-3.99.7.tar.gz")
	os.WriteFile(gsrc, good, 0o644)
	installed, err := Install(context.Background(), lay, Source{URL: gsrc, Pin: Pin{SHA256: hex.EncodeToString(gsum[:])}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := cacheFiles(t, lay.Cache)

	random := make([]byte, 300_000)
	r := rand.New(rand.NewPCG(26, 2))
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	big := tarball(t, "gz", []entry{{name: "python/bin/python3", typ: tar.TypeReg, mode: 0o755, body: string(random[:100_000])}})
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "a", time.Unix(0, 0), bytes.NewReader(body))
	}))
	defer srv.Close()
	dir := t.TempDir()
	local := filepath.Join(dir, "cpython-bad.tar.gz")
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"random", random, "not a gzip/xz/zstd tar archive"},
		{"text", []byte(strings.Repeat("plain text\n", 30_000)), "not a gzip/xz/zstd tar archive (it is text)"},
		{"truncated", big[:len(big)/2], "a damaged archive: its gzip stream is cut short"},
	} {
		body = tc.b
		os.WriteFile(local, tc.b, 0o644)
		sum := sha256.Sum256(tc.b)
		for _, url := range []string{local, "file://" + filepath.ToSlash(local), srv.URL + "/cpython-bad.tar.gz"} {
			var log bytes.Buffer
			o := Options{Logger: slog.New(slog.NewTextHandler(&log, nil))}
			_, err := Install(context.Background(), lay, Source{URL: url, Pin: Pin{SHA256: hex.EncodeToString(sum[:])}}, o)
			var ae *ArchiveError
			if !errors.As(err, &ae) || ae.Archive != url || !strings.HasPrefix(err.Error(), "runtime: "+url+": "+tc.want) {
				t.Errorf("%s from %s: %v, want an *ArchiveError beginning %q", tc.name, url, err, "runtime: "+url+": "+tc.want)
			}
			if (err != nil && strings.Contains(err.Error(), "does not run")) || strings.Contains(log.String(), "again") {
				t.Errorf("%s from %s: taken for a damaged copy: %v\n%s", tc.name, url, err, log.String())
			}
			if after := cacheFiles(t, lay.Cache); !maps.Equal(after, before) {
				t.Errorf("%s from %s: the cache holds %v, it held %v before", tc.name, url, after, before)
			}
		}
	}
	if cur, err := Current(lay); err != nil || cur.Dir != installed.Dir || cur.Version != "3.99.7" {
		t.Errorf("the runtime installed before is now %+v (%v), want %+v", cur, err, installed)
	}
}
