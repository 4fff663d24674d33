package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/update"
)

// lockedBuffer is a stderr a test reads while the command writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// eventually waits up to d for cond, checking every 10 ms.
func eventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// pastTheLock are run's flags that make it fail just after it took its
// lock (a tailnet auth key file that does not exist), and what it then
// says: a run that says it got past the lock.
func pastTheLock(t *testing.T) (args []string, says string) {
	missing := filepath.Join(t.TempDir(), "nonexistent", "key")
	return []string{"--tailnet-authkey-file", missing, "--tailnet-control-url", "http://127.0.0.1:1"},
		"metnos-agent: tailnet: the auth key file " + missing + " does not exist"
}

// TestRunWaitWaitsForTheLock: `run --wait` while another agent holds the
// lock does not exit 3: it says once which process holds it, waits, and
// goes on once the lock is let go (here to fail on a missing auth key
// file, which it checks after taking the lock). Both places run takes
// the lock wait: the early boot of a device with an update record, and
// run's own lock.
func TestRunWaitWaitsForTheLock(t *testing.T) {
	for _, record := range []bool{false, true} {
		t.Run(fmt.Sprintf("update record %v", record), func(t *testing.T) {
			std, e, _, _ := identityStd(t, false)
			var errb lockedBuffer
			std.err = &errb
			writePaired(t, e)
			if record {
				if err := update.SaveState(e.lay.UpdateState(), update.State{Phase: update.PhaseNone}); err != nil {
					t.Fatal(err)
				}
			}
			held, err := lockfile.Lock(e.lay.Lock())
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()
			args, says := pastTheLock(t)
			done := make(chan int, 1)
			go func() { done <- runRun(std, append([]string{"--wait"}, args...)) }()

			waiting := fmt.Sprintf(`msg="waiting for the agent in process %d to stop; it takes over then" lock=%s pid=%d`, os.Getpid(), e.lay.Lock(), os.Getpid())
			if !eventually(10*time.Second, func() bool { return strings.Contains(errb.String(), waiting) }) {
				select {
				case code := <-done:
					t.Fatalf("run --wait ended (exit %d) instead of waiting: %s", code, errb.String())
				default:
					t.Fatalf("run --wait does not say it waits: %q", errb.String())
				}
			}
			// Past a few of its tries, it still waits.
			select {
			case code := <-done:
				t.Fatalf("run --wait ended (exit %d) while the lock was held: %s", code, errb.String())
			case <-time.After(2*lockWaitPoll + 500*time.Millisecond):
			}
			held.Release()
			var code int
			select {
			case code = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("run --wait did not go on once the lock was let go: %s", errb.String())
			}
			out := errb.String()
			if code != exitFailure || !strings.Contains(out, says) || !strings.Contains(out, "msg=\"the other agent stopped; taking over\"") {
				t.Errorf("exit %d, stderr %q; want exit 1 past the lock, saying %q", code, out, says)
			}
			if n := strings.Count(out, "waiting for the agent"); n != 1 || strings.Contains(out, "already running") {
				t.Errorf("stderr %q: the wait said %d times, or exit 3's sentence", out, n)
			}
		})
	}
}

// TestRunWithoutWaitExits3: without --wait, run while another agent
// holds the lock still exits 3 with its sentence, in both places it
// takes the lock.
func TestRunWithoutWaitExits3(t *testing.T) {
	for _, record := range []bool{false, true} {
		std, e, _, errb := identityStd(t, false)
		writePaired(t, e)
		if record {
			if err := update.SaveState(e.lay.UpdateState(), update.State{Phase: update.PhaseNone}); err != nil {
				t.Fatal(err)
			}
		}
		held, err := lockfile.Lock(e.lay.Lock())
		if err != nil {
			t.Fatal(err)
		}
		args, _ := pastTheLock(t)
		for _, wait := range []string{"--wait=false", ""} {
			errb.Reset()
			a := args
			if wait != "" {
				a = append([]string{wait}, args...)
			}
			code := runRun(std, a)
			want := fmt.Sprintf("metnos-agent: another agent is already running for this user (%s is held by process %d): stop it first with `systemctl --user stop metnos-agent`, or Ctrl-C in its terminal\n", e.lay.Lock(), os.Getpid())
			if code != exitLocked || errb.String() != want {
				t.Errorf("update record %v, run %q: exit %d, stderr %q; want %d and %q", record, a, code, errb, exitLocked, want)
			}
		}
		held.Release()
	}
}

// TestAsksWait: bootEarly finds --wait in run's arguments before run
// parses them, as run would parse them.
func TestAsksWait(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--wait"}, true},
		{[]string{"-wait"}, true},
		{[]string{"--wait=true"}, true},
		{[]string{"--wait=false"}, false},
		{[]string{"--server", "http://s", "--wait", "--min-sandbox", "full"}, true},
		{[]string{"--server", "--wait"}, false}, // --wait is the server's URL
		{[]string{"--", "--wait"}, false},
		{[]string{"--wait", "--nosuchflag"}, false}, // run refuses it
	} {
		if got := asksWait(tt.args); got != tt.want {
			t.Errorf("asksWait(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}
