// Package testexec holds the test executors that more than one test
// package runs, and joins executor trees into the one tree a reference
// server serves.
//
// hold (hold/manifest.toml) writes into the folder it is given: it
// notes what the folder holds when it starts, leaves started-<tag>
// (tag "x" unless given), waits until the file wait_for appears there
// when asked (hashing meanwhile with burn), then leaves done-<tag>. It
// is the long executor holding a write grant that ends when a test
// says, not at a clock.
package testexec

import (
	"embed"
	"io/fs"
	"testing"
	"testing/fstest"
)

//go:embed hold
var files embed.FS

// Hold is the hold executor, as a tree whose root holds the folder hold.
var Hold fs.FS = files

// Merge joins executor trees, each with a folder per executor at its
// root, into one (a later tree's file wins over an earlier one's), every
// file readable as the reference server serves it; a tree it cannot
// read fails the test.
func Merge(t testing.TB, trees ...fs.FS) fstest.MapFS {
	t.Helper()
	out := fstest.MapFS{}
	for _, fsys := range trees {
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(fsys, p)
			out[p] = &fstest.MapFile{Data: b, Mode: 0o644}
			return err
		})
		if err != nil {
			t.Fatalf("reading the test executors: %v", err)
		}
	}
	return out
}
