package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestIsJournalStream: a file is the journal's stream when its device
// and inode (fstat) are the ones JOURNAL_STREAM names, in decimal, and
// only then.
func TestIsJournalStream(t *testing.T) {
	dir := t.TempDir()
	open := func(name string) *os.File {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	f, other := open("stream"), open("other")
	dev, ino := devIno(t, f.Name())
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	dup := os.NewFile(uintptr(fd), "dup")
	defer dup.Close()
	stream := fmt.Sprintf("%d:%d", dev, ino)
	for _, tt := range []struct {
		name   string
		f      *os.File
		stream string
		want   bool
	}{
		{"the stream itself", f, stream, true},
		{"a duplicate of it", dup, stream, true},
		{"another file", other, stream, false},
		{"another inode", f, fmt.Sprintf("%d:%d", dev, ino+1), false},
		{"another device", f, fmt.Sprintf("%d:%d", dev+1, ino), false},
		{"unset", f, "", false},
		{"no colon", f, fmt.Sprint(ino), false},
		{"not numbers", f, "dev:ino", false},
		{"a third part", f, stream + ":0", false},
		{"spaces", f, " " + stream, false},
		{"negative", f, fmt.Sprintf("-%d:%d", dev, ino), false},
	} {
		if got := isJournalStream(tt.f, tt.stream); got != tt.want {
			t.Errorf("%s: isJournalStream(%s, %q) = %v, want %v", tt.name, tt.f.Name(), tt.stream, got, tt.want)
		}
	}
}

// TestStderrIsTheJournalInAProcess: a process whose fd 2 is the stream
// JOURNAL_STREAM names (a file here, standing in for journald's socket)
// logs for the journal: its warning about METNOS_LOG is one line with
// the warn prefix and no time. With JOURNAL_STREAM naming another file,
// its stderr is slog's text, with the time.
func TestStderrIsTheJournalInAProcess(t *testing.T) {
	dir := t.TempDir()
	elsewhere := filepath.Join(dir, "elsewhere")
	if err := os.WriteFile(elsewhere, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, journal := range []bool{true, false} {
		stderr, err := os.CreateTemp(dir, "stderr")
		if err != nil {
			t.Fatal(err)
		}
		named := stderr.Name()
		if !journal {
			named = elsewhere
		}
		dev, ino := devIno(t, named)
		cmd := cliCommand(t, dir, []string{"METNOS_LOG=loud", fmt.Sprintf("JOURNAL_STREAM=%d:%d", dev, ino)}, "version")
		cmd.Stderr = stderr
		out, err := cmd.Output()
		stderr.Close()
		if err != nil || !strings.HasPrefix(string(out), "metnos-agent ") {
			t.Fatalf("version: %v, stdout %q", err, out)
		}
		b, err := os.ReadFile(stderr.Name())
		if err != nil {
			t.Fatal(err)
		}
		got := string(b)
		const msg = `level=WARN msg="METNOS_LOG=\"loud\" is not a level (debug, info, warn or error): info is used"` + "\n"
		want := "<4>" + msg
		if !journal {
			if !strings.HasPrefix(got, "time=") || !strings.HasSuffix(got, " "+msg) || strings.Count(got, "\n") != 1 {
				t.Errorf("stderr not the journal: %q, want slog's text line ending %q", got, msg)
			}
			continue
		}
		if got != want {
			t.Errorf("stderr the journal: %q, want %q", got, want)
		}
	}
}
