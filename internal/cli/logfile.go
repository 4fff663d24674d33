package cli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
)

// The agent's log file, client.log in the data directory, is opened by
// "run" and "demo" only, so its rotation lives here rather than in a
// package of its own.

// maxLogBytes is the size above which the log is rotated at start.
const maxLogBytes = 5 << 20

// openLog opens path for appending, first renaming it to path.1 when it
// is over maxLogBytes (one old log is kept, as the Rust client does).
// The log is rotated only here, at start: a long run may grow it past
// the limit.
func openLog(path string) (*os.File, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > maxLogBytes {
		if err := os.Rename(path, path+".1"); err != nil {
			return nil, fmt.Errorf("rotating the log %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating the folder of the log %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the log %s: %w", path, err)
	}
	return f, nil
}

// newLogger logs to file as JSON lines and to stderr as text, both at
// level and above.
func newLogger(file, stderr io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	return slog.New(slog.NewMultiHandler(slog.NewJSONHandler(file, opts), slog.NewTextHandler(stderr, opts)))
}
