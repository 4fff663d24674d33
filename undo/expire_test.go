package undo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// blobs makes a turn folder with a blob of size bytes, dated when, and
// journals a delete of one file whose blob it is.
func (w *world) turnWithBlob(turn string, size int, when time.Time) string {
	w.t.Helper()
	p := w.write(turn+".txt", (turn + strings.Repeat("b", size))[:size])
	id := w.run("delete_files", []string{"restore_blob_backup"}, nil, func() map[string]any {
		row := map[string]any{"path": p}
		for k, v := range w.backup(turn, p) {
			row[k] = v
		}
		os.Remove(p)
		return map[string]any{"ok": true, "results": []any{row}}
	})
	// Back-date the folder and the entry.
	for _, d := range []string{filepath.Join(w.history, turn, "blob"), filepath.Join(w.history, turn)} {
		os.Chtimes(d, when, when)
	}
	w.j.byID[id].Ended = when
	return id
}

func TestExpire(t *testing.T) {
	now := time.Now()
	day := 24 * time.Hour
	t.Run("retention", func(t *testing.T) {
		w := newWorld(t)
		old := w.turnWithBlob("old", 10, now.Add(-40*day))
		recent := w.turnWithBlob("recent", 10, now.Add(-2*day))
		out, err := w.j.Expire(Expiry{History: w.history, Retention: 30 * day, Quota: -1, Now: now})
		if err != nil || len(out) != 1 || out[0].Reason != "retention" || out[0].IDs[0] != old {
			t.Fatalf("expired %+v, %v", out, err)
		}
		if _, err := os.Stat(filepath.Join(w.history, "old")); err == nil {
			t.Fatal("the old turn is still there")
		}
		if _, err := os.Stat(filepath.Join(w.history, "recent")); err != nil {
			t.Fatal("the recent turn went")
		}
		e, _ := w.j.Entry(old)
		if len(e.BlobsExpired) != 1 || !strings.Contains(e.BlobsExpired[0], "retention") {
			t.Fatalf("the journal does not say: %v", e.BlobsExpired)
		}
		// Undo of the expired change reports the blob is gone, restores nothing.
		rep, _ := w.j.Undo(old, w.history, false)
		if len(rep.Done) != 0 || len(rep.Conflicts) != 1 {
			t.Fatalf("undo after expiry: %+v", rep)
		}
		_ = recent
	})
	t.Run("quota takes undone changes first, then the oldest, never the newest", func(t *testing.T) {
		w := newWorld(t)
		a := w.turnWithBlob("a", 1000, now.Add(-5*day))
		b := w.turnWithBlob("b", 1000, now.Add(-4*day))
		c := w.turnWithBlob("c", 1000, now.Add(-3*day))
		d := w.turnWithBlob("d", 5000, now.Add(-1*day))
		// c is undone: its blob is the first to go.
		if _, err := w.j.Undo(c, w.history, false); err != nil {
			t.Fatal(err)
		}
		out, err := w.j.Expire(Expiry{History: w.history, Retention: 30 * day, Quota: 2500, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		var gone []string
		for _, x := range out {
			gone = append(gone, filepath.Base(x.Dir))
			if !strings.HasPrefix(x.Reason, "quota") {
				t.Errorf("reason %q", x.Reason)
			}
		}
		if fmt.Sprint(gone) != "[c a b]" {
			t.Fatalf("removed %v, want [c a b] (undone first, then oldest; d, the newest, kept over the quota)", gone)
		}
		if len(out[0].Lost) != 0 || len(out[1].Lost) != 1 || out[1].Lost[0] != a {
			t.Fatalf("lost undo: %+v", out)
		}
		if e, _ := w.j.Entry(b); len(e.BlobsExpired) != 1 || !strings.Contains(e.BlobsExpired[0], "quota") {
			t.Fatalf("the journal does not say b lost its blobs: %v", e.BlobsExpired)
		}
		_ = d
	})
	t.Run("a link in place of the history folder", func(t *testing.T) {
		w := newWorld(t)
		victim := t.TempDir()
		os.WriteFile(filepath.Join(victim, "keep"), []byte("x"), 0o600)
		os.RemoveAll(w.history)
		os.Symlink(victim, w.history)
		if _, err := w.j.Expire(Expiry{History: w.history, Retention: time.Nanosecond, Quota: 1, Now: now.Add(time.Hour)}); err == nil {
			t.Fatal("no word about the link")
		}
		if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
			t.Fatal("expiry followed a link out of the history folder")
		}
	})
	t.Run("default quota", func(t *testing.T) {
		w := newWorld(t)
		w.turnWithBlob("x", 10, now)
		w.turnWithBlob("y", 10, now)
		if out, err := w.j.Expire(Expiry{History: w.history, Retention: day, Now: now}); err != nil || len(out) != 0 {
			t.Fatalf("20 bytes of blobs are within 10%% of the free space: %+v %v", out, err)
		}
	})
}
