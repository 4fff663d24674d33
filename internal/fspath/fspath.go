// Package fspath answers the one question several packages ask of two
// paths: does one lie in the other? It compares cleaned paths by whole
// components (filepath.Rel), on the text only: nothing is resolved, so
// callers resolve links first where that matters.
package fspath

import (
	"path/filepath"
	"strings"
)

// Within reports whether p is dir or lies beneath it.
func Within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// Inside reports whether p lies strictly beneath dir.
func Inside(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
