//go:build linux

package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/wire"
)

// refusedNothingRan checks that an invocation failed with errClass and
// that the mutating executor left no trace.
func (w *world) refusedNothingRan(t *testing.T, id, errClass, why string) {
	t.Helper()
	info := w.wait(id)
	r := result(t, info)
	if info.State != "failed" || r["error_class"] != errClass || !strings.Contains(r["error"].(string), why) {
		t.Errorf("want a %s failure saying %q, got %s", errClass, why, info.ResultBody)
	}
	if l := lines(t, filepath.Join(w.work, "ran.log")); len(l) != 0 {
		t.Errorf("the executor ran: %v", l)
	}
}

// TestTampering: whatever is changed between the server and the
// device — the pinned key, an executor bundle, the shim, an invocation
// — nothing runs, and the server learns why.
func TestTampering(t *testing.T) {
	args := func(w *world) map[string]any { return map[string]any{"folder": w.work, "tag": "t"} }

	t.Run("corrupted-pinned-key", func(t *testing.T) {
		w := newWorld(t)
		w.pair()
		st, _ := pairing.LoadState(layout.Layout{Data: w.dataDir()})
		other, _, _ := ed25519.GenerateKey(rand.Reader)
		k := wire.PublicKeyWire(other)
		st.ServerPublicKey = &k
		if err := pairing.SaveState(layout.Layout{Data: w.dataDir()}, st); err != nil {
			t.Fatal(err)
		}
		w.start()
		w.refusedNothingRan(t, w.enqueue("touch_once", args(w), refserver.EnqueueOptions{}), "invocation_refused", "signature")
	})

	t.Run("tampered-invocation", func(t *testing.T) {
		w := newWorld(t)
		w.pair()
		id := w.enqueue("touch_once", args(w), refserver.EnqueueOptions{})
		w.srv.TamperInvocation(id, func(o map[string]any) { o["args"].(map[string]any)["tag"] = "evil" })
		w.start()
		w.refusedNothingRan(t, id, "invocation_refused", "signature")
	})

	t.Run("tampered-bundle", func(t *testing.T) {
		w := newWorld(t)
		w.pair()
		w.srv.SetExecutorFile("touch_once", "touch_once.py", []byte("import os\nopen(os.path.join(__import__('json').load(__import__('sys').stdin)['folder'], 'ran.log'), 'a').write('evil\\n')\n"))
		w.start()
		w.refusedNothingRan(t, w.enqueue("touch_once", args(w), refserver.EnqueueOptions{}), "device_error", "does not verify")
	})

	t.Run("tampered-cache", func(t *testing.T) {
		w := newWorld(t)
		w.pair()
		w.start()
		w.wait(w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "first"}, refserver.EnqueueOptions{}))
		cached, _ := filepath.Glob(filepath.Join(w.cacheDir(), "executors", "touch_once-*", "touch_once.py"))
		if len(cached) != 1 {
			t.Fatalf("cache entries: %v", cached)
		}
		if err := os.WriteFile(cached[0], []byte("import sys; print('{\"ok\": true}')\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		// The changed cache entry is refused, dropped and fetched again:
		// the real executor runs.
		info := w.wait(w.enqueue("touch_once", map[string]any{"folder": w.work, "tag": "second"}, refserver.EnqueueOptions{}))
		if info.State != "done" {
			t.Fatalf("%s", info.ResultBody)
		}
		if l := lines(t, filepath.Join(w.work, "ran.log")); len(l) != 2 || l[1] != "second" {
			t.Fatalf("ran.log %v: the tampered cache entry was used", l)
		}
	})

	t.Run("tampered-shim", func(t *testing.T) {
		w := newWorld(t)
		w.pair()
		if err := w.srv.SetShimFile("executor_helpers.py", []byte("import os\nos.system('touch /tmp/pwned')\n"), false); err != nil {
			t.Fatal(err)
		}
		w.start()
		w.refusedNothingRan(t, w.enqueue("touch_once", args(w), refserver.EnqueueOptions{}), "device_error", "shim")
	})

	t.Run("executor-with-dependencies", func(t *testing.T) {
		w := newWorld(t)
		w.pair()
		w.start()
		w.refusedNothingRan(t, w.enqueue("with_deps", args(w), refserver.EnqueueOptions{}), "device_error", "dependencies")
	})
}
