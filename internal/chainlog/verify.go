package chainlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// maxLine bounds one line when reading (a history record of a very
// large change is a few MiB).
const maxLine = 256 << 20

// Read calls fn with every complete line of the log in dir, in order,
// without its newline and without checking the chain. A log that does
// not exist has no lines. A line cut short at the very end is skipped.
func Read(dir string, fn func(file string, line []byte) error) error {
	names, err := files(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := readFile(filepath.Join(dir, name), func(line []byte, complete bool) error {
			if !complete {
				return nil
			}
			return fn(name, line)
		}); err != nil {
			return err
		}
	}
	return nil
}

// ReadFile calls fn with every complete line of the log file name in
// dir, in order, without its newline, without checking the chain.
func ReadFile(dir, name string, fn func(line []byte) error) error {
	return readFile(filepath.Join(dir, name), func(line []byte, complete bool) error {
		if !complete {
			return nil
		}
		return fn(line)
	})
}

// ReadBack calls fn with the complete lines of the log in dir, newest
// first (the last file's from its end, then the file before...),
// without their newlines and without checking the chain, until fn
// returns false or an error, or the first line was passed. A line cut
// short at the very end is skipped. Reading the newest lines costs
// what they weigh, not what the whole log does.
func ReadBack(dir string, fn func(file string, line []byte) (bool, error)) error {
	names, err := files(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for i := len(names) - 1; i >= 0; i-- {
		more, err := readBack(filepath.Join(dir, names[i]), func(line []byte) (bool, error) { return fn(names[i], line) })
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// readBack calls fn with the complete lines of the file at path, last
// first; it returns false when fn did.
func readBack(path string, fn func(line []byte) (bool, error)) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("reading the log file %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("reading the log file %s: %w", path, err)
	}
	// The newest lines are often all a caller wants: read a little
	// first, then more and more.
	chunk := int64(8 << 10)
	end := fi.Size() // file[from:end] is in buf
	var buf []byte
	first := true // the end of the file: a tail without a newline is torn
	for from := end; ; chunk = min(chunk*2, 1<<20) {
		n := min(chunk, from)
		from -= n
		more := make([]byte, n, n+int64(len(buf)))
		if _, err := f.ReadAt(more, from); err != nil && err != io.EOF {
			return false, fmt.Errorf("reading the log file %s: %w", path, err)
		}
		buf = append(more, buf...)
		if first {
			i := bytes.LastIndexByte(buf, '\n')
			if i < 0 && from > 0 {
				continue
			}
			buf, first = buf[:i+1], false
		}
		// Every line after the first newline in buf is whole (at the
		// start of the file, the first one is too).
		for len(buf) > 0 {
			body := buf[:len(buf)-1] // without the newline
			i := bytes.LastIndexByte(body, '\n')
			if i < 0 && from > 0 {
				break
			}
			if len(buf)-i > maxLine {
				return false, fmt.Errorf("reading the log file %s: a line longer than %d bytes", path, maxLine)
			}
			ok, err := fn(body[i+1:])
			if err != nil || !ok {
				return false, err
			}
			buf = buf[:i+1]
		}
		if from == 0 {
			return true, nil
		}
	}
}

// readFile calls fn with each line of path; complete is false for a
// last line without its newline.
func readFile(path string, fn func(line []byte, complete bool) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading the log file %s: %w", path, err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line: gather it whole.
			buf := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) && len(buf) < maxLine {
				line, err = r.ReadSlice('\n')
				buf = append(buf, line...)
			}
			line = buf
		}
		switch {
		case err == nil:
			if ferr := fn(line[:len(line)-1], true); ferr != nil {
				return ferr
			}
		case errors.Is(err, io.EOF):
			if len(line) > 0 {
				return fn(line, false)
			}
			return nil
		default:
			return fmt.Errorf("reading the log file %s: %w", path, err)
		}
	}
}

// Report is what [Verify] found.
type Report struct {
	// Files and Lines count what was read.
	Files int
	Lines int64
	// Problem, when not empty, says what is wrong, at File (a file name
	// of the log) and Line (its 1-based line number in that file).
	Problem string
	File    string
	Line    int
	// Note is something worth saying that is not tampering, such as a
	// line cut short by a crash at the very end.
	Note string
	// Good is, when there is a Problem, the number of the last line the
	// chain still vouches for: every line up to it is as written (0:
	// none is). A reader trusts the records numbered up to Good only.
	Good int64
}

// OK reports whether the log verified.
func (r Report) OK() bool { return r.Problem == "" }

func (r Report) String() string {
	if r.OK() {
		s := fmt.Sprintf("intact: %d %s in %d %s", r.Lines, plural(r.Lines, "line"), r.Files, plural(int64(r.Files), "file"))
		if r.Note != "" {
			s += " (" + r.Note + ")"
		}
		return s
	}
	switch {
	case r.File != "" && r.Line > 0:
		return fmt.Sprintf("%s line %d: %s", r.File, r.Line, r.Problem)
	case r.File != "":
		return fmt.Sprintf("%s: %s", r.File, r.Problem)
	}
	return r.Problem
}

// Gone reports whether the log in dir lost its files: it has none,
// while its HEAD says lines were written (the files were deleted or
// moved). It returns the number of the last line HEAD names and the
// file that held it; 0 when the log is not gone.
func Gone(dir string) (seq int64, file string, err error) {
	names, err := files(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, "", nil
	}
	if err != nil || len(names) > 0 {
		return 0, "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, headName))
	if errors.Is(err, os.ErrNotExist) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("reading %s: %w", filepath.Join(dir, headName), err)
	}
	var h head
	if json.Unmarshal(b, &h) != nil || h.Seq <= 0 {
		return 0, "", nil // Verify reports a HEAD that is not this log's
	}
	return h.Seq, h.File, nil
}

// Verify reads the whole log in dir and reports the first line that was
// edited, removed or moved: the first place where a line's prev is not
// the hash of the line before it, its number does not follow, or the
// end does not match HEAD. An error means the log could not be read.
func Verify(dir string) (rep Report, err error) { return verify(dir, false) }

// VerifyQuick is [Verify] that does not read again a file (other than
// the last) it verified before and that is the same file, unchanged
// since: same inode, size, and modification and change times (an edit
// changes the change time, which cannot be set back without changing
// the system's clock), holding the lines that follow the ones before
// it. What it verified it notes in a file VERIFIED beside the log's,
// when it can write there. It makes checking a long log cost what its
// newest file does; [Verify] reads every line, for when the log must
// be checked whole (audit verify, before a local undo).
func VerifyQuick(dir string) (Report, error) { return verify(dir, true) }

func verify(dir string, quick bool) (rep Report, err error) {
	names, err := files(dir)
	if err != nil {
		return rep, err
	}
	rep.Files = len(names)
	// HEAD is read first: a line appended while the files are read only
	// puts the log ahead of it, which is accepted.
	headBytes, headErr := os.ReadFile(filepath.Join(dir, headName))
	prev, seq := zero, int64(0)
	var prevFile string
	var prevNo int
	// A log whose oldest files were removed ([Log.DropBefore]) starts
	// where START says: its first line follows the last one removed.
	st, pruned, err := readStart(dir)
	if err != nil {
		rep.Problem, rep.File = err.Error(), startName
		return rep, nil
	}
	if pruned {
		prev, seq = st.Hash, st.Seq
		kept := names[:0:0]
		for _, n := range names {
			if n >= st.File {
				kept = append(kept, n) // a file before it is one a crash left while removing them
			}
		}
		names = kept
		rep.Files = len(names)
	}
	// After a gap in the numbers, the rest is only searched for the
	// missing ones: found later means moved, not removed.
	var gap struct {
		from, to int64
		found    bool
		at       string
	}
	// The file that ends the log: the last, or the last with bytes in
	// it when later ones are empty (as Open sees it).
	end := len(names) - 1
	for end > 0 {
		if fi, err := os.Stat(filepath.Join(dir, names[end])); err != nil || fi.Size() > 0 {
			break
		}
		end--
	}
	var seen verified
	if quick {
		seen = readVerified(dir)
		for name := range seen {
			if !slices.Contains(names, name) {
				delete(seen, name) // pruned
			}
		}
		defer func() { writeVerified(dir, seen) }()
	}
	for i, name := range names {
		no := 0
		stop := errors.New("stop")
		var key string
		if quick && i < len(names)-1 && gap.to == 0 {
			key = fileKey(filepath.Join(dir, name))
			if v, ok := seen[name]; ok && key != "" && v.Key == key && v.FromSeq == seq && v.FromHash == prev {
				seq, prev, rep.Lines = v.Seq, v.Hash, rep.Lines+v.Lines
				prevFile, prevNo = name, v.No
				continue
			}
			delete(seen, name)
		}
		fromSeq, fromHash, fromLines := seq, prev, rep.Lines
		err := readFile(filepath.Join(dir, name), func(line []byte, complete bool) error {
			no++
			if gap.to > 0 {
				var v struct {
					Seq int64 `json:"seq"`
				}
				if json.Unmarshal(line, &v) == nil && v.Seq >= gap.from && v.Seq <= gap.to {
					gap.found, gap.at = true, fmt.Sprintf("%s line %d", name, no)
					return stop
				}
				return nil
			}
			if !complete {
				if i == end && !Torn(line, seq+1, prev) {
					rep.Problem, rep.File, rep.Line = "edited: the last line has no end and is not the beginning of the line that would come next (a crash while writing leaves only that)", name, no
					rep.Good = -1 // the end of the log is not known: nothing is vouched for
					return stop
				}
				if i == end {
					rep.Note = "the last line was cut short by a crash while writing; it is dropped when the log is next opened"
					return nil
				}
				rep.Problem, rep.File, rep.Line = "a line without its end, in the middle of the log: edited or cut", name, no
				rep.Good = seq
				return stop
			}
			v, ok := chainHead(line)
			if !ok {
				rep.Problem, rep.File, rep.Line = "edited: not a line of this log (not JSON, or no seq and prev)", name, no
				rep.Good = seq
				return stop
			}
			switch {
			case *v.Seq == seq+1 && *v.Prev == prev:
			case *v.Seq == seq+1:
				// The number follows but the chain does not: the line
				// before was changed (or this one's prev was).
				rep.Good = max(seq-1, 0)
				if prevFile == "" && pruned {
					rep.Problem, rep.File, rep.Line = "edited: the first line does not follow the last line removed when the log was pruned (as START records)", name, no
				} else if prevFile == "" {
					rep.Problem, rep.File, rep.Line = "edited: the first line does not start the chain", name, no
				} else {
					rep.Problem, rep.File, rep.Line = fmt.Sprintf("edited: line %d (seq %d) no longer matches the hash the next line holds", prevNo, seq), prevFile, prevNo
				}
				return stop
			case *v.Seq > seq+1:
				rep.Problem, rep.File, rep.Line = fmt.Sprintf("removed: the lines numbered %d to %d before this one are missing", seq+1, *v.Seq-1), name, no
				gap.from, gap.to = seq+1, *v.Seq-1
				rep.Good = seq
				return nil
			default:
				rep.Problem, rep.File, rep.Line = fmt.Sprintf("reordered: seq %d comes after seq %d", *v.Seq, seq), name, no
				rep.Good = seq
				return stop
			}
			seq, prev = *v.Seq, Hash(line)
			prevFile, prevNo = name, no
			rep.Lines++
			return nil
		})
		if err == stop {
			break
		}
		if err != nil {
			return rep, err
		}
		if key != "" && rep.OK() && key == fileKey(filepath.Join(dir, name)) {
			seen[name] = verifiedFile{Key: key, FromSeq: fromSeq, FromHash: fromHash, Seq: seq, Hash: prev, Lines: rep.Lines - fromLines, No: prevNo}
		}
	}
	if gap.found {
		rep.Problem = fmt.Sprintf("reordered: a line numbered between %d and %d is missing here and was found later, at %s", gap.from, gap.to, gap.at)
	}
	if !rep.OK() {
		rep.Good = max(rep.Good, 0)
		return rep, nil
	}
	// A problem at the end puts the last line in doubt.
	defer func() {
		if !rep.OK() {
			rep.Good = max(seq-1, 0)
			if rep.File == headName || rep.Line == 0 {
				rep.Good = 0
			}
		}
	}()
	var h head
	b, err := headBytes, headErr
	switch {
	case errors.Is(err, os.ErrNotExist):
		if seq > 0 {
			// HEAD is written with every line: without it, lines at the
			// end may have been removed along with it.
			rep.Problem, rep.File, rep.Line = "the HEAD file is missing: the end of the log cannot be checked (lines removed at the end, with HEAD?)", prevFile, prevNo
		}
		return rep, nil
	case err != nil:
		return rep, fmt.Errorf("reading %s: %w", filepath.Join(dir, headName), err)
	case json.Unmarshal(b, &h) != nil:
		rep.Problem, rep.File = "the HEAD file is not what this log writes: edited", headName
		return rep, nil
	}
	switch {
	case len(names) == 0 && h.Seq > 0:
		rep.Problem, rep.File = fmt.Sprintf("removed: the file is missing, but HEAD says %d %s were written to it", h.Seq, plural(h.Seq, "line")), h.File
	case seq < h.Seq:
		rep.Problem, rep.File, rep.Line = fmt.Sprintf("removed: the log ends at seq %d, but lines up to %d were written", seq, h.Seq), prevFile, prevNo
	case seq == h.Seq && prev != h.Hash:
		rep.Problem, rep.File, rep.Line = "edited: the last line no longer matches the hash recorded when it was written", prevFile, prevNo
	case seq > h.Seq:
		rep.Note = fmt.Sprintf("HEAD lags behind the log (seq %d < %d), as after a power cut", h.Seq, seq)
	}
	return rep, nil
}

func plural(n int64, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// verifiedName is the file in which [VerifyQuick] notes what it
// verified.
const verifiedName = "VERIFIED"

// verified is what VERIFIED holds: by file name, a file verified whole.
type verified map[string]verifiedFile

type verifiedFile struct {
	Key      string `json:"key"` // fileKey when it was verified
	FromSeq  int64  `json:"from_seq"`
	FromHash string `json:"from_hash"` // the chain before its first line
	Seq      int64  `json:"seq"`
	Hash     string `json:"hash"` // its last line
	Lines    int64  `json:"lines"`
	No       int    `json:"no"` // its number of lines
}

func readVerified(dir string) verified {
	v := verified{}
	if b, err := os.ReadFile(filepath.Join(dir, verifiedName)); err == nil {
		json.Unmarshal(b, &v)
	}
	return v
}

// writeVerified notes what was verified, if it changed and the folder
// can be written; a failure is ignored (the next check reads all).
func writeVerified(dir string, v verified) {
	b, _ := json.Marshal(v)
	if old, err := os.ReadFile(filepath.Join(dir, verifiedName)); err == nil && bytes.Equal(old, b) {
		return
	}
	if len(v) == 0 {
		os.Remove(filepath.Join(dir, verifiedName))
		return
	}
	tmp := filepath.Join(dir, verifiedName+".tmp")
	if os.WriteFile(tmp, b, 0o600) == nil {
		os.Rename(tmp, filepath.Join(dir, verifiedName))
	}
}

// startName is the file that says where a pruned log starts.
const startName = "START"

// start is what START holds.
type start struct {
	// Seq and Hash are the number and hash of the last line removed:
	// the first line kept follows it.
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
	// File is the first file kept.
	File string `json:"file"`
	// Note is the caller's account of what was removed.
	Note json.RawMessage `json:"note,omitempty"`
}

// readStart reads START; pruned is false when there is none.
func readStart(dir string) (st start, pruned bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, startName))
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("reading %s: %w", filepath.Join(dir, startName), err)
	}
	if json.Unmarshal(b, &st) != nil || st.Seq <= 0 || len(st.Hash) != 64 || !strings.HasSuffix(st.File, Ext) {
		return st, false, errors.New("the START file is not what this log writes: edited")
	}
	return st, true, nil
}

// Pruned returns the note the last [Log.DropBefore] recorded (nil when
// the log was never pruned) and the number of the last line removed.
func Pruned(dir string) (note json.RawMessage, seq int64, err error) {
	st, pruned, err := readStart(dir)
	if err != nil || !pruned {
		return nil, 0, err
	}
	return st.Note, st.Seq, nil
}

// Files lists the log's files in order (none when dir does not exist).
func Files(dir string) ([]string, error) {
	names, err := files(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return names, err
}

// LastLine returns the last complete line of the log file name in dir
// (nil when it has none).
func LastLine(dir, name string) ([]byte, error) {
	line, _, _, err := lastLine(filepath.Join(dir, name))
	return line, err
}

// lineHead is the seq and prev of a line.
type lineHead struct {
	Seq  *int64  `json:"seq"`
	Prev *string `json:"prev"`
}

// chainHead reads the seq and prev a line starts with. Append writes
// them first, as {"seq":N,"prev":"<64 hex>",: that prefix is read
// without decoding the rest of the line into values, which keeps a
// check of a long log cheap; any other line is decoded whole. The rest
// is still checked to be JSON: past the line HEAD records, nothing else
// vouches for a line's bytes.
func chainHead(line []byte) (lineHead, bool) {
	const seqKey, prevKey = `{"seq":`, `,"prev":"`
	if rest, ok := bytes.CutPrefix(line, []byte(seqKey)); ok && json.Valid(line) {
		i := 0
		for i < len(rest) && i < 19 && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i > 0 && rest[0] != '0' {
			if after, ok := bytes.CutPrefix(rest[i:], []byte(prevKey)); ok && len(after) > 65 && after[64] == '"' && isHex(after[:64]) {
				n, err := strconv.ParseInt(string(rest[:i]), 10, 64)
				if err == nil {
					p := string(after[:64])
					return lineHead{Seq: &n, Prev: &p}, true
				}
			}
		}
	}
	var v lineHead
	if json.Unmarshal(line, &v) != nil || v.Seq == nil || v.Prev == nil {
		return v, false
	}
	return v, true
}

func isHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
