package undo

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDuplicateFolderPatterns: a manifest that lists a folder-removal
// pattern twice (or delete_created_paths with delete_created_dirs)
// before swap_src_dst and restore_blob_backup, for a run that moved a
// photo over another and made folders. The duplicate folder steps are
// dropped; the restore must still wait for the right move. It used to
// point at itself (a stack overflow that killed the agent at its next
// writing invocation) or past the end of the steps (an index panic).
func TestDuplicateFolderPatterns(t *testing.T) {
	for name, reverse := range map[string][]string{
		"dirs twice":          {"delete_created_dirs", "delete_created_dirs", "swap_src_dst", "restore_blob_backup"},
		"dirs and then paths": {"delete_created_dirs", "delete_created_paths", "swap_src_dst", "restore_blob_backup"},
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			src := w.write("IMG_0001.jpg", "the new photo")
			dst := w.write("2024/03/IMG_0001.jpg", "an older photo with the same name")
			before := w.snapshot()
			id := w.run("organize_photos", reverse, map[string]any{"folder": w.folder}, func() map[string]any {
				row := map[string]any{"src": src, "dst": dst, "path": dst}
				for k, v := range w.backup("turn-1", dst) {
					row[k] = v
				}
				if err := os.Rename(src, dst); err != nil {
					t.Fatal(err)
				}
				var dirs []any
				for _, m := range []string{"04", "05"} {
					d := filepath.Join(w.folder, "2024", m)
					os.MkdirAll(d, 0o755)
					dirs = append(dirs, d)
				}
				return map[string]any{"results": []any{row}, "dirs_created": dirs}
			})
			// A later writing invocation naming the same file looks at
			// the entry's steps (recognise), inside the agent.
			w.run("write_files", []string{"delete_created_paths"}, map[string]any{"path": dst}, func() map[string]any {
				return map[string]any{"results": []any{}}
			})
			e, _ := w.j.Entry(id)
			if got, want := e.Summary(), "move 1 file back, restore 1 file from its backup, remove 2 created folders"; got != want {
				t.Fatalf("summary: %q, want %q", got, want)
			}
			rep, err := w.j.Undo(id, w.history, false)
			if err != nil || len(rep.Conflicts) != 0 || len(rep.Done) != 4 {
				t.Fatalf("undo: %+v %v", rep, err)
			}
			equal(t, w.snapshot(), before)
		})
	}
}
