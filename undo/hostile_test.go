//go:build unix

package undo

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These are the attacks of a review of the local undo: an executor's
// result rows, and what it planted in the folders it could write, try
// to make the undo, which runs outside the sandbox, act elsewhere.

// lie journals one invocation whose result is rows.
func (w *world) lie(id string, reverse, roots, masks []string, rows ...any) {
	w.t.Helper()
	if err := w.j.Begin(Begin{InvocationID: id, Executor: "liar", Reverse: reverse, Roots: roots, Masks: masks, History: w.history}); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.j.Finish(id, Outcome{OK: true, Payload: map[string]any{"results": rows}}); err != nil {
		w.t.Fatal(err)
	}
}

// TestDotDotThroughAPlantedLink: a link the executor left in its grant,
// followed by "..", seems inside the grant but is not.
func TestDotDotThroughAPlantedLink(t *testing.T) {
	w := newWorld(t)
	outside := filepath.Join(filepath.Dir(w.folder), "home")
	os.MkdirAll(filepath.Join(outside, ".config", "autostart"), 0o755)
	victim := filepath.Join(outside, ".bashrc")
	os.WriteFile(victim, []byte("user's bashrc"), 0o644)
	os.Symlink(filepath.Join(outside, ".config"), filepath.Join(w.folder, "lnk")) // lnk/.. is outside
	evil := w.write("evil.desktop", "[Desktop Entry]\nExec=sh -c pwned\n")
	via := w.folder + "/lnk/../"
	w.lie("inv-1-000001", []string{"swap_src_dst", "delete_created_paths"}, []string{w.folder}, nil,
		map[string]any{"src": via + ".config/autostart/evil.desktop", "dst": evil},
		map[string]any{"created": true, "path": via + ".bashrc"})
	rep, err := w.j.Undo("inv-1-000001", w.history, false)
	if err != nil || len(rep.Done) != 0 || len(rep.Conflicts) != 2 {
		t.Fatalf("undo: %+v %v", rep, err)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatal("a file outside the grant was removed")
	}
	if _, err := os.Stat(filepath.Join(outside, ".config", "autostart", "evil.desktop")); err == nil {
		t.Fatal("a planted file was moved out of the grant")
	}
}

// TestMaskedPathInsideAGrant: a home-wide grant still masks ~/.ssh; the
// undo must not move the key out of it (nor anything into it). With
// the mask not recorded, the same undo does move it: the refusal is the
// mask's.
func TestMaskedPathInsideAGrant(t *testing.T) {
	for _, masked := range []bool{true, false} {
		w := newWorld(t)
		home := filepath.Dir(w.folder)
		key := filepath.Join(home, ".ssh", "id_ed25519")
		os.MkdirAll(filepath.Dir(key), 0o700)
		os.WriteFile(key, []byte("PRIVATE KEY"), 0o600)
		var masks []string
		if masked {
			masks = []string{filepath.Join(home, ".ssh")}
		}
		w.lie("inv-1-000002", []string{"swap_src_dst"}, []string{home}, masks,
			map[string]any{"src": filepath.Join(w.folder, "loot"), "dst": key})
		rep, _ := w.j.Undo("inv-1-000002", w.history, false)
		_, err := os.Stat(filepath.Join(w.folder, "loot"))
		switch {
		case masked && (err == nil || len(rep.Conflicts) != 1 || !strings.Contains(rep.Conflicts[0].Why, "hidden from executors")):
			t.Fatalf("a masked key was moved: %+v", rep)
		case !masked && err != nil:
			t.Fatalf("without the mask the move should happen (the test would prove nothing): %+v", rep)
		}
	}
}

// TestFIFOAsBlob: a FIFO in place of a blob does not hang the check.
func TestFIFOAsBlob(t *testing.T) {
	w := newWorld(t)
	p := filepath.Join(w.history, "t", "blob", sha256Hex("x")+".bin")
	os.MkdirAll(filepath.Dir(p), 0o700)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- CheckBlob(w.history, p, sha256Hex("x")) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("a FIFO as a blob: %v", err)
		}
	case <-time.After(10 * time.Second):
		f, _ := os.OpenFile(p, os.O_WRONLY, 0)
		f.Close()
		t.Fatal("checking a FIFO blob blocked")
	}
	// And a blob named through ".." out of the history folder.
	out := filepath.Join(filepath.Dir(w.history), "x.bin")
	os.WriteFile(out, []byte("x"), 0o600)
	if err := CheckBlob(w.history, w.history+"/../x.bin", sha256Hex("x")); err == nil {
		t.Fatal("a blob outside the history folder, named through .., was accepted")
	}
}

// TestAGrantItselfIsNotMoved: a path equal to a grant names the folder
// the sandbox mounted, which the run itself could not move or remove.
func TestAGrantItselfIsNotMoved(t *testing.T) {
	w := newWorld(t)
	other := filepath.Join(filepath.Dir(w.folder), "Pictures")
	os.MkdirAll(other, 0o755)
	w.write("a/b.jpg", "x")
	w.lie("inv-1-000006", []string{"swap_src_dst", "delete_created_dirs"}, []string{w.folder, other}, nil,
		map[string]any{"src": filepath.Join(other, "Photos"), "dst": w.folder})
	rep, _ := w.j.Undo("inv-1-000006", w.history, false)
	if _, err := os.Stat(w.folder); err != nil || len(rep.Conflicts) != 1 {
		t.Fatalf("the granted folder itself was moved away: %+v", rep)
	}
}

// TestALaterMoveIsNotAnUndo: a file a change created, moved later by an
// ordinary move, is not "undone"; the move stays what --last picks.
func TestALaterMoveIsNotAnUndo(t *testing.T) {
	w := newWorld(t)
	w.organize(3)
	a := filepath.Join(w.folder, "report.txt")
	create := w.run("write_file", []string{"delete_created_paths"}, nil, func() map[string]any {
		os.WriteFile(a, []byte("draft"), 0o644)
		return map[string]any{"results": []any{map[string]any{"created": true, "path": a}}}
	})
	b := filepath.Join(w.folder, "Archive-report.txt")
	mv := w.run("move_files", []string{"swap_src_dst"}, map[string]any{"entries": []any{map[string]any{"src": a, "dst": b}}}, func() map[string]any {
		os.Rename(a, b)
		return map[string]any{"results": []any{map[string]any{"src": a, "dst": b}}}
	})
	c, _ := w.j.Entry(create)
	last, _ := w.j.Last()
	if c.State() != "done" || last.InvocationID != mv {
		t.Fatalf("creation %s, --last picks %s (want the move %s)", c.State(), last.InvocationID, mv)
	}
	// Deleting it is its undo.
	w.run("delete_files", nil, map[string]any{"paths": []any{b}}, func() map[string]any {
		os.Rename(b, a)
		os.Remove(a)
		return map[string]any{"results": []any{map[string]any{"path": a, "removed": true}}}
	})
	if c, _ := w.j.Entry(create); c.State() != "undone" {
		t.Fatalf("after its file was deleted, the creation is %s", c.State())
	}
}
