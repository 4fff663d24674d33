// Package chainlog keeps append-only logs of JSON lines in which every
// line carries the blake3 hash of the line before it, so that a line
// edited, removed or moved is found by [Verify].
//
// A log is a directory: its lines live in files named *.jsonl, read in
// the order of their names (one file for the history journal, one a day
// for the audit log), and the chain runs across the files. Each line is
// the caller's JSON object with two fields put first:
//
//	{"seq":7,"prev":"<64 hex: blake3 of line 6, without its newline>",...}
//
// A file HEAD beside them names the last line's number and hash, so
// that removing or editing the last lines is found too.
//
// What it guarantees: every [Log.Append] is written whole and fsynced
// before it returns; a line cut short by a crash is dropped when the
// log is next opened (it was never acknowledged); several processes may
// append to one log, one at a time under a lock file, each seeing the
// others' lines ([Options.Foreign]).
//
// What it does not: the chain has no secret, so whoever can write the
// files can also write a new, consistent chain; it makes tampering
// evident, not impossible. HEAD is renamed into place but not fsynced
// (it would cost one more fsync per line): after a power cut it may lag
// behind the log, which [Verify] accepts; a log without HEAD is
// reported, since removing the last lines and HEAD would otherwise go
// unseen.
package chainlog

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/zeebo/blake3"

	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/internal/term"
)

// Ext is the extension of a log's files.
const Ext = ".jsonl"

const (
	headName = "HEAD"
	lockName = "LOCK"
)

// zero is the prev of the first line.
var zero = strings.Repeat("0", 64)

// Options are a [Log]'s settings.
type Options struct {
	// Foreign, when set, is called with each line another process
	// appended since this one last looked, in order, before this
	// process appends its own.
	Foreign func(file string, line []byte)
}

// Log is an open log, for appending.
type Log struct {
	dir string
	opt Options

	mu   sync.Mutex
	file string // the file holding the last line seen
	size int64  // how much of it was seen
	seq  int64  // the last line's number (0: none yet)
	prev string // the last line's hash
}

// head is the content of HEAD.
type head struct {
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
	File string `json:"file"`
}

// Hash is the hash a line is chained by: blake3 of its bytes, without
// the newline, in hex.
func Hash(line []byte) string {
	sum := blake3.Sum256(bytes.TrimSuffix(line, []byte("\n")))
	return hex.EncodeToString(sum[:])
}

// Open opens the log in dir, creating dir (0700) when needed, and finds
// its last line. A line cut short at the end of the last file (a crash
// while appending) is removed.
func Open(dir string, opt Options) (*Log, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("opening the log %s: %w", dir, err)
	}
	lk, err := lockfile.LockWait(filepath.Join(dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("opening the log %s: %w", dir, err)
	}
	defer lk.Release()
	end, err := findEnd(dir)
	if err != nil {
		return nil, err
	}
	l := &Log{dir: dir, opt: opt, file: end.file, size: end.size, seq: end.seq, prev: end.prev}
	if end.file != "" && end.whole < end.size {
		if err := l.cutTorn(end.whole); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Check makes the checks [Open] makes before it appends (every line
// file a regular file, the last line a line of this log, a tail
// without a newline only the beginning of the next line), without
// creating, locking or changing anything: a dry run refuses what the
// real run would. A log that does not exist passes.
func Check(dir string) error {
	end, err := findEnd(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || end.file == "" || end.whole == end.size {
		return err
	}
	l := &Log{dir: dir, file: end.file, size: end.size, seq: end.seq, prev: end.prev}
	_, err = l.tornTail(end.whole)
	return err
}

// logEnd is where a log ends: the file holding its last line, that
// file's size and where its torn tail begins (the size when it has
// none), the last line's number and hash.
type logEnd struct {
	file        string
	size, whole int64
	seq         int64
	prev        string
}

// findEnd finds the end of the log in dir, reading only.
func findEnd(dir string) (logEnd, error) {
	end := logEnd{prev: zero}
	files, err := files(dir)
	if err != nil {
		return end, err
	}
	for i := len(files) - 1; i >= 0; i-- {
		path := filepath.Join(dir, files[i])
		last, size, whole, err := lastLine(path)
		if err != nil {
			return end, err
		}
		// The file that ends the log is the last, or the last with
		// bytes in it when later ones are empty (created, nothing
		// written yet): a torn tail there is the one to cut.
		if i == len(files)-1 || (end.size == 0 && size > 0) {
			end.file, end.size, end.whole = files[i], size, whole
		}
		if last != nil {
			if end.seq, err = seqOf(last); err != nil {
				return end, fmt.Errorf("%s: its last line is not a record of this log (%w; it begins %s): edited or damaged, not a crash; nothing was changed. %s", path, err, excerpt(last), advice(path))
			}
			end.prev = Hash(last)
			break
		}
	}
	return end, nil
}

// advice says what to do about a log file whose end is not what this
// log writes.
func advice(path string) string {
	return fmt.Sprintf("To keep its records, cut %s after its last good line (or restore it from a backup); to start anew, move it away", filepath.Base(path))
}

// excerpt shows the beginning of bytes that are not a line of the log,
// short and safe to print: `"garbage"`, `"\x00\x1b[2J…"`.
func excerpt(b []byte) string {
	const show = 24 // characters printed, an escape counting for its length
	var out strings.Builder
	for i := 0; i < len(b); {
		_, n := utf8.DecodeRune(b[i:])
		s := term.Sanitize(string(b[i : i+n]))
		if out.Len()+len(s) > show {
			out.WriteString("…")
			break
		}
		out.WriteString(s)
		i += n
	}
	return `"` + out.String() + `"`
}

// cutTorn removes the end of the last file from whole on: a line a
// crash cut short while it was appended, which must be the beginning
// of the line that would have come next. Anything else there (bytes
// that no append writes) is tampering or damage, and is refused, the
// file left as it is. The lock is held.
func (l *Log) cutTorn(whole int64) error {
	path, err := l.tornTail(whole)
	if err != nil {
		return err
	}
	if err := os.Truncate(path, whole); err != nil {
		return fmt.Errorf("removing a line cut short at the end of %s: %w", path, err)
	}
	l.size = whole
	return nil
}

// tornTail checks that the end of the last file from whole on is a
// line a crash cut short (see cutTorn), and returns the file's path.
func (l *Log) tornTail(whole int64) (string, error) {
	path := filepath.Join(l.dir, l.file)
	n := l.size - whole
	if n > maxLine {
		return path, fmt.Errorf("%s ends in %d bytes without a newline, more than a line of this log: edited or damaged, not a crash; nothing was changed. %s", path, n, advice(path))
	}
	f, err := os.Open(path)
	if err != nil {
		return path, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	tail := make([]byte, n)
	if _, err := f.ReadAt(tail, whole); err != nil {
		return path, fmt.Errorf("reading %s: %w", path, err)
	}
	if !Torn(tail, l.seq+1, l.prev) {
		return path, fmt.Errorf("%s ends in %d bytes that are not a record of this log (they begin %s): edited or damaged, not a crash; nothing was changed. %s", path, n, excerpt(tail), advice(path))
	}
	return path, nil
}

// Torn reports whether tail, the end of a log file after its last
// newline, is what a crash while appending leaves: the beginning of
// the line numbered seq, chained to the line whose hash is prev (its
// {"seq":…,"prev":"…" as far as it goes, then JSON cut short), never
// anything else.
func Torn(tail []byte, seq int64, prev string) bool {
	head := []byte(fmt.Sprintf(`{"seq":%d,"prev":"%s"`, seq, prev))
	if n := min(len(tail), len(head)); !bytes.Equal(tail[:n], head[:n]) {
		return false
	}
	if len(tail) <= len(head) {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(tail))
	var v json.RawMessage
	err := dec.Decode(&v)
	return errors.Is(err, io.ErrUnexpectedEOF) || (err == nil && dec.InputOffset() == int64(len(tail)))
}

// Close releases the log. Appending after Close is not allowed.
func (l *Log) Close() error { return nil }

// Seq is the number of the last line written or seen.
func (l *Log) Seq() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// End is the file holding the last line written or seen, and how many
// bytes of it were: a caller rolls to a new file when it has grown
// enough.
func (l *Log) End() (file string, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.file, l.size
}

// Append writes rec, which must marshal to a JSON object, as the next
// line, in file (a name ending in [Ext], inside the log's directory),
// and returns its number. It returns once the line is on disk.
func (l *Log) Append(file string, rec any) (int64, error) {
	seq, _, err := l.AppendFunc(func(string, int64) (string, any) { return file, rec })
	return seq, err
}

// AppendFunc is [Log.Append] with the file and the record chosen by
// next once the lock is held and the lines other processes appended
// are read: next is given the file holding the last line ("" when
// there is none) and its size, so that a caller can start a new file
// when that one has grown enough, or write a record that depends on
// the file. It returns the line's number and its file.
func (l *Log) AppendFunc(next func(last string, size int64) (file string, rec any)) (int64, string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lk, err := lockfile.LockWait(filepath.Join(l.dir, lockName))
	if err != nil {
		return 0, "", fmt.Errorf("log %s: %w", l.dir, err)
	}
	defer lk.Release()
	if err := l.catchUp(); err != nil {
		return 0, "", err
	}
	file, rec := next(l.file, l.size)
	if filepath.Base(file) != file || !strings.HasSuffix(file, Ext) {
		return 0, "", fmt.Errorf("log %s: %q is not a file name ending in %s", l.dir, file, Ext)
	}
	body, err := json.Marshal(rec)
	if err != nil || len(body) < 2 || body[0] != '{' {
		return 0, "", fmt.Errorf("log %s: a record must be a JSON object (%v)", l.dir, err)
	}
	var own struct{ Seq, Prev json.RawMessage }
	if json.Unmarshal(body, &own) != nil || own.Seq != nil || own.Prev != nil {
		return 0, "", fmt.Errorf("log %s: a record may not have its own seq or prev field: the chain puts them there", l.dir)
	}
	if file < l.file {
		return 0, "", fmt.Errorf("log %s: %s would come before %s, which already has lines", l.dir, file, l.file)
	}
	seq := l.seq + 1
	var line bytes.Buffer
	fmt.Fprintf(&line, `{"seq":%d,"prev":"%s"`, seq, l.prev)
	if len(body) > 2 {
		line.WriteByte(',')
		line.Write(body[1 : len(body)-1])
	}
	line.WriteString("}\n")

	path := filepath.Join(l.dir, file)
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return 0, "", fmt.Errorf("log %s: %w", l.dir, err)
	}
	n, err := f.Write(line.Bytes())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// Take back what was written, so the next line does not follow
		// half a line; a crash here leaves a torn tail Open removes.
		if n > 0 {
			if fi, serr := os.Stat(path); serr == nil {
				os.Truncate(path, fi.Size()-int64(n))
			}
		}
		return 0, "", fmt.Errorf("log %s: appending to %s: %w", l.dir, file, err)
	}
	if errors.Is(statErr, os.ErrNotExist) {
		atomicfile.SyncDir(l.dir)
	}
	if file != l.file {
		l.file, l.size = file, 0
	}
	l.size += int64(line.Len())
	l.seq, l.prev = seq, Hash(line.Bytes())
	h, _ := json.Marshal(head{Seq: l.seq, Hash: l.prev, File: l.file})
	tmp := filepath.Join(l.dir, headName+".tmp")
	if err := os.WriteFile(tmp, h, 0o600); err == nil {
		os.Rename(tmp, filepath.Join(l.dir, headName))
	}
	return seq, file, nil
}

// DropBefore removes the log's files that come before file, which must
// be one of its files and not after the one holding the last line: old
// history removed whole files at a time. First it records in START the
// number and hash of the line before file's first line (so that
// [Verify] still checks that every line kept follows it: the lines kept
// cannot be edited or removed unseen), with note, the caller's account
// of what was removed (a JSON value; see [Pruned]); then it removes the
// files. A crash between the two leaves files that Verify passes over
// and the next DropBefore removes.
func (l *Log) DropBefore(file string, note any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	lk, err := lockfile.LockWait(filepath.Join(l.dir, lockName))
	if err != nil {
		return fmt.Errorf("log %s: %w", l.dir, err)
	}
	defer lk.Release()
	if err := l.catchUp(); err != nil {
		return err
	}
	names, err := l.files()
	if err != nil {
		return err
	}
	if !slices.Contains(names, file) || file > l.file {
		return fmt.Errorf("log %s: %s is not a file of the log up to its last line: nothing removed", l.dir, file)
	}
	var first []byte
	stop := errors.New("stop")
	err = readFile(filepath.Join(l.dir, file), func(line []byte, complete bool) error {
		if complete {
			first = line
		}
		return stop
	})
	if err != nil && err != stop {
		return fmt.Errorf("log %s: %w", l.dir, err)
	}
	var v struct {
		Seq  int64  `json:"seq"`
		Prev string `json:"prev"`
	}
	if first == nil || json.Unmarshal(first, &v) != nil || v.Seq <= 1 {
		return fmt.Errorf("log %s: the first line of %s is not a record that follows others: nothing removed", l.dir, file)
	}
	n, err := json.Marshal(note)
	if err != nil {
		return fmt.Errorf("log %s: %w", l.dir, err)
	}
	b, _ := json.Marshal(start{Seq: v.Seq - 1, Hash: v.Prev, File: file, Note: n})
	if err := atomicfile.WriteFile(filepath.Join(l.dir, startName), b, 0o600); err != nil {
		return fmt.Errorf("log %s: recording where it starts: %w", l.dir, err)
	}
	for _, name := range names {
		if name >= file {
			break
		}
		if err := os.Remove(filepath.Join(l.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("log %s: removing %s: %w", l.dir, name, err)
		}
	}
	atomicfile.SyncDir(l.dir)
	return nil
}

// catchUp reads the lines other processes appended since this one last
// looked, passing them to Options.Foreign. The lock is held.
func (l *Log) catchUp() error {
	files, err := l.files()
	if err != nil {
		return err
	}
	for _, name := range files {
		if name < l.file {
			continue
		}
		from := int64(0)
		if name == l.file {
			from = l.size
		}
		path := filepath.Join(l.dir, name)
		fi, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("log %s: %w", l.dir, err)
		}
		if fi.Size() == from {
			continue
		}
		if fi.Size() < from {
			return fmt.Errorf("log %s: %s is shorter than when this process last wrote it (%d < %d bytes): something removed lines", l.dir, path, fi.Size(), from)
		}
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("log %s: %w", l.dir, err)
		}
		data := make([]byte, fi.Size()-from)
		_, err = f.ReadAt(data, from)
		f.Close()
		if err != nil {
			return fmt.Errorf("log %s: reading %s: %w", l.dir, path, err)
		}
		end := bytes.LastIndexByte(data, '\n') + 1
		lines := bytes.SplitAfter(data[:end], []byte("\n"))
		if end < len(data) {
			// Another process died mid-line: drop the torn tail, if it
			// is one.
			seq, prev := l.seq, l.prev
			if end > 0 {
				last := lines[len(lines)-2] // the one before the empty rest
				if seq, err = seqOf(last); err != nil {
					return fmt.Errorf("log %s: a line another process wrote in %s is not a record of this log (%w; it begins %s)", l.dir, path, err, excerpt(last))
				}
				prev = Hash(last)
			}
			if !Torn(data[end:], seq+1, prev) {
				return fmt.Errorf("%s ends in %d bytes that are not a record of this log (they begin %s): edited or damaged, not a crash; nothing was changed. %s", path, len(data)-end, excerpt(data[end:]), advice(path))
			}
			if err := os.Truncate(path, from+int64(end)); err != nil {
				return fmt.Errorf("log %s: removing a line cut short in %s: %w", l.dir, path, err)
			}
		}
		for _, line := range lines {
			if len(line) == 0 {
				continue
			}
			seq, err := seqOf(line)
			if err != nil {
				return fmt.Errorf("log %s: a line another process wrote in %s is not a record of this log (%w; it begins %s)", l.dir, path, err, excerpt(line))
			}
			l.seq, l.prev = seq, Hash(line)
			if l.opt.Foreign != nil {
				l.opt.Foreign(name, bytes.TrimSuffix(line, []byte("\n")))
			}
		}
		l.file, l.size = name, from+int64(end)
	}
	return nil
}

// files lists the log's files in order.
func (l *Log) files() ([]string, error) { return files(l.dir) }

func files(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) && pe.Path == dir {
		err = pe.Err // named once, below
	}
	switch {
	case errors.Is(err, syscall.ENOTDIR):
		return nil, fmt.Errorf("reading the log %s: %w: a file is where that folder, or one above it, should be; move that file away", dir, err)
	case err != nil:
		return nil, fmt.Errorf("reading the log %s: %w", dir, err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), Ext) {
			continue
		}
		if !e.Type().IsRegular() {
			what := "not a regular file"
			switch {
			case e.IsDir():
				what = "a folder, not a file"
			case e.Type()&fs.ModeSymlink != 0:
				what = "a symbolic link, not a file"
			}
			p := filepath.Join(dir, e.Name())
			return nil, fmt.Errorf("%s is %s, so the log's records there cannot be read; nothing was changed. Move it away, and put the log file back from a backup if you have one", p, what)
		}
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, nil
}

// lastLine returns the last complete line of the file at path (nil when
// it has none), the file's size, and where a torn tail begins (the
// size when there is none).
func lastLine(path string) (line []byte, size, whole int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, 0, err
	}
	size = fi.Size()
	// Read backwards, in growing chunks, until the last newline (end)
	// and the one before it are both in buf, which holds file[from:].
	var buf []byte
	from, end, chunk := size, int64(-1), int64(8<<10)
	for {
		n := min(chunk, from)
		from -= n
		more := make([]byte, n, n+int64(len(buf)))
		if _, err := f.ReadAt(more, from); err != nil && err != io.EOF {
			return nil, 0, 0, fmt.Errorf("reading %s: %w", path, err)
		}
		buf = append(more, buf...)
		if end < 0 {
			if i := bytes.LastIndexByte(buf, '\n'); i >= 0 {
				end = from + int64(i)
			}
		}
		if end >= 0 {
			start := bytes.LastIndexByte(buf[:end-from], '\n')
			if start >= 0 || from == 0 {
				line = buf[start+1 : end-from]
				break
			}
		}
		if from == 0 {
			break
		}
		chunk *= 2
	}
	return line, size, end + 1, nil
}

// seqOf reads a line's number.
func seqOf(line []byte) (int64, error) {
	var v struct {
		Seq *int64 `json:"seq"`
	}
	if err := json.Unmarshal(line, &v); err != nil || v.Seq == nil {
		return 0, errors.New(`not JSON with a "seq" field`)
	}
	return *v.Seq, nil
}
