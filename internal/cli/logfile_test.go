package cli

import (
	"os"
	"path/filepath"
	"testing"
)

func TestOpenLogRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client.log")
	if err := os.WriteFile(path, make([]byte, maxLogBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := openLog(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, err := os.Stat(path + ".1"); err != nil || fi.Size() != maxLogBytes+1 {
		t.Fatalf("the big log was not rotated to .1: %v", err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Fatalf("the new log is not empty")
	}
}
