package lockfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLockHeldByAnotherProcess(t *testing.T) {
	if os.Getenv("METNOS_LOCK_HELPER") != "" {
		if _, err := Lock(os.Getenv("METNOS_LOCK_HELPER")); err != nil {
			os.Stdout.WriteString(err.Error())
			os.Exit(3)
		}
		os.Exit(0)
	}
	path := filepath.Join(t.TempDir(), "client.lock")
	l, err := Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=TestLockHeldByAnotherProcess")
	cmd.Env = append(os.Environ(), "METNOS_LOCK_HELPER="+path)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), "held by process") {
		t.Fatalf("a second process took the lock (err %v, output %q)", err, out)
	}
	// One sentence naming the lock once and its holder, no chain.
	if want := fmt.Sprintf("%s is held by process %d", path, os.Getpid()); string(out) != want {
		t.Errorf("the second Lock says %q, want %q", out, want)
	}
	l.Release()
	cmd = exec.Command(os.Args[0], "-test.run=TestLockHeldByAnotherProcess")
	cmd.Env = append(os.Environ(), "METNOS_LOCK_HELPER="+path)
	if out, err := cmd.Output(); err != nil {
		t.Fatalf("after release the lock is still held: %v %s", err, out)
	}
}

func TestLockWaitWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.lock")
	first, err := LockWait(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Lock(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("a second Lock while LockWait holds it: %v, want ErrLocked", err)
	}
	got := make(chan error, 1)
	released := make(chan struct{})
	go func() {
		l, err := LockWait(path)
		select {
		case <-released:
		default:
			err = errors.New("LockWait returned while the first holder still held the lock")
		}
		if l != nil {
			l.Release()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond) // room for a LockWait that does not wait to show itself
	close(released)
	first.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestLockContext: LockContext takes a free lock at once, waits while
// another holds it and takes it when let go (writing its process id),
// and gives up when its context ends.
func TestLockContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client.lock")
	l, err := LockContext(context.Background(), path, time.Hour)
	if err != nil {
		t.Fatalf("a free lock: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		l2, err := LockContext(context.Background(), path, 10*time.Millisecond)
		if l2 != nil {
			if pid, held, _ := LockHolder(path); !held || pid != os.Getpid() {
				err = fmt.Errorf("held by the waiter: LockHolder says pid %d, held %v", pid, held)
			}
			l2.Release()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("LockContext returned (%v) while the lock was held", err)
	case <-time.After(100 * time.Millisecond):
	}
	l.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LockContext did not take the lock once it was let go")
	}

	l, err = Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	if l2, err := LockContext(ctx, path, 10*time.Millisecond); l2 != nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), path) {
		t.Errorf("cancelled while held: %v, %v; want context.Canceled naming %s", l2, err, path)
	}
}

func TestLockHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client.lock")
	if _, held, err := LockHolder(path); held || err != nil {
		t.Fatalf("no file: held %v, %v", held, err)
	}
	if _, err := os.Lstat(path); err == nil {
		t.Fatal("LockHolder created the file")
	}
	// A lock held by another open file description counts as held.
	l, err := Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	pid, held, err := LockHolder(path)
	if err != nil || !held || pid != os.Getpid() {
		t.Errorf("held lock: pid %d held %v, %v", pid, held, err)
	}
}

// TestLockOpenErrorNamesThePathOnce: a lock that cannot be opened is
// named once (the error said "opening the lock P: open P: …").
func TestLockOpenErrorNamesThePathOnce(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "lockdir"), filepath.Join(file, "x", "client.lock")} {
		if path == filepath.Join(dir, "lockdir") {
			os.Mkdir(path, 0o700) // a folder where the lock file should be
		}
		_, err := Lock(path)
		if err == nil {
			t.Fatalf("Lock(%s) succeeded", path)
		}
		if n := strings.Count(err.Error(), path); n > 1 {
			t.Errorf("the error names %s %d times: %v", path, n, err)
		}
		if strings.Contains(err.Error(), "lockfile:") {
			t.Errorf("package name in the sentence: %v", err)
		}
	}
}
