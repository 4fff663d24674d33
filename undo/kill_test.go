//go:build unix

package undo

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/internal/chainlog"
)

// killChild is the re-executed test binary's part: a local undo that
// kills itself (SIGKILL, as kill -9) at the step named by UNDO_KILL_AT.
func killChild() {
	if at := os.Getenv("UNDO_KILL_AT"); at != "" {
		var item int
		var phase string
		fmt.Sscanf(strings.Replace(at, ":", " ", 1), "%d %s", &item, &phase)
		stepHook = func(i int, p string) {
			if i == item && p == phase {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	j, err := Open(os.Getenv("UNDO_KILL_JOURNAL"))
	if err == nil {
		_, err = j.Undo(os.Getenv("UNDO_KILL_ID"), os.Getenv("UNDO_KILL_HISTORY"), false)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func TestMain(m *testing.M) {
	if os.Getenv("UNDO_KILL_JOURNAL") != "" {
		killChild()
	}
	os.Exit(m.Run())
}

// undoProcess starts a local undo in another process.
func undoProcess(t *testing.T, w *world, id, at string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "UNDO_KILL_JOURNAL="+w.j.Dir(), "UNDO_KILL_HISTORY="+w.history, "UNDO_KILL_ID="+id, "UNDO_KILL_AT="+at)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// finish runs the undo to its end and checks that every file is back,
// byte for byte, and the journal is whole and says undone.
func finish(t *testing.T, w *world, id string, before map[string]string) {
	t.Helper()
	if err := undoProcess(t, w, id, "").Wait(); err != nil {
		t.Fatalf("the undo run after the kills: %v", err)
	}
	equal(t, w.snapshot(), before)
	j, err := Open(w.j.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := j.Entry(id); e.State() != "undone" || e.UndoStarted || len(e.Conflicts) != 0 {
		t.Fatalf("journal after the undo: %s, started %v, conflicts %v", e.State(), e.UndoStarted, e.Conflicts)
	}
	if rep, err := chainlog.Verify(w.j.Dir()); err != nil || !rep.OK() {
		t.Fatalf("the journal's chain after the kills: %v %v", rep, err)
	}
}

// TestKillDuringUndo kills a local undo of 1,000 moves (and a blob
// restore and two folder removals) with SIGKILL at chosen points, one
// after the other, each time at a later step, then runs it again to
// the end: every file is back, none lost, none doubled.
func TestKillDuringUndo(t *testing.T) {
	w := newWorld(t)
	id, before := w.organize(1000)
	e, _ := w.j.Entry(id)
	restore := -1
	for i, it := range e.Items {
		if it.Kind == Restore {
			restore = i
		}
	}
	points := []string{
		"0:before",                          // just after the undo_started record
		"1:after",                           // between two moves
		"250:after",                         // between two moves
		"999:before",                        // before the last move
		fmt.Sprintf("%d:written", restore),  // a restored file written, not yet in place
		fmt.Sprintf("%d:before", restore+1), // before a folder's removal
		"-1:end",                            // everything done, the final record not written
	}
	for _, at := range points {
		err := undoProcess(t, w, id, at).Wait()
		if !killed(err) {
			t.Fatalf("kill at %s: the undo was not killed (%v)", at, err)
		}
	}
	finish(t, w, id, before)
}

// TestKillDuringUndoAtRandom kills the undo from outside at random
// moments, several times, then lets it finish.
func TestKillDuringUndoAtRandom(t *testing.T) {
	w := newWorld(t)
	id, before := w.organize(1000)
	kills := 0
	for range 6 {
		cmd := undoProcess(t, w, id, "")
		time.Sleep(time.Duration(rand.IntN(40_000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
		if killed(cmd.Wait()) {
			kills++
		}
	}
	t.Logf("%d of 6 runs were killed before they ended", kills)
	finish(t, w, id, before)
}
