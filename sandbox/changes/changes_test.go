package changes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func fileState(content, mode string) *State {
	n := int64(len(content))
	return &State{Size: &n, SHA256: sum(content), Mode: mode}
}

func write(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// show writes a list as indented JSON, for a failure message.
func show(cs []Change) string {
	b, _ := json.MarshalIndent(cs, "", "  ")
	return string(b)
}

// TestDiff: what two snapshots say changed, each kind of change alone.
func TestDiff(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after func(t *testing.T, root string)
		want          []Change
	}{
		{
			name:   "created",
			before: func(t *testing.T, root string) {},
			after:  func(t *testing.T, root string) { write(t, root+"/a", "A", 0o644) },
			want:   []Change{{Op: Created, Path: "/a", Kind: File, After: fileState("A", "0644")}},
		},
		{
			name:   "modified content",
			before: func(t *testing.T, root string) { write(t, root+"/a", "A", 0o644) },
			after:  func(t *testing.T, root string) { write(t, root+"/a", "AA", 0o644) },
			want:   []Change{{Op: Modified, Path: "/a", Kind: File, Before: fileState("A", "0644"), After: fileState("AA", "0644")}},
		},
		{
			name:   "modified mode",
			before: func(t *testing.T, root string) { write(t, root+"/a", "A", 0o644) },
			after:  func(t *testing.T, root string) { write(t, root+"/a", "A", 0o600) },
			want:   []Change{{Op: Modified, Path: "/a", Kind: File, Before: fileState("A", "0644"), After: fileState("A", "0600")}},
		},
		{
			name:   "touched only: no change",
			before: func(t *testing.T, root string) { write(t, root+"/a", "A", 0o644) },
			after:  func(t *testing.T, root string) { write(t, root+"/a", "A", 0o644) },
		},
		{
			name: "deleted folder lists what it held",
			before: func(t *testing.T, root string) {
				write(t, root+"/d/x", "X", 0o644)
				os.Chmod(root+"/d", 0o755)
			},
			after: func(t *testing.T, root string) {},
			want: []Change{
				{Op: Deleted, Path: "/d", Kind: Dir, Before: &State{Mode: "0755"}},
				{Op: Deleted, Path: "/d/x", Kind: File, Before: fileState("X", "0644")},
			},
		},
		{
			name:   "renamed",
			before: func(t *testing.T, root string) { write(t, root+"/a", "A", 0o644) },
			after:  func(t *testing.T, root string) { write(t, root+"/b", "A", 0o600) },
			want:   []Change{{Op: Renamed, Path: "/b", From: "/a", Kind: File, Before: fileState("A", "0644"), After: fileState("A", "0600")}},
		},
		{
			name: "two of one content paired in path order, empty files never",
			before: func(t *testing.T, root string) {
				write(t, root+"/a1", "A", 0o644)
				write(t, root+"/a2", "A", 0o644)
				write(t, root+"/e", "", 0o644)
			},
			after: func(t *testing.T, root string) {
				write(t, root+"/b1", "A", 0o644)
				write(t, root+"/b2", "A", 0o644)
				write(t, root+"/f", "", 0o644)
			},
			want: []Change{
				{Op: Deleted, Path: "/e", Kind: File, Before: fileState("", "0644")},
				{Op: Created, Path: "/f", Kind: File, After: fileState("", "0644")},
				{Op: Renamed, Path: "/b1", From: "/a1", Kind: File, Before: fileState("A", "0644"), After: fileState("A", "0644")},
				{Op: Renamed, Path: "/b2", From: "/a2", Kind: File, Before: fileState("A", "0644"), After: fileState("A", "0644")},
			},
		},
		{
			name:   "kind changed: deleted then created",
			before: func(t *testing.T, root string) { write(t, root+"/a", "A", 0o644) },
			after: func(t *testing.T, root string) {
				if err := os.Symlink("elsewhere", root+"/a"); err != nil {
					t.Fatal(err)
				}
			},
			want: []Change{
				{Op: Deleted, Path: "/a", Kind: File, Before: fileState("A", "0644")},
				{Op: Created, Path: "/a", Kind: Symlink, After: &State{Target: "elsewhere"}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := canonicalTemp(t)
			before, after := filepath.Join(dir, "before"), filepath.Join(dir, "after")
			for _, d := range []string{before, after} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			tc.before(t, before)
			tc.after(t, after)
			sb, err := Take(before)
			if err != nil {
				t.Fatal(err)
			}
			sa, err := Take(after)
			if err != nil {
				t.Fatal(err)
			}
			// The two trees as one, before and after.
			rel := func(s Snapshot, root string) Snapshot {
				out := Snapshot{}
				for p, e := range s {
					out["/t"+p[len(root):]] = e
				}
				return out
			}
			got := Relative(Diff(rel(sb, before), rel(sa, after)), "/t")
			if !reflect.DeepEqual(got, sortedCopy(tc.want)) {
				t.Errorf("got %s\nwant %s", show(got), show(sortedCopy(tc.want)))
			}
		})
	}
}

// sortedCopy is want in the list's order (Finish's, without pairing
// again: the cases write their renames themselves).
func sortedCopy(want []Change) []Change {
	out := append([]Change(nil), want...)
	sortChanges(out)
	if out == nil {
		return []Change{}
	}
	return out
}

// canonicalTemp is a temporary folder with its symbolic links
// resolved (lstat follows none on the way).
func canonicalTemp(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
