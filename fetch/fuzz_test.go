package fetch

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzExtract builds a tar.gz from fuzzed entries and extracts it, and
// checks what [Extract] promises whatever the archive holds: it never
// panics, writes nothing outside the destination (the folders around
// it, six deep, gain nothing), leaves no destination behind when it
// fails, and leaves in it only folders, files without setuid, setgid or
// sticky bits, and symbolic links that neither are absolute nor climb
// with "..".
//
// The fuzzed input is a list of entries, one a line: the tar type flag
// (a byte: '0' file, '1' hard link, '2' symbolic link, '5' folder, '3',
// '4', '6' devices and FIFO, anything else as it is), then the name,
// then optionally NUL and the link's target. The entries, rather than
// the tar bytes, are fuzzed, since a mutated tar header mostly fails its
// checksum; the decompressors are third-party code fuzzed upstream.
func FuzzExtract(f *testing.F) {
	for _, s := range []string{
		"5python/\n5python/bin/\n0python/bin/python3.12\n2python/bin/python3\x00python3.12\n1python/lib/os2.py\x00python/bin/python3.12",
		"0./a\n0a/b/c",
		"0../evil",
		"0a/../../evil",
		"0/abs",
		"0..\\evil",
		"2up\x00../../x",
		"2abs\x00/etc/passwd",
		"2l\x00../../..\n0l/evil",
		"2l\x00/tmp\n0l/evil",
		"2b\x00.\n2c\x00b/b/b\n0c/evil",
		"2a\x00sub\n5a/\n0a/x",
		"2a\x00sub\n0a/x",
		"5d\n2d\x00x",
		"0x\n0x",
		"5d\n5d",
		"1h\x00/etc/passwd",
		"1h\x00../x",
		"0f\n1h\x00f\n0h",
		"3dev\n4blk\n6fifo",
		"gglobal\n0after",
		"0" + strings.Repeat("long/", 40) + "name",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, spec []byte) {
		archive := fuzzTar(t, spec)
		base := t.TempDir()
		arc := filepath.Join(base, "a.tar.gz")
		if err := os.WriteFile(arc, archive, 0o600); err != nil {
			t.Fatal(err)
		}
		parent := filepath.Join(base, "1", "2", "3", "4", "5", "6")
		if err := os.MkdirAll(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		before := tree(t, base)
		out := filepath.Join(parent, "out")
		err := Extract(arc, out, Limits{Bytes: 1 << 20, Entries: 100})

		var outside []string
		for _, p := range tree(t, base) {
			if p != "1/2/3/4/5/6/out" && !strings.HasPrefix(p, "1/2/3/4/5/6/out/") && !slices.Contains(before, p) {
				outside = append(outside, p)
			}
		}
		if len(outside) > 0 {
			t.Fatalf("extracting %q wrote outside the destination: %q (err %v)", spec, outside, err)
		}
		if err != nil {
			if _, serr := os.Lstat(out); serr == nil {
				t.Fatalf("extracting %q failed (%v) but left %s behind", spec, err, out)
			}
			return
		}
		filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			fi, err := d.Info()
			if err != nil {
				t.Fatal(err)
			}
			switch m := fi.Mode(); {
			case m&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0:
				t.Errorf("extracting %q left %s with mode %v", spec, p, m)
			case m.Type() == fs.ModeSymlink:
				target, err := os.Readlink(p)
				if err != nil {
					t.Fatal(err)
				}
				if filepath.IsAbs(target) || slices.Contains(strings.Split(filepath.ToSlash(target), "/"), "..") {
					t.Errorf("extracting %q left the link %s -> %s", spec, p, target)
				}
			case !m.IsDir() && !m.IsRegular():
				t.Errorf("extracting %q left %s of mode %v", spec, p, m)
			}
			return nil
		})
	})
}

// fuzzTar builds the tar.gz FuzzExtract's spec describes; entries
// tar.Writer refuses are left out, and whatever it wrote before a
// failure is kept: a cut archive is worth extracting too.
func fuzzTar(t *testing.T, spec []byte) []byte {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, line := range bytes.Split(spec, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		name, link, _ := strings.Cut(string(line[1:]), "\x00")
		h := &tar.Header{Typeflag: line[0], Name: name, Linkname: link, Mode: 0o755}
		var body []byte
		switch h.Typeflag {
		case tar.TypeReg:
			h.Mode, body = 0o6755, []byte(name)
			h.Size = int64(len(body))
		case tar.TypeXGlobalHeader:
			h.PAXRecords = map[string]string{"comment": name}
		}
		if err := tw.WriteHeader(h); err != nil {
			continue // a header tar cannot encode; an I/O error stops the next one too
		}
		tw.Write(body)
	}
	tw.Close()
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(raw.Bytes())
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return gz.Bytes()
}

// tree lists every path under dir, relative and slash-separated, without
// following links.
func tree(t *testing.T, dir string) []string {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(dir, p); rel != "." {
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
