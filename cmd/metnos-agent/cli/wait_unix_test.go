//go:build unix

package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/internal/lockfile"
)

// devIno is JOURNAL_STREAM's value for the file at path.
func devIno(t *testing.T, path string) (dev, ino uint64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return uint64(st.Dev), st.Ino
}

// TestRunWaitStopsOnASignal: a SIGTERM or SIGINT while `run --wait`
// waits for another agent ends it with exit 0, not 3 nor a death by the
// signal. Its stderr the journal (on Linux), what it logs is for the
// journal: info lines, without a time.
func TestRunWaitStopsOnASignal(t *testing.T) {
	for _, tt := range []struct {
		sig     syscall.Signal
		journal bool
	}{
		{syscall.SIGTERM, true},
		{syscall.SIGINT, false},
	} {
		t.Run(fmt.Sprintf("%v journal %v", tt.sig, tt.journal), func(t *testing.T) {
			if tt.journal && runtime.GOOS != "linux" {
				t.Skip("only Linux has the journal")
			}
			dir := t.TempDir()
			home := filepath.Join(dir, "home")
			os.Mkdir(home, 0o700)
			e, err := readEnvironment(func(k string) string { return map[string]string{"HOME": home, "PATH": "/usr/bin:/bin"}[k] })
			if err != nil {
				t.Fatal(err)
			}
			writePaired(t, e)
			held, err := lockfile.Lock(e.lay.Lock())
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()

			stderr, err := os.Create(filepath.Join(dir, "stderr"))
			if err != nil {
				t.Fatal(err)
			}
			defer stderr.Close()
			var env []string
			if tt.journal {
				dev, ino := devIno(t, stderr.Name())
				env = append(env, fmt.Sprintf("JOURNAL_STREAM=%d:%d", dev, ino))
			}
			cmd := cliCommand(t, home, env, "run", "--wait")
			cmd.Stderr = stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			defer cmd.Process.Kill()
			read := func() string { b, _ := os.ReadFile(stderr.Name()); return string(b) }

			waiting := fmt.Sprintf(`level=INFO msg="waiting for the agent in process %d to stop; it takes over then" lock=%s pid=%d`, os.Getpid(), e.lay.Lock(), os.Getpid())
			if !eventually(20*time.Second, func() bool { return strings.Contains(read(), waiting) }) {
				select {
				case err := <-exited:
					t.Fatalf("run --wait ended (%v) instead of waiting: %q", err, read())
				default:
					t.Fatalf("run --wait does not say it waits: %q", read())
				}
			}
			if err := cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err = <-exited:
			case <-time.After(20 * time.Second):
				t.Fatalf("run --wait did not end on %v: %q", tt.sig, read())
			}
			if err != nil {
				t.Errorf("run --wait on %v: %v, want exit 0; stderr %q", tt.sig, err, read())
			}
			out := read()
			t.Logf("stderr:\n%s", out)
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 2 || !strings.Contains(lines[0], waiting) || !strings.Contains(lines[1], `level=INFO msg="stop requested while waiting for the other agent; exiting"`) {
				t.Fatalf("stderr %q: want the wait and the stop, one line each", out)
			}
			for _, l := range lines {
				if tt.journal && !strings.HasPrefix(l, "<6>level=INFO ") {
					t.Errorf("line %q: want the journal's info prefix and no time", l)
				}
				if !tt.journal && !strings.HasPrefix(l, "time=") {
					t.Errorf("line %q: want slog's text line, with its time", l)
				}
			}
		})
	}
}
