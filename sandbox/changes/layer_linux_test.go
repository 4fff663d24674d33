package changes

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// whiteout makes the overlay's mark of a deleted entry at p: a
// character device 0/0 (which mknod makes without privileges).
func whiteout(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
		t.Fatalf("making a whiteout: %v", err)
	}
}

// opaqueDir makes a folder marked opaque as an unprivileged overlay
// marks it.
func opaqueDir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, 0o755)
	if err := unix.Setxattr(p, "user.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("this file system keeps no user extended attributes: %v", err)
	}
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, 0o755)
}

// TestFromLayers: upper layers written by hand as an unprivileged
// overlay writes them, read against their lower folders.
func TestFromLayers(t *testing.T) {
	for _, tc := range []struct {
		name         string
		lower, upper func(t *testing.T, lower, upper string)
		want         []Change
	}{
		{
			name:  "a whiteout deletes a file",
			lower: func(t *testing.T, l, u string) { write(t, l+"/a", "A", 0o644) },
			upper: func(t *testing.T, l, u string) { whiteout(t, u+"/a") },
			want:  []Change{{Op: Deleted, Path: "/a", Kind: File, Before: fileState("A", "0644")}},
		},
		{
			name: "a whiteout deletes a folder and all it held",
			lower: func(t *testing.T, l, u string) {
				write(t, l+"/d/e/x", "X", 0o600)
				mkdir(t, l+"/d/e")
				mkdir(t, l+"/d")
			},
			upper: func(t *testing.T, l, u string) { whiteout(t, u+"/d") },
			want: []Change{
				{Op: Deleted, Path: "/d", Kind: Dir, Before: &State{Mode: "0755"}},
				{Op: Deleted, Path: "/d/e", Kind: Dir, Before: &State{Mode: "0755"}},
				{Op: Deleted, Path: "/d/e/x", Kind: File, Before: fileState("X", "0600")},
			},
		},
		{
			name: "an opaque folder deletes what it does not hold",
			lower: func(t *testing.T, l, u string) {
				write(t, l+"/d/x", "X", 0o644)
				write(t, l+"/d/y", "Y", 0o644)
				write(t, l+"/d/s/z", "Z", 0o644)
				mkdir(t, l+"/d/s")
				mkdir(t, l+"/d")
			},
			upper: func(t *testing.T, l, u string) {
				opaqueDir(t, u+"/d")
				write(t, u+"/d/x", "X", 0o644) // the same file made again
				write(t, u+"/d/w", "W", 0o644)
				mkdir(t, u+"/d/s") // a new folder in an opaque one: hides the lower one's files
			},
			want: []Change{
				{Op: Created, Path: "/d/w", Kind: File, After: fileState("W", "0644")},
				{Op: Deleted, Path: "/d/s/z", Kind: File, Before: fileState("Z", "0644")},
				{Op: Deleted, Path: "/d/y", Kind: File, Before: fileState("Y", "0644")},
			},
		},
		{
			name: "copied up and left alone: no change; modified, created",
			lower: func(t *testing.T, l, u string) {
				write(t, l+"/d/same", "S", 0o644)
				write(t, l+"/d/mod", "M", 0o644)
				mkdir(t, l+"/d")
			},
			upper: func(t *testing.T, l, u string) {
				write(t, u+"/d/same", "S", 0o644)
				write(t, u+"/d/mod", "M2", 0o640)
				write(t, u+"/d/new/n", "N", 0o644)
				mkdir(t, u+"/d/new")
				mkdir(t, u+"/d")
			},
			want: []Change{
				{Op: Modified, Path: "/d/mod", Kind: File, Before: fileState("M", "0644"), After: fileState("M2", "0640")},
				{Op: Created, Path: "/d/new", Kind: Dir, After: &State{Mode: "0755"}},
				{Op: Created, Path: "/d/new/n", Kind: File, After: fileState("N", "0644")},
			},
		},
		{
			name:  "a whiteout and a file of the same bytes: renamed",
			lower: func(t *testing.T, l, u string) { write(t, l+"/a", "A", 0o644) },
			upper: func(t *testing.T, l, u string) {
				whiteout(t, u+"/a")
				write(t, u+"/sub/b", "A", 0o644)
				mkdir(t, u+"/sub")
			},
			want: []Change{
				{Op: Created, Path: "/sub", Kind: Dir, After: &State{Mode: "0755"}},
				{Op: Renamed, Path: "/sub/b", From: "/a", Kind: File, Before: fileState("A", "0644"), After: fileState("A", "0644")},
			},
		},
		{
			name:  "a file in place of a folder",
			lower: func(t *testing.T, l, u string) { write(t, l+"/d/x", "X", 0o644); mkdir(t, l+"/d") },
			upper: func(t *testing.T, l, u string) { write(t, u+"/d", "D", 0o644) },
			want: []Change{
				{Op: Deleted, Path: "/d", Kind: Dir, Before: &State{Mode: "0755"}},
				{Op: Created, Path: "/d", Kind: File, After: fileState("D", "0644")},
				{Op: Deleted, Path: "/d/x", Kind: File, Before: fileState("X", "0644")},
			},
		},
		{
			name: "a file written through one of its hard links changes under both",
			lower: func(t *testing.T, l, u string) {
				write(t, l+"/h1", "H", 0o644)
				if err := os.Link(l+"/h1", l+"/h2"); err != nil {
					t.Fatal(err)
				}
			},
			upper: func(t *testing.T, l, u string) { write(t, u+"/h1", "H2", 0o644) },
			want: []Change{
				{Op: Modified, Path: "/h1", Kind: File, Before: fileState("H", "0644"), After: fileState("H2", "0644")},
				{Op: Modified, Path: "/h2", Kind: File, Before: fileState("H", "0644"), After: fileState("H2", "0644")},
			},
		},
		{
			name: "a hard link to a file outside the folder is counted",
			lower: func(t *testing.T, l, u string) {
				write(t, l+"/../outside", "O", 0o644)
				if err := os.Link(l+"/../outside", l+"/in"); err != nil {
					t.Fatal(err)
				}
			},
			upper: func(t *testing.T, l, u string) { write(t, u+"/in", "O2", 0o644) },
			want: []Change{
				{Op: Modified, Path: "/in", Kind: File, Before: fileState("O", "0644"), After: fileState("O2", "0644"), LinksOutside: 1},
			},
		},
		{
			name:  "the folder's own mode",
			lower: func(t *testing.T, l, u string) {},
			upper: func(t *testing.T, l, u string) { os.Chmod(u, 0o700) },
			want:  []Change{{Op: Modified, Path: "/", Kind: Dir, Before: &State{Mode: "0755"}, After: &State{Mode: "0700"}}},
		},
		{
			name: "an unreadable file the run left is read all the same",
			lower: func(t *testing.T, l, u string) {
			},
			upper: func(t *testing.T, l, u string) { write(t, u+"/secret", "S", 0o000) },
			want:  []Change{{Op: Created, Path: "/secret", Kind: File, After: fileState("S", "0000")}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := canonicalTemp(t)
			lower, upper := filepath.Join(dir, "lower"), filepath.Join(dir, "upper")
			mkdir(t, lower)
			mkdir(t, upper)
			tc.lower(t, lower, upper)
			tc.upper(t, lower, upper)
			got, err := FromLayers([]Layer{{Lower: lower, Upper: upper}})
			if err != nil {
				t.Fatal(err)
			}
			got = Relative(got, lower)
			if !reflect.DeepEqual(got, sortedCopy(tc.want)) {
				t.Errorf("got %s\nwant %s", show(got), show(sortedCopy(tc.want)))
			}
		})
	}
}

// TestFromLayersUnlisted: an unlisted layer's changes are left out,
// and its files still count as names of a hard link.
func TestFromLayersUnlisted(t *testing.T) {
	dir := canonicalTemp(t)
	var ls []Layer
	for _, name := range []string{"user", "own"} {
		l, u := filepath.Join(dir, name, "lower"), filepath.Join(dir, name, "upper")
		mkdir(t, l)
		mkdir(t, u)
		ls = append(ls, Layer{Lower: l, Upper: u, Unlisted: name == "own"})
	}
	write(t, ls[0].Lower+"/f", "F", 0o644)
	if err := os.Link(ls[0].Lower+"/f", ls[1].Lower+"/f"); err != nil {
		t.Fatal(err)
	}
	write(t, ls[0].Upper+"/f", "F2", 0o644)
	write(t, ls[1].Upper+"/blob", "B", 0o644)
	got, err := FromLayers(ls)
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{{Op: Modified, Path: ls[0].Lower + "/f", Kind: File, Before: fileState("F", "0644"), After: fileState("F2", "0644")}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %s\nwant %s", show(got), show(want))
	}
}
