package undo

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"
)

// realisticMasks are the ~50 paths a sandbox masks in a home folder.
func realisticMasks(home string) []string {
	var m []string
	for _, p := range []string{".ssh", ".gnupg", ".local/share/keyrings", ".password-store", ".aws", ".kube", ".docker", ".netrc",
		".config/gh", ".config/gcloud", ".mozilla", ".config/google-chrome", ".config/chromium", ".thunderbird", ".local/share/metnos",
		".config/metnos", ".cache/metnos", ".pki", ".git-credentials", ".npmrc", ".pypirc", ".cargo/credentials", ".bash_history",
		".zsh_history", ".python_history", ".lesshst", ".viminfo", ".mysql_history", ".psql_history", ".config/Signal", ".config/Slack",
		".config/discord", ".var/app", ".local/share/Trash", ".config/keepassxc", ".config/Bitwarden", ".config/1Password", ".electrum",
		".bitcoin", ".ethereum", ".config/rclone", ".config/syncthing", ".config/op", ".vault-token", ".terraform.d", ".azure", ".oci",
		".config/hub", ".config/spotify", ".wine"} {
		m = append(m, filepath.Join(home, p))
	}
	return m
}

// grow journals n invocations the way the agent's run loop does, with
// the begin record a real sandbox gives (~50 masks); when created is
// set, every other one creates a file, else none changes anything.
func grow(t testing.TB, j *Journal, home string, from, n int, created bool) []string {
	t.Helper()
	masks := realisticMasks(home)
	var ids []string
	for i := from; i < from+n; i++ {
		id := fmt.Sprintf("inv-%08d-4f1c-9a7e-1b2c3d4e5f60", i)
		if err := j.Begin(Begin{InvocationID: id, TurnID: fmt.Sprintf("turn-%d", i/5), Executor: "write_files",
			ManifestSHA256: "9f2c4e1a7b3d5f60718293a4b5c6d7e8f9012345678901234567890abcdef12", Reverse: []string{"delete_created_paths", "restore_blob_backup"},
			Roots: []string{filepath.Join(home, "Documents")}, Masks: masks, History: filepath.Join(home, ".local/share/metnos/_history")}); err != nil {
			t.Fatal(err)
		}
		var payload any = map[string]any{"results": []any{}}
		if created && i%2 == 0 {
			payload = map[string]any{"results": []any{map[string]any{"path": filepath.Join(home, "Documents", fmt.Sprintf("note-%d.txt", i)), "created": true}}}
		}
		if _, err := j.Finish(id, Outcome{OK: true, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// heapInUse is the live heap, after collecting garbage.
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// median is fn's median time over rounds.
func median(rounds int, fn func()) time.Duration {
	var ds []time.Duration
	for range rounds {
		s := time.Now()
		fn()
		ds = append(ds, time.Since(s))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// TestJournalCostDoesNotGrowWithHistory: an agent that ran 2,000
// journaled invocations (each with a sandbox's ~50 masked paths) keeps
// no more of the journal in memory than after 300, opens it (a restart)
// as fast as one of 10 entries, lists the newest 20 as fast, and wrote
// less than 1 KB for each invocation that changed nothing. Before, the
// journal kept every entry in memory (10.6 MiB at 2,000), read all of
// it at Open (81 ms against 0.3 ms) and for `history` (155 ms), and
// wrote 3.3 KB an entry.
func TestJournalCostDoesNotGrowWithHistory(t *testing.T) {
	const n = 2000
	home := t.TempDir()
	big, small := filepath.Join(t.TempDir(), "history"), filepath.Join(t.TempDir(), "history")

	// One process, as a long-running agent: the heap it keeps.
	j, err := Open(big)
	if err != nil {
		t.Fatal(err)
	}
	base := heapInUse()
	grow(t, j, home, 0, 300, false)
	at300 := heapInUse() - base
	grow(t, j, home, 300, n-300, false)
	atN := heapInUse() - base
	runtime.KeepAlive(j)
	perEntry := dirBytes(big) / n
	t.Logf("heap kept by the journal: %d KiB after 300 invocations, %d KiB after %d (+%d KiB); disk %d bytes an invocation that changed nothing",
		at300>>10, atN>>10, n, (atN-at300)>>10, perEntry)
	if atN-at300 > 2<<20 {
		t.Errorf("the journal's memory grew by %d KiB between 300 and %d invocations, more than 2 MiB", (atN-at300)>>10, n)
	}
	if perEntry > 1024 {
		t.Errorf("%d bytes of journal an invocation that changed nothing, more than 1 KB", perEntry)
	}

	js, err := Open(small)
	if err != nil {
		t.Fatal(err)
	}
	grow(t, js, home, 0, 10, true)

	// What a restart and `history` read from the disk: the count of
	// lines, not the time, is what must not grow with history (the
	// times are printed, for the eye).
	opened := func(dir string) int {
		j, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(j.Unfinished()) != 0 {
			t.Fatal("an entry left open")
		}
		return j.linesRead
	}
	listed := func(dir string, want int) int {
		j, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		// What `history` does: check the end, list, verify.
		if err := Check(dir); err != nil {
			t.Fatal(err)
		}
		if es, err := j.Newest(20); err != nil || len(es) != want {
			t.Fatalf("newest 20: %d entries, %v", len(es), err)
		}
		if rep, _, err := j.Untrusted(); err != nil || !rep.OK() {
			t.Fatalf("verify: %v %v", rep, err)
		}
		return j.linesRead
	}
	open := func(dir string) func() { return func() { opened(dir) } }
	newest := func(dir string, want int) func() { return func() { listed(dir, want) } }
	readSmall, readBig := opened(small), opened(big)
	listSmall, listBig := listed(small, 10), listed(big, 20)
	t.Logf("lines read: open %d with 10 entries, %d with %d; newest 20: %d with 10 entries, %d with %d",
		readSmall, readBig, n, listSmall, listBig, n)
	// A restart reads back to the last record with no run open (a
	// record or two); the newest 20 need their own records (a begin, a
	// change and a policy each at most): both far below the whole
	// journal's lines (two or more an invocation).
	if readBig > readSmall+2 {
		t.Errorf("a restart read %d lines of a journal of %d entries, against %d of one of 10", readBig, n, readSmall)
	}
	if listBig > 3*20+8 {
		t.Errorf("listing the newest 20 read %d lines of a journal of %d entries", listBig, n)
	}
	empty := filepath.Join(t.TempDir(), "history")
	openEmpty, openSmall, openBig := median(21, open(empty)), median(21, open(small)), median(21, open(big))
	histSmall, histBig := median(21, newest(small, 10)), median(21, newest(big, 20))
	t.Logf("open (a restart): %v empty, %v with 10 entries, %v with %d (%.2fx 10's, %.2fx empty's); history -n 20: %v with 10 entries, %v with %d (%.2fx)",
		openEmpty, openSmall, openBig, n, float64(openBig)/float64(openSmall), float64(openBig)/float64(openEmpty),
		histSmall, histBig, n, float64(histBig)/float64(histSmall))
}
