package fetch

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/metnos/agent/testkit/testbin"
)

type entry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	mtime      time.Time
}

func tarball(t *testing.T, comp string, es []entry) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body)), ModTime: e.mtime}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	var out bytes.Buffer
	switch comp {
	case "tar":
		return raw.Bytes()
	case "gz":
		w := gzip.NewWriter(&out)
		w.Write(raw.Bytes())
		w.Close()
	case "zst":
		w, _ := zstd.NewWriter(&out)
		w.Write(raw.Bytes())
		w.Close()
	case "xz":
		w, _ := xz.NewWriter(&out)
		w.Write(raw.Bytes())
		w.Close()
	}
	return out.Bytes()
}

// pbs is a tree shaped like python-build-standalone's install_only.
var pbs = []entry{
	{name: "python/", typ: tar.TypeDir, mode: 0o755},
	{name: "python/bin/", typ: tar.TypeDir, mode: 0o755},
	{name: "python/bin/python3.12", typ: tar.TypeReg, mode: 0o6755, body: "#!interp"},
	{name: "python/bin/python3", typ: tar.TypeSymlink, link: "python3.12"},
	{name: "python/lib/python3.12/os.py", typ: tar.TypeReg, body: "import sys"},
	{name: "python/lib/python3.12/os2.py", typ: tar.TypeLink, link: "python/lib/python3.12/os.py"},
}

func TestExtractFormats(t *testing.T) {
	for _, comp := range []string{"gz", "zst", "xz"} {
		t.Run(comp, func(t *testing.T) {
			dir := t.TempDir()
			arc := filepath.Join(dir, "a.tar."+comp)
			os.WriteFile(arc, tarball(t, comp, pbs), 0o644)
			out := filepath.Join(dir, "out")
			if err := Extract(arc, out, Limits{}); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(out, "python/bin/python3")); err != nil || string(b) != "#!interp" {
				t.Fatalf("python3 through its link: %q %v", b, err)
			}
			fi, _ := os.Stat(filepath.Join(out, "python/bin/python3.12"))
			if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
				t.Errorf("mode %v: set-id bits were kept", fi.Mode())
			}
		})
	}
}

// TestExtractedBytecodeStaysValid: a runtime's bytecode still matches
// its sources once extracted. A timestamp .pyc records its source's
// modification time; an extraction that gave every file the time of
// the extraction made Python find all of it stale, so that a standalone
// Python compiled its standard library again on every start (inside the
// sandbox it cannot write the result). Python itself is the judge here.
func TestExtractedBytecodeStaysValid(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatalf("python3 not found (METNOS_REQUIRE_SANDBOX=1 makes this a failure): %v", err)
		}
		t.Skipf("python3 not found: %v", err)
	}
	src := t.TempDir()
	mod := filepath.Join(src, "metnosmod.py")
	body := "VALUE = 42\n"
	if err := os.WriteFile(mod, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	when := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(mod, when, when); err != nil {
		t.Fatal(err)
	}
	// A timestamp .pyc, as `make install` writes them without
	// SOURCE_DATE_EPOCH.
	compile := exec.Command(py, "-c", "import py_compile, sys; print(py_compile.compile(sys.argv[1], doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP))", mod)
	out, err := compile.Output()
	if err != nil {
		t.Fatalf("compiling %s: %v", mod, err)
	}
	pyc := strings.TrimSpace(string(out))
	code, err := os.ReadFile(pyc)
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(src, pyc)
	arc := filepath.Join(t.TempDir(), "runtime.tar.gz")
	os.WriteFile(arc, tarball(t, "gz", []entry{
		{name: "lib/", typ: tar.TypeDir, mode: 0o755},
		{name: "lib/metnosmod.py", typ: tar.TypeReg, body: body, mtime: when},
		{name: "lib/__pycache__/", typ: tar.TypeDir, mode: 0o755},
		{name: "lib/" + filepath.ToSlash(rel), typ: tar.TypeReg, body: string(code), mtime: time.Now()},
	}), 0o644)
	dir := filepath.Join(t.TempDir(), "runtime")
	if err := Extract(arc, dir, Limits{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "lib", "metnosmod.py"))
	if err != nil || !fi.ModTime().Equal(when) {
		t.Errorf("the extracted source's modification time is %v (%v), the archive's %v", fi.ModTime(), err, when)
	}
	run := exec.Command(py, "-B", "-v", "-c", "import metnosmod; print(metnosmod.VALUE)")
	run.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(dir, "lib"))
	var stderr strings.Builder
	run.Stderr = &stderr
	got, err := run.Output()
	if err != nil || strings.TrimSpace(string(got)) != "42" {
		t.Fatalf("importing the extracted module: %v, %q\n%s", err, got, stderr.String())
	}
	used := "code object from '" + filepath.Join(dir, "lib", filepath.FromSlash(rel)) + "'"
	if strings.Contains(stderr.String(), "bytecode is stale for 'metnosmod'") || !strings.Contains(stderr.String(), used) {
		t.Errorf("Python did not use the extracted bytecode (want %q):\n%s", used, testbin.Grep(stderr.String(), "metnosmod"))
	}
}

func TestExtractRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		es   []entry
		lim  Limits
		want string
	}{
		{"absolute", []entry{{name: "/etc/evil", typ: tar.TypeReg, body: "x"}}, Limits{}, "absolute"},
		{"dotdot", []entry{{name: "python/../../evil", typ: tar.TypeReg, body: "x"}}, Limits{}, "not a safe relative name"},
		{"symlink-absolute", []entry{{name: "python/l", typ: tar.TypeSymlink, link: "/etc/passwd"}}, Limits{}, "points out of the tree"},
		{"symlink-climbing", []entry{{name: "python/l", typ: tar.TypeSymlink, link: "../../etc"}}, Limits{}, "climbs"},
		{"symlink-through-symlink", []entry{
			{name: "top/b", typ: tar.TypeSymlink, link: "."},
			{name: "top/a", typ: tar.TypeSymlink, link: "b/../../outside"},
		}, Limits{}, "climbs"},
		{"write-through-symlink", []entry{
			{name: "python/l", typ: tar.TypeSymlink, link: "x"},
			{name: "python/x", typ: tar.TypeSymlink, link: "y"},
			{name: "python/l/evil", typ: tar.TypeReg, body: "x"},
		}, Limits{}, "python/l/evil"},
		{"hardlink-outside", []entry{{name: "python/h", typ: tar.TypeLink, link: "../../etc/passwd"}}, Limits{}, "hard link"},
		{"hardlink-not-extracted", []entry{{name: "python/h", typ: tar.TypeLink, link: "python/later"}}, Limits{}, "hard link"},
		{"device", []entry{{name: "python/sda", typ: tar.TypeBlock}}, Limits{}, "block device"},
		{"fifo", []entry{{name: "python/f", typ: tar.TypeFifo}}, Limits{}, "FIFO"},
		{"duplicate", []entry{{name: "python/a", typ: tar.TypeReg, body: "1"}, {name: "python/a", typ: tar.TypeReg, body: "2"}}, Limits{}, "duplicate"},
		{"too-big", []entry{{name: "a", typ: tar.TypeReg, body: strings.Repeat("x", 100)}}, Limits{Bytes: 50}, "more than 50 bytes"},
		{"too-many", []entry{{name: "a", typ: tar.TypeReg}, {name: "b", typ: tar.TypeReg}, {name: "c", typ: tar.TypeReg}}, Limits{Entries: 2}, "more than 2 entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			arc := filepath.Join(dir, "a.tar.gz")
			os.WriteFile(arc, tarball(t, "gz", tc.es), 0o644)
			out := filepath.Join(dir, "out")
			err := Extract(arc, out, tc.lim)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if _, serr := os.Stat(out); serr == nil {
				t.Error("the staging folder was left behind")
			}
			if _, serr := os.Lstat(filepath.Join(dir, "outside")); serr == nil {
				t.Error("something was written outside")
			}
		})
	}
}

// TestExtractDamagedStream: a stream cut short or with a bad checksum
// is an error, even when the tar part looked complete.
func TestExtractDamagedStream(t *testing.T) {
	good := tarball(t, "gz", pbs)
	for name, b := range map[string][]byte{
		"truncated": good[:len(good)-6],
		"bad-crc":   append(append([]byte(nil), good[:len(good)-8]...), 0, 0, 0, 0, good[len(good)-4], good[len(good)-3], good[len(good)-2], good[len(good)-1]),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			arc := filepath.Join(dir, "a.tar.gz")
			os.WriteFile(arc, b, 0o644)
			err := Extract(arc, filepath.Join(dir, "out"), Limits{})
			if err == nil {
				t.Fatal("a damaged stream was accepted")
			}
		})
	}
}

// compress is b compressed as comp says ("gz", "zst", "xz").
func compress(t *testing.T, comp string, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	var w io.WriteCloser
	switch comp {
	case "gz":
		w = gzip.NewWriter(&out)
	case "zst":
		w, _ = zstd.NewWriter(&out)
	case "xz":
		w, _ = xz.NewWriter(&out)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestExtractNotAnArchive: a file that is no gzip, xz or zstd tar
// archive, or one damaged or cut short, is an *ArchiveError that says
// which, naming the file; nothing is left of the folder. (It once was a
// bare "not a gzip, zstd or xz stream", or the tar reader's own
// "invalid tar header" or "unexpected EOF", which the install took for
// a damaged copy, unpacked again, and blamed on the interpreter.)
func TestExtractNotAnArchive(t *testing.T) {
	random := make([]byte, 300_000)
	r := rand.New(rand.NewPCG(26, 1))
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	text := []byte(strings.Repeat("a line of plain text, not an archive\n", 8000))
	var zipped bytes.Buffer
	zw := zip.NewWriter(&zipped)
	f, _ := zw.Create("python/bin/python3")
	f.Write(text)
	zw.Close()
	// A tar whose one file is larger than the stream's first half.
	big := []entry{{name: "python/bin/python3", typ: tar.TypeReg, body: string(random[:100_000])}}
	half := func(b []byte) []byte { return b[:len(b)/2] }
	gz := tarball(t, "gz", pbs)
	badCRC := append([]byte(nil), gz...)
	badCRC[len(badCRC)-8] ^= 0xff
	rawTar := tarball(t, "tar", big)

	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"random", random, "not a gzip/xz/zstd tar archive"},
		{"text", text, "not a gzip/xz/zstd tar archive (it is text)"},
		{"html", []byte("<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n"), "not a gzip/xz/zstd tar archive (it is an HTML page)"},
		{"empty", nil, "not a gzip/xz/zstd tar archive (it is empty)"},
		{"zip", zipped.Bytes(), "not a gzip/xz/zstd tar archive (it is a zip archive)"},
		{"uncompressed-tar", rawTar, "not a gzip/xz/zstd tar archive (it is an uncompressed tar: compress it with gzip, xz or zstd)"},
		{"gzip-of-text", compress(t, "gz", text), "not a gzip/xz/zstd tar archive: its gzip stream holds no tar archive"},
		{"zstd-of-random", compress(t, "zst", random), "not a gzip/xz/zstd tar archive: its zstd stream holds no tar archive"},
		{"xz-of-text", compress(t, "xz", text), "not a gzip/xz/zstd tar archive: its xz stream holds no tar archive"},
		{"gzip-header-only", gz[:5], "a damaged archive: its gzip stream is cut short"},
		{"truncated-gzip", half(tarball(t, "gz", big)), "a damaged archive: its gzip stream is cut short"},
		{"truncated-zstd", half(tarball(t, "zst", big)), "a damaged archive: its zstd stream is cut short"},
		{"truncated-xz", half(tarball(t, "xz", big)), "a damaged archive: its xz stream is cut short"},
		{"gzip-bad-crc", badCRC, "a damaged archive: its gzip stream is corrupt"},
		{"gzip-of-truncated-tar", compress(t, "gz", half(rawTar)), "a damaged archive: the tar archive in its gzip stream is cut short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			arc := filepath.Join(dir, "cpython.tar.gz")
			if err := os.WriteFile(arc, tc.b, 0o644); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "out")
			err := Extract(arc, out, Limits{})
			var ae *ArchiveError
			if !errors.As(err, &ae) || ae.Archive != arc || !strings.HasPrefix(err.Error(), arc+": "+tc.want) {
				t.Fatalf("error %v, want an *ArchiveError beginning %q", err, arc+": "+tc.want)
			}
			if errors.Is(err, ErrUnsafeArchive) {
				t.Errorf("%v is said to be unsafe", err)
			}
			if _, serr := os.Lstat(out); serr == nil {
				t.Error("the folder was left behind")
			}
		})
	}
}
