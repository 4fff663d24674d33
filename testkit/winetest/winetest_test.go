package winetest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestTempDirRemovesATree(t *testing.T) {
	t.Logf("under Wine: %v", UnderWine())
	var dir string
	t.Run("fill", func(t *testing.T) {
		dir = TempDir(t)
		sub := filepath.Join(dir, "a", "b")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, "ro"), []byte("x"), 0o400); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still there after its test ended: %v", dir, err)
	}
}
