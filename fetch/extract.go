package fetch

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// Limits bound what [Extract] accepts. Zero fields take the defaults.
type Limits struct {
	// Bytes caps the total size of the files (4 GiB).
	Bytes int64
	// Entries caps the number of entries (200,000).
	Entries int
}

// ErrUnsafeArchive is wrapped by every refusal of an archive's content.
var ErrUnsafeArchive = errors.New("fetch: unsafe archive")

// Extract unpacks the tar archive at archive (gzip, zstd or xz
// compressed, told by its first bytes) into dir, which must not exist:
// it is created, and removed again on any error. Through an [os.Root]
// opened on dir, nothing is written outside it. It refuses absolute
// names, "..", links whose target leaves the tree, hard links to
// anything but a file already extracted, devices, FIFOs and sockets,
// entries over the limits, and duplicate names; it strips setuid,
// setgid and sticky bits; it keeps each file's modification time; and it
// reads the compressed stream to its end, so that its checksum is checked.
// A file that is no such archive, or one damaged or cut short, is an
// [*ArchiveError] that says which.
func Extract(archive, dir string, lim Limits) (err error) {
	if lim.Bytes <= 0 {
		lim.Bytes = 4 << 30
	}
	if lim.Entries <= 0 {
		lim.Entries = 200_000
	}
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("extract %s: %w", archive, err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	head, _ := br.Peek(512)
	var dec io.Reader
	var closeDec func()
	var kind string // the compression, as messages name it
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		kind = "gzip"
		gz, err := gzip.NewReader(br)
		if err != nil {
			return streamError(archive, kind, err)
		}
		dec, closeDec = gz, func() { gz.Close() }
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		kind = "zstd"
		zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(128<<20), zstd.WithDecoderMaxMemory(1<<30), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return streamError(archive, kind, err)
		}
		dec, closeDec = zr, zr.Close
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}):
		kind = "xz"
		xr, err := xz.NewReader(br)
		if err != nil {
			return streamError(archive, kind, err)
		}
		dec, closeDec = xr, func() {}
	default:
		return &ArchiveError{Archive: archive, Problem: notArchive + looksLike(head)}
	}
	defer closeDec()

	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("extract %s: %w", archive, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("extract %s: %w", archive, err)
	}
	defer root.Close()

	stream := &readErr{r: dec}
	tr := tar.NewReader(stream)
	var total int64
	files := map[string]bool{} // regular files extracted, for hard links

	n := 0 // the entries read
	for ; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			// The decompressor's error, or the tar reader's: the bytes
			// of the archive, not the disk, are at fault.
			return tarError(archive, kind, stream, n, err)
		}
		if n >= lim.Entries {
			return fmt.Errorf("%w: %s has more than %d entries", ErrUnsafeArchive, archive, lim.Entries)
		}
		name, err := entryName(h.Name)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrUnsafeArchive, archive, err)
		}
		if name == "." {
			continue
		}
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil && path.Dir(name) != "." {
			return fmt.Errorf("extract %s: %s: %w", archive, name, err)
		}
		mode := fs.FileMode(h.Mode).Perm() // no setuid, setgid, sticky
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, mode|0o700); err != nil {
				// Only a folder may be named twice.
				if fi, lerr := root.Lstat(name); !errors.Is(err, fs.ErrExist) || lerr != nil || !fi.IsDir() {
					return fmt.Errorf("%w: %s: %s: %v (a duplicate entry?)", ErrUnsafeArchive, archive, name, err)
				}
			}
		case tar.TypeReg, tar.TypeRegA:
			total += h.Size
			if h.Size < 0 || total > lim.Bytes {
				return fmt.Errorf("%w: %s unpacks to more than %d bytes", ErrUnsafeArchive, archive, lim.Bytes)
			}
			out, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode|0o600)
			if err != nil {
				return fmt.Errorf("extract %s: %s: %w (a duplicate entry?)", archive, name, err)
			}
			body := &readErr{r: io.LimitReader(tr, h.Size)}
			w, err := io.Copy(out, body)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if body.err != nil {
				return tarError(archive, kind, stream, n, body.err)
			}
			if err != nil || w != h.Size {
				return fmt.Errorf("extract %s: %s: %d of %d bytes: %v", archive, name, w, h.Size, err)
			}
			// The file keeps the archive's modification time, as tar
			// leaves it: a Python's bytecode (timestamp .pyc files) is
			// valid only for sources of the time it recorded, and a
			// runtime whose every source looks newer compiles its whole
			// standard library again on each start.
			if err := root.Chtimes(name, h.ModTime, h.ModTime); err != nil {
				return fmt.Errorf("extract %s: %s: %w", archive, name, err)
			}
			files[name] = true
		case tar.TypeSymlink:
			if err := linkTarget(name, h.Linkname); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrUnsafeArchive, archive, err)
			}
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("extract %s: %s: %w", archive, name, err)
			}
		case tar.TypeLink:
			target, err := entryName(h.Linkname)
			if err != nil || !files[target] {
				return fmt.Errorf("%w: %s: hard link %s -> %s is not to a file extracted before it", ErrUnsafeArchive, archive, name, h.Linkname)
			}
			if err := root.Link(target, name); err != nil {
				return fmt.Errorf("extract %s: %s: %w", archive, name, err)
			}
		case tar.TypeXGlobalHeader:
		default:
			return fmt.Errorf("%w: %s: %s is a %s, not a file, directory or link", ErrUnsafeArchive, archive, name, typeName(h.Typeflag))
		}
	}
	// The rest of the stream: its checksum is only checked at its end.
	if _, err := io.Copy(io.Discard, stream); err != nil {
		return tarError(archive, kind, stream, n, err)
	}
	return nil
}

// notArchive is what [ArchiveError] says of a file that is none of the
// formats [Extract] reads.
const notArchive = "not a gzip/xz/zstd tar archive"

// ArchiveError is [Extract]'s error for a file whose own bytes are at
// fault, not the disk: it is no gzip, xz or zstd compressed tar archive,
// or one that is damaged or cut short. Extracting it again cannot help.
type ArchiveError struct {
	// Archive names the file: its path, or the URL it came from.
	Archive string
	// Problem says what is wrong with it: "not a gzip/xz/zstd tar
	// archive (it is a zip archive)", "a damaged archive: its gzip
	// stream is cut short (a truncated download or copy?)".
	Problem string
	// Err is the decompressor's or the tar reader's error, if any.
	Err error
}

// Error is "ARCHIVE: PROBLEM", then the decompressor's or the tar
// reader's error when there is one.
func (e *ArchiveError) Error() string {
	if e.Err == nil {
		return e.Archive + ": " + e.Problem
	}
	return e.Archive + ": " + e.Problem + ": " + e.Err.Error()
}

// Unwrap returns the decompressor's or the tar reader's error.
func (e *ArchiveError) Unwrap() error { return e.Err }

// readErr remembers the first error but io.EOF that the reader it
// wraps returned: what the tar reader passes on is then told apart from
// what it finds itself, and what is read from what is written.
type readErr struct {
	r   io.Reader
	err error
}

// Read reads from the wrapped reader, keeping its first error.
func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}

// streamError is the error of archive whose kind (gzip, zstd, xz)
// stream the decompressor refused with err.
func streamError(archive, kind string, err error) error {
	var pe *fs.PathError
	switch {
	case errors.As(err, &pe):
		// Reading the file failed, not decoding it.
		return fmt.Errorf("extract %s: %w", archive, err)
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return &ArchiveError{Archive: archive, Problem: fmt.Sprintf("a damaged archive: its %s stream is cut short (a truncated download or copy?)", kind), Err: err}
	}
	return &ArchiveError{Archive: archive, Problem: fmt.Sprintf("a damaged archive: its %s stream is corrupt", kind), Err: err}
}

// tarError is the error of archive whose tar, read through stream (the
// kind decompressor), failed with err after entries entries.
func tarError(archive, kind string, stream *readErr, entries int, err error) error {
	switch {
	case stream.err != nil:
		return streamError(archive, kind, stream.err)
	case entries == 0 && errors.Is(err, tar.ErrHeader):
		return &ArchiveError{Archive: archive, Problem: fmt.Sprintf("%s: its %s stream holds no tar archive", notArchive, kind), Err: err}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &ArchiveError{Archive: archive, Problem: fmt.Sprintf("a damaged archive: the tar archive in its %s stream is cut short", kind), Err: err}
	}
	return &ArchiveError{Archive: archive, Problem: fmt.Sprintf("a damaged archive: the tar archive in its %s stream is corrupt", kind), Err: err}
}

// looksLike says what a file beginning with head seems to be, for a
// message, when it is no archive [Extract] reads: "" when unsure.
func looksLike(head []byte) string {
	switch {
	case len(head) == 0:
		return " (it is empty)"
	case bytes.HasPrefix(head, []byte("PK\x03\x04")):
		return " (it is a zip archive)"
	case bytes.HasPrefix(head, []byte("BZh")):
		return " (it is bzip2 compressed)"
	case len(head) >= 262 && string(head[257:262]) == "ustar":
		return " (it is an uncompressed tar: compress it with gzip, xz or zstd)"
	case isText(head):
		if t := bytes.ToLower(bytes.TrimSpace(head)); bytes.HasPrefix(t, []byte("<!doctype html")) || bytes.HasPrefix(t, []byte("<html")) {
			return " (it is an HTML page)"
		}
		return " (it is text)"
	}
	return ""
}

// isText reports whether b has no control character but line breaks
// and tabs: 512 random bytes have some.
func isText(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\n' && c != '\r' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// entryName cleans an archive name: relative, no "..", no empty or odd
// element. "./python/bin" is "python/bin".
func entryName(n string) (string, error) {
	if strings.HasPrefix(n, "/") || strings.Contains(n, "\\") {
		return "", fmt.Errorf("%q is absolute or uses backslashes", n)
	}
	n = strings.TrimSuffix(strings.TrimPrefix(n, "./"), "/")
	if n == "" || n == "." {
		return ".", nil
	}
	if !fs.ValidPath(n) || len(n) > 4096 {
		return "", fmt.Errorf("%q is not a safe relative name", n)
	}
	return n, nil
}

// linkTarget checks that a symbolic link at name pointing at target
// stays inside the tree.
func linkTarget(name, target string) error {
	if target == "" || strings.HasPrefix(target, "/") || strings.Contains(target, "\\") {
		return fmt.Errorf("link %s -> %q points out of the tree", name, target)
	}
	// No "..": through another link (b -> .) a lexically inside target
	// can resolve outside.
	for _, el := range strings.Split(target, "/") {
		if el == ".." {
			return fmt.Errorf("link %s -> %q climbs with \"..\"", name, target)
		}
	}
	resolved := path.Join(path.Dir(name), target)
	if resolved == ".." || strings.HasPrefix(resolved, "../") || !fs.ValidPath(resolved) {
		return fmt.Errorf("link %s -> %q points out of the tree", name, target)
	}
	return nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "FIFO"
	}
	return fmt.Sprintf("entry of type %q", t)
}
