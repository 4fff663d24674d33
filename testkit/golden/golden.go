// Package golden compares what a test produced with a file under the
// test's testdata folder, and rewrites that file when the test runs
// with -update.
//
// It is imported by tests only. It registers the -update flag itself,
// so a test package that imports it must not define its own.
package golden

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata instead of comparing with them")

// Update reports whether the test runs with -update.
func Update() bool { return *update }

// Compare fails t when got differs from the file, or rewrites the file
// (creating its folder) under -update. The failure prints got and the
// command that rewrites the file once the change is reviewed.
func Compare(t testing.TB, file string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (go test -run '%s' -update creates it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (review it, then go test -run '%s' -update rewrites it):\n%s", file, t.Name(), got)
	}
}
