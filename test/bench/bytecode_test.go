package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/testkit/testbin"
)

// realShim maps the shim's wire names to their place in a Metnos
// server's source tree (runtime/shim_manifest.py's shim_sources).
var realShim = map[string]string{
	"executor_helpers.py":        "runtime/executor_helpers.py",
	"executor_workers.py":        "runtime/executor_workers.py",
	"worker_policy.py":           "runtime/worker_policy.py",
	"messages.py":                "runtime/device_shim/messages.py",
	"messages_i18n.json":         "runtime/device_shim/messages_i18n.json",
	"path_alias.py":              "runtime/path_alias.py",
	"parallel_walk.py":           "runtime/parallel_walk.py",
	"tabular_projection.py":      "runtime/tabular_projection.py",
	"backends/__init__.py":       "runtime/backends/__init__.py",
	"backends/files/__init__.py": "runtime/backends/files/__init__.py",
	"backends/files/local.py":    "runtime/backends/files/local.py",
	"platform_policy.py":         "runtime/platform_policy.py",
	"config.py":                  "runtime/config.py",
}

// TestBytecodeRatio measures what compiled bytecode saves a real
// executor: Metnos's own list_dirs with Metnos's own shim (read from the
// server source tree METNOS_BENCH_METNOS points to, e.g. a checkout of
// the Metnos server; skipped without it), run by two metnos-agent
// processes paired with the reference server on loopback, one with
// bytecode (the default) and one with METNOS_BYTECODE=off, interleaved,
// METNOS_BENCH_BYTECODE_N invocations each (default 30) after 3
// warm-ups. It prints enqueue → done and the run in the sandbox
// (elapsed_ms) at the median, and the ratios with / without. It checks
// what a user would: both agents return the same listing, and the
// agent with bytecode keeps its executor's modules compiled. The
// numbers are information only.
//
//	METNOS_BENCH_METNOS=/path/to/metnos go test ./test/bench -run BytecodeRatio -count=1 -v
func TestBytecodeRatio(t *testing.T) {
	if testing.Short() {
		t.Skip("benchmark skipped under -short")
	}
	src := os.Getenv("METNOS_BENCH_METNOS")
	if src == "" {
		t.Skip("METNOS_BENCH_METNOS (a Metnos server source tree, for the real list_dirs and shim) is not set")
	}
	n := 30
	if s := os.Getenv("METNOS_BENCH_BYTECODE_N"); s != "" {
		fmt.Sscan(s, &n)
	}
	read := func(rel string) *fstest.MapFile {
		b, err := os.ReadFile(filepath.Join(src, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		return &fstest.MapFile{Data: b, Mode: 0o644}
	}
	executors := fstest.MapFS{}
	for _, f := range []string{"manifest.toml", "list_dirs.py", "path_alias.py"} {
		executors["list_dirs/"+f] = read("executors/list_dirs/" + f)
	}
	shim := fstest.MapFS{}
	for wire, rel := range realShim {
		shim[wire] = read(rel)
	}

	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if err := testbin.Build(dir, "-trimpath", "-ldflags=-s -w"); err != nil {
		t.Fatal(err)
	}
	srv, err := refserver.New(refserver.Config{Executors: executors, Shim: shim, PollCheck: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	type agent struct {
		name, home, device string
		log                bytes.Buffer
		totals, insides    []time.Duration
		payload            string
	}
	start := func(name string, extra ...string) *agent {
		a := &agent{name: name, home: filepath.Join(dir, name)}
		if err := os.Mkdir(a.home, 0o700); err != nil {
			t.Fatal(err)
		}
		// A folder worth listing: 40 files in 4 folders.
		for i := range 40 {
			p := filepath.Join(a.home, "docs", fmt.Sprintf("d%d", i%4), fmt.Sprintf("f%02d.txt", i))
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, bytes.Repeat([]byte("x"), i), 0o644)
			os.Chtimes(p, time.Unix(1_700_000_000, 0), time.Unix(1_700_000_000, 0))
		}
		for i := range 4 {
			os.Chtimes(filepath.Join(a.home, "docs", fmt.Sprintf("d%d", i)), time.Unix(1_700_000_000, 0), time.Unix(1_700_000_000, 0))
		}
		env := append(withoutEnv(withoutEnv(withoutEnv(os.Environ(), "HOME"), "XDG_DATA_HOME"), "XDG_CACHE_HOME"), "HOME="+a.home)
		env = append(withoutEnv(env, "METNOS_BYTECODE"), extra...)
		tok, _ := srv.IssueToken(name, time.Minute)
		reg := exec.Command(filepath.Join(dir, "metnos-agent"), "register", "--server", url, "--token", tok)
		reg.Env = env
		if out, err := reg.CombinedOutput(); err != nil {
			t.Fatalf("register: %v\n%s", err, out)
		}
		st, _ := pairing.LoadState(layout.Layout{Data: filepath.Join(a.home, ".local", "share", "metnos")})
		a.device = *st.DeviceID
		cmd := exec.Command(filepath.Join(dir, "metnos-agent"), "run")
		cmd.Env = append(env, "METNOS_LOG=warn")
		cmd.Stderr = &a.log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
		return a
	}
	on, off := start("bytecode"), start("source", "METNOS_BYTECODE=off")

	invoke := func(a *agent, keep bool) {
		args := map[string]any{"path": filepath.Join(a.home, "docs"), "recursive": true}
		begin := time.Now()
		id, err := srv.Enqueue(a.device, "list_dirs", args, refserver.EnqueueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		info, err := srv.Wait(ctx, id)
		total := time.Since(begin)
		if err != nil {
			t.Fatalf("%s: %v\nagent log:\n%s", a.name, err, a.log.String())
		}
		var r struct {
			OK      bool            `json:"ok"`
			Elapsed int64           `json:"elapsed_ms"`
			Payload json.RawMessage `json:"payload"`
		}
		json.Unmarshal(info.ResultBody, &r)
		if !r.OK {
			t.Fatalf("%s: list_dirs failed: %s\nagent log:\n%s", a.name, info.ResultBody, a.log.String())
		}
		// The listing names the folder, which differs between the two
		// homes: compare it with the home left out.
		a.payload = strings.ReplaceAll(string(r.Payload), a.home, "HOME")
		if keep {
			a.totals = append(a.totals, total)
			a.insides = append(a.insides, time.Duration(r.Elapsed)*time.Millisecond)
		}
	}
	for i := 0; i < 3+n; i++ {
		first, second := on, off
		if i%2 == 1 {
			first, second = off, on
		}
		invoke(first, i >= 3)
		invoke(second, i >= 3)
	}
	if on.payload != off.payload {
		t.Errorf("the listings differ:\nwith bytecode    %s\nwithout bytecode %s", on.payload, off.payload)
	}
	if !strings.Contains(on.payload, "f39.txt") {
		t.Errorf("the listing misses a file: %s", on.payload)
	}
	count := func(home string) (n int) {
		filepath.WalkDir(filepath.Join(home, ".cache", "metnos"), func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".pyc") {
				n++
			}
			return nil
		})
		return n
	}
	// path_alias.py (beside list_dirs.py) and the 12 modules of the shim.
	if got := count(on.home); got < 13 {
		t.Errorf("the agent with bytecode keeps %d .pyc files, want at least 13", got)
	}
	if got := count(off.home); got != 0 {
		t.Errorf("the agent without bytecode keeps %d .pyc files", got)
	}
	for _, a := range []*agent{on, off} {
		sort.Slice(a.totals, func(i, j int) bool { return a.totals[i] < a.totals[j] })
		sort.Slice(a.insides, func(i, j int) bool { return a.insides[i] < a.insides[j] })
	}
	var b strings.Builder
	fmt.Fprintf(&b, "list_dirs (Metnos's own, with its shim), %d invocations per agent, interleaved\n", n)
	fmt.Fprintf(&b, "  enqueue → done    with bytecode p50 %s   without p50 %s   ratio %.2f×\n", ms(pct(on.totals, 50)), ms(pct(off.totals, 50)), ratio(pct(on.totals, 50), pct(off.totals, 50)))
	fmt.Fprintf(&b, "  run in sandbox    with bytecode p50 %s   without p50 %s   ratio %.2f×   (elapsed_ms)\n", ms(pct(on.insides, 50)), ms(pct(off.insides, 50)), ratio(pct(on.insides, 50), pct(off.insides, 50)))
	t.Log("\n" + b.String())
}
