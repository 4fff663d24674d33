//go:build linux

package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/metnos/agent/refserver"
)

// TestChildKilledByMemoryLimit: an executor whose child the memory
// limit kills, and which then prints its 36 rows and exits 0, gets its
// result delivered whole, ok as it said; an executor that goes past the
// limit itself is a device_error naming the limit. As root the cgroup's
// OOM counter used to make the first one a memory failure ("killed by
// the memory limit (0 MiB)") and its rows were lost.
func TestChildKilledByMemoryLimit(t *testing.T) {
	t.Setenv("METNOS_EXEC_MEM_MB", "128")
	w := newWorld(t)
	w.pair()
	w.start()

	info := w.wait(w.enqueue("memory_hog", map[string]any{"mib": 1024, "in_child": true, "rows": 36}, refserver.EnqueueOptions{}))
	r := result(t, info)
	entries, _ := r["entries"].([]any)
	if info.State != "done" || r["ok"] != true || len(entries) != 36 {
		t.Fatalf("state %s, ok %v, %d rows, want done, ok and 36 rows: %.600s", info.State, r["ok"], len(entries), info.ResultBody)
	}
	for i, e := range entries {
		if m, _ := e.(map[string]any); m["path"] != fmt.Sprintf("/work/row-%d", i) {
			t.Fatalf("row %d is %v", i, e)
		}
	}
	p, _ := r["payload"].(map[string]any)
	t.Logf("the child's exit status: %v (-9: the limit killed it; 1: a MemoryError under rlimits)", p["child_exit"])

	info = w.wait(w.enqueue("memory_hog", map[string]any{"mib": 1024, "in_child": false}, refserver.EnqueueOptions{}))
	r = result(t, info)
	msg, _ := r["error"].(string)
	if info.State != "failed" || r["error_class"] != "device_error" {
		t.Fatalf("the executor itself past the limit: state %s, result %.600s", info.State, info.ResultBody)
	}
	switch {
	case strings.Contains(msg, "MemoryError"):
		// No cgroup here (not root): RLIMIT_AS made the allocation fail.
	case !strings.Contains(msg, "killed by the memory limit of 128 MiB"):
		t.Errorf("the error does not say the real limit (128 MiB) killed the executor: %q", msg)
	}
	t.Logf("the executor itself past the limit: %q", msg)
}
