//go:build unix

package undo

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These are attacks on the local undo: an executor's
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
	last, _, _ := w.j.Last()
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

// TestALinkMadeByTheUndoItself: the undo's own moves put a link to
// ~/.ssh in place of a folder an earlier step looked at; a later step
// into that folder must not write into ~/.ssh. Without the mask, the
// same rows do put the file there: the refusal is the mask's.
func TestALinkMadeByTheUndoItself(t *testing.T) {
	for _, masked := range []bool{true, false} {
		w := newWorld(t)
		home := filepath.Join(filepath.Dir(w.folder), "home")
		ssh := filepath.Join(home, ".ssh")
		os.MkdirAll(ssh, 0o700)
		os.MkdirAll(filepath.Join(home, "a"), 0o755)
		os.WriteFile(filepath.Join(home, "a", "dummy"), []byte("d"), 0o644)
		os.Symlink(".ssh", filepath.Join(home, "lnk"))
		os.WriteFile(filepath.Join(home, "k"), []byte("ssh-ed25519 ATTACKER"), 0o644)
		var masks []string
		if masked {
			masks = []string{ssh}
		}
		w.lie("inv-1-000001", []string{"swap_src_dst"}, []string{home}, masks,
			map[string]any{"src": filepath.Join(home, "a", "authorized_keys"), "dst": filepath.Join(home, "k")},
			map[string]any{"src": filepath.Join(home, "a"), "dst": filepath.Join(home, "lnk")},
			map[string]any{"src": filepath.Join(home, "elsewhere"), "dst": filepath.Join(home, "a")},
			map[string]any{"src": "/nonexistent-outside/x", "dst": filepath.Join(home, "a", "dummy")})
		w.j.Undo("inv-1-000001", w.history, false)
		_, err := os.Stat(filepath.Join(ssh, "authorized_keys"))
		if masked && err == nil {
			t.Fatal("a key was written into a masked ~/.ssh through a link the undo itself moved into place")
		}
		if !masked && err != nil {
			t.Fatal("without the mask the same rows should reach ~/.ssh (the test would prove nothing)")
		}
	}
}

// TestAFolderHoldingAMask: moving a folder that holds a masked path
// would move the masked path with it.
func TestAFolderHoldingAMask(t *testing.T) {
	w := newWorld(t)
	home := filepath.Join(filepath.Dir(w.folder), "home")
	keyrings := filepath.Join(home, ".local", "share", "keyrings")
	os.MkdirAll(keyrings, 0o700)
	os.WriteFile(filepath.Join(keyrings, "login.keyring"), []byte("SECRET"), 0o600)
	os.MkdirAll(filepath.Join(home, "Public"), 0o755)
	os.Symlink(".local", filepath.Join(home, "x"))
	w.lie("inv-1-000003", []string{"swap_src_dst"}, []string{home}, []string{keyrings},
		map[string]any{"src": filepath.Join(home, "Public", "loot"), "dst": filepath.Join(home, "x", "share", "keyrings", "login.keyring")},
		map[string]any{"src": filepath.Join(home, "x"), "dst": filepath.Join(home, ".local")},
		map[string]any{"src": filepath.Join(home, "y"), "dst": filepath.Join(home, "x")})
	w.j.Undo("inv-1-000003", w.history, false)
	if _, err := os.Stat(filepath.Join(home, "Public", "loot")); err == nil {
		t.Fatal("a masked keyring was moved out")
	}
	if _, err := os.Stat(filepath.Join(keyrings, "login.keyring")); err != nil {
		t.Fatal("the masked keyring moved")
	}
}

// TestGrants: a folder granted inside another is not moved; a grant
// that is one file can be restored; a move cut between its link and
// unlink is finished; a long name is restored; a user's file named like
// an old temporary is left alone.
func TestGrants(t *testing.T) {
	t.Run("nested grant", func(t *testing.T) {
		w := newWorld(t)
		home := filepath.Dir(w.folder)
		w.write("a.jpg", "x")
		w.lie("inv-1-000004", []string{"swap_src_dst"}, []string{home, w.folder}, nil,
			map[string]any{"src": filepath.Join(home, "Moved"), "dst": w.folder})
		rep, _ := w.j.Undo("inv-1-000004", w.history, false)
		if _, err := os.Stat(w.folder); err != nil || len(rep.Done) != 0 {
			t.Fatalf("an inner grant was moved: %+v", rep)
		}
	})
	t.Run("file grant", func(t *testing.T) {
		w := newWorld(t)
		notes := w.write("notes.txt", "my notes")
		row := w.backup("t", notes)
		row["path"] = notes
		os.Remove(notes)
		w.lie("inv-1-000005", []string{"restore_blob_backup"}, []string{notes}, nil, row)
		rep, err := w.j.Undo("inv-1-000005", w.history, false)
		if b, _ := os.ReadFile(notes); err != nil || string(b) != "my notes" {
			t.Fatalf("a file grant's file was not restored: %+v %v", rep, err)
		}
	})
	t.Run("link and unlink cut short", func(t *testing.T) {
		w := newWorld(t)
		a := w.write("a.jpg", "x")
		b := filepath.Join(w.folder, "b.jpg")
		id := w.run("move_files", []string{"swap_src_dst"}, nil, func() map[string]any {
			os.Rename(a, b)
			return map[string]any{"results": []any{map[string]any{"src": a, "dst": b}}}
		})
		os.Link(b, a) // the fallback's link done, killed before the unlink
		rep, err := w.j.Undo(id, w.history, false)
		if _, serr := os.Lstat(b); err != nil || len(rep.Conflicts) != 0 || serr == nil {
			t.Fatalf("a half-done move was not finished: %+v %v", rep, err)
		}
	})
	t.Run("long name, and a user's file named like a temporary", func(t *testing.T) {
		w := newWorld(t)
		name := strings.Repeat("x", 250)
		p := w.write(name, "content")
		mine := w.write("."+name[:5]+".metnos-undo", "the user's own notes")
		id := w.deleteWithBlob(p)
		rep, err := w.j.Undo(id, w.history, false)
		if b, _ := os.ReadFile(p); err != nil || string(b) != "content" || len(rep.Conflicts) != 0 {
			t.Fatalf("a 250-byte name: %+v %v", rep, err)
		}
		if _, err := os.Stat(mine); err != nil {
			t.Fatal("a user's file was removed")
		}
	})
}

// TestMasksIgnoreCaseWhereTheFileSystemDoes: ~/.SSH is ~/.ssh on macOS
// and Windows.
func TestMasksIgnoreCaseWhereTheFileSystemDoes(t *testing.T) {
	home := t.TempDir()
	c := &confinement{roots: []string{home}, masks: []string{filepath.Join(home, ".ssh")}, resolved: map[string]string{}}
	_, _, _, err := c.locate(filepath.Join(home, ".SSH", "authorized_keys"))
	if foldsCase := runtime.GOOS == "darwin" || runtime.GOOS == "windows"; foldsCase != (err != nil) {
		t.Fatalf("~/.SSH with ~/.ssh masked on %s: %v", runtime.GOOS, err)
	}
}
