package chainlog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
func Verify(dir string) (Report, error) {
	var rep Report
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
	for i, name := range names {
		no := 0
		stop := errors.New("stop")
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
					return stop
				}
				if i == end {
					rep.Note = "the last line was cut short by a crash while writing; it is dropped when the log is next opened"
					return nil
				}
				rep.Problem, rep.File, rep.Line = "a line without its end, in the middle of the log: edited or cut", name, no
				return stop
			}
			var v struct {
				Seq  *int64  `json:"seq"`
				Prev *string `json:"prev"`
			}
			if json.Unmarshal(line, &v) != nil || v.Seq == nil || v.Prev == nil {
				rep.Problem, rep.File, rep.Line = "edited: not a line of this log (not JSON, or no seq and prev)", name, no
				return stop
			}
			switch {
			case *v.Seq == seq+1 && *v.Prev == prev:
			case *v.Seq == seq+1:
				// The number follows but the chain does not: the line
				// before was changed (or this one's prev was).
				if seq == 0 {
					rep.Problem, rep.File, rep.Line = "edited: the first line does not start the chain", name, no
				} else {
					rep.Problem, rep.File, rep.Line = fmt.Sprintf("edited: line %d (seq %d) no longer matches the hash the next line holds", prevNo, seq), prevFile, prevNo
				}
				return stop
			case *v.Seq > seq+1:
				rep.Problem, rep.File, rep.Line = fmt.Sprintf("removed: the lines numbered %d to %d before this one are missing", seq+1, *v.Seq-1), name, no
				gap.from, gap.to = seq+1, *v.Seq-1
				return nil
			default:
				rep.Problem, rep.File, rep.Line = fmt.Sprintf("reordered: seq %d comes after seq %d", *v.Seq, seq), name, no
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
	}
	if gap.found {
		rep.Problem = fmt.Sprintf("reordered: a line numbered between %d and %d is missing here and was found later, at %s", gap.from, gap.to, gap.at)
	}
	if !rep.OK() {
		return rep, nil
	}
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
