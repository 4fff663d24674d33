package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// minimalGo is the baseline: a Go program that prints a line and
// exits, or with an argument idles, waking every second.
const minimalGo = `package main

import (
	"fmt"
	"os"
	"time"
)

func main() {
	fmt.Println("hello")
	for len(os.Args) > 1 {
		time.Sleep(time.Second)
	}
}
`

// buildMinimal builds minimalGo into dir as releases are built and
// returns its path.
func buildMinimal(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join(dir, "minimal")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(minimalGo), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module minimal\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "minimal-go")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the minimal Go program: %v\n%s", err, b)
	}
	return out
}
