package cli

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
)

// The agent's log file, client.log in the data directory, is opened by
// "run" and "demo" only, so its rotation lives here rather than in a
// package of its own.

// maxLogBytes is the size above which the log is rotated, at start and
// while running.
const maxLogBytes = 5 << 20

// maxTorn bounds the torn last line openLog removes: a JSON line of the
// log is far shorter; more bytes without a newline are not one.
const maxTorn = 1 << 20

// logFile is the log file, rotated to path.1 (one old log kept, as the
// Rust client does) before a line would take it past limit. Each Write
// is one line of the JSON handler and goes whole into one file: a line
// is never split between the two. It is safe for concurrent use.
type logFile struct {
	path  string
	limit int64
	// warn is where a failed rotation is said, once.
	warn io.Writer

	mu     sync.Mutex
	f      *os.File
	size   int64
	retry  int64 // when rotating failed: the size at which to try again
	warned bool
	closed bool
}

// openLog opens path for appending, first renaming it to path.1 when it
// is over maxLogBytes. A last line a crash cut short (no newline at the
// end) is removed when it is the beginning of a JSON line, as the log
// writes, or else ended with a newline, so that the next line starts on
// a line of its own. A rotation that fails later, while running, is
// said once on warn and the log goes on in the same file.
func openLog(path string, warn io.Writer) (*logFile, error) {
	return openLogLimit(path, maxLogBytes, warn)
}

func openLogLimit(path string, limit int64, warn io.Writer) (*logFile, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > limit {
		if err := os.Rename(path, path+".1"); err != nil {
			return nil, fmt.Errorf("rotating the log %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating the folder of the log %s: %w", path, err)
	}
	f, size, err := openLogFile(path, warn)
	if err != nil {
		return nil, err
	}
	return &logFile{path: path, limit: limit, warn: warn, f: f, size: size}, nil
}

// openLogFile opens path for appending, mends a torn last line (see
// openLog) and returns the file and its size. A tail it cannot mend (a
// full disk) is said on warn, and the log is opened all the same: the
// agent runs without its log rather than not at all.
func openLogFile(path string, warn io.Writer) (*os.File, int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("opening the log %s: %w", path, err)
	}
	size, err := mendTail(f)
	if err != nil {
		fmt.Fprintf(warn, "metnos-agent: the log %s ends in a line cut short, which could not be mended (%v): the next line may follow it on the same line\n", path, err)
		fi, serr := f.Stat()
		if serr != nil {
			f.Close()
			return nil, 0, fmt.Errorf("opening the log %s: %w", path, serr)
		}
		size = fi.Size()
	}
	return f, size, nil
}

// mendTail removes or ends a torn last line of f, and returns f's size
// after.
func mendTail(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if size == 0 {
		return 0, nil
	}
	n := min(size, maxTorn+1)
	tail := make([]byte, n)
	if _, err := f.ReadAt(tail, size-n); err != nil {
		return 0, err
	}
	if tail[n-1] == '\n' {
		return size, nil
	}
	i := bytes.LastIndexByte(tail, '\n') + 1
	if (i > 0 || n == size) && tail[i] == '{' {
		// The beginning of a line the JSON handler was writing: never
		// finished, and not JSON, so a reader of the log would stop at
		// it.
		cut := size - n + int64(i)
		if err := f.Truncate(cut); err != nil {
			return 0, err
		}
		return cut, nil
	}
	// Not a line of this log: keep it, on a line of its own.
	if _, err := f.Write([]byte("\n")); err != nil {
		return 0, err
	}
	return size + 1, nil
}

// Write writes p, one line, rotating the log first when p would take it
// past the limit.
func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, fmt.Errorf("writing the log %s: %w", l.path, os.ErrClosed)
	}
	if l.f != nil && l.size > 0 && l.size+int64(len(p)) > l.limit && l.size >= l.retry {
		l.rotate()
	}
	if l.f == nil {
		// Reopening after a rotation failed: try again at each line.
		f, size, err := openLogFile(l.path, l.warn)
		if err != nil {
			return 0, err
		}
		l.f, l.size = f, size
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

// rotate renames the log to path.1 and goes on in a new file. When that
// fails, it says so once and goes on in the file it had, trying again
// when another limit's worth has been written. The file is closed
// before it is renamed, which Windows needs. l.mu is held.
func (l *logFile) rotate() {
	l.f.Close()
	l.f = nil
	name := l.path
	err := os.Rename(l.path, l.path+".1")
	if err == nil {
		f, size, oerr := openLogFile(l.path, l.warn)
		if oerr == nil {
			l.f, l.size, l.retry = f, size, 0
			return
		}
		err, name = oerr, l.path+".1"
	}
	l.retry = l.size + l.limit
	if !l.warned {
		l.warned = true
		fmt.Fprintf(l.warn, "metnos-agent: could not rotate the log %s (%v): it goes on growing in the file it has; check the permissions and free space of its folder\n", l.path, err)
	}
	if f, size, err := openLogFile(name, l.warn); err == nil {
		l.f, l.size = f, size
	}
}

// Close closes the log file.
func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// newLogger logs to file as JSON lines and to stderr as text (written
// for the journal when stderr is the journal), both at level and above.
func newLogger(file io.Writer, stderr stderrLog, level slog.Level) *slog.Logger {
	return slog.New(slog.NewMultiHandler(slog.NewJSONHandler(file, &slog.HandlerOptions{Level: level}), stderr.handler(level)))
}
