//go:build linux

package e2e

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/testkit/pbstest"
)

// TestPairing: register writes state.json as the Rust client does, and
// whoami shows both fingerprints, labelled; a bad token fails with one
// clear sentence and leaves the pairing alone.
func TestPairing(t *testing.T) {
	w := newWorld(t)
	code, out := w.cli("register", "--server", w.url, "--token", "DEV.bad.token")
	if code != 1 || !strings.Contains(out, "refused the pairing token") {
		t.Fatalf("a bad token: exit %d, want 1 with a clear sentence:\n%s", code, out)
	}
	w.pair()
	st, err := pairing.LoadState(layout.Layout{Data: w.dataDir()})
	if err != nil || !st.Paired() || *st.DeviceID != w.device || *st.ServerURL != w.url {
		t.Fatalf("state.json after pairing: %+v (%v)", st, err)
	}
	dev, _ := w.srv.Device(w.device)
	if *st.Fingerprint != dev.Fingerprint {
		t.Errorf("state.json fingerprint %s, the server's %s", *st.Fingerprint, dev.Fingerprint)
	}
	if sk, err := st.ServerKey(); err != nil || !sk.Equal(w.srv.PublicKey()) {
		t.Errorf("the pinned server key is not the server's: %v", err)
	}
	code, out = w.cli("whoami")
	for _, want := range []string{w.device, "e2e-laptop", w.url, "device key (hex):", "server fingerprint:  " + dev.Fingerprint} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("whoami lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	// A second bad registration leaves the pairing as it was.
	if code, _ := w.cli("register", "--server", w.url, "--token", "DEV.x.y"); code == 0 {
		t.Fatal("a bad token was accepted")
	}
	if st2, _ := pairing.LoadState(layout.Layout{Data: w.dataDir()}); *st2.DeviceID != w.device {
		t.Fatal("a failed registration changed the pairing")
	}
	code, out = w.cli("unpair")
	if code != 0 || !strings.Contains(out, "unpaired") {
		t.Fatalf("unpair: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(w.dataDir(), "key")); err != nil {
		t.Fatal("unpair removed the device key")
	}
	if code, out := w.cli("run"); code != 1 || !strings.Contains(out, "not paired") {
		t.Fatalf("run on an unpaired device: exit %d\n%s", code, out)
	}
}

// TestExecuteDone: an invocation runs in the full sandbox and its result
// is delivered; the heartbeat reports the machine's sandbox and Python.
func TestExecuteDone(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	id := w.enqueue("echo_args", map[string]any{"q": "città", "n": 3}, refserver.EnqueueOptions{TurnID: "turn-1"})
	info := w.wait(id)
	r := result(t, info)
	if info.State != "done" || r["ok"] != true {
		t.Fatalf("state %s, result %s", info.State, info.ResultBody)
	}
	if r["sandbox"] != bestSandbox() {
		t.Errorf("sandbox %v, want this machine's best %s", r["sandbox"], bestSandbox())
	}
	// A run with every layer says no more; one on a machine that lacks
	// a layer says which.
	if reason, ok := r["sandbox_downgrade_reason"]; ok == (bestSandbox() == fullSandbox) {
		t.Errorf("downgrade reason %v on a %s run, on a machine whose best is %s", reason, r["sandbox"], bestSandbox())
	}
	echo := r["entries"].([]any)[0].(map[string]any)["echo"].(map[string]any)
	if echo["q"] != "città" || echo["n"] != float64(3) {
		t.Errorf("the executor saw %v", echo)
	}
	dev, _ := w.srv.Device(w.device)
	prof := dev.Profile
	if prof["sandbox_level"] != bestSandbox() || prof["python"] == "" || prof["client_version"] == nil {
		t.Errorf("heartbeat profile %v", dev.Profile)
	}
	if _, err := os.Stat(filepath.Join(w.dataDir(), "client.log")); err != nil {
		t.Errorf("no log file in the data dir: %v", err)
	}
	// A second agent for the same user exits 3.
	if code, out := w.cli("run"); code != 3 {
		t.Errorf("a second agent: exit %d, want 3\n%s", code, out)
	}
	p.stop(t)
	if pending, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "results", "*")); len(pending) != 0 {
		t.Errorf("delivered results left in the spool: %v", pending)
	}
}

// TestExecutorEnvironment: the executor gets the environment of docs/protocol.md §8,
// can write its user data folder, and cannot read the device key.
func TestExecutorEnvironment(t *testing.T) {
	w := newWorld(t)
	w.pair()
	w.start()
	key := filepath.Join(w.dataDir(), "key")
	id := w.enqueue("print_env", map[string]any{"probe": []any{key}}, refserver.EnqueueOptions{Env: map[string]string{"METNOS_LANG": "it", "METNOS_USER_DATA": "/evil"}})
	r := result(t, w.wait(id))
	p, _ := r["payload"].(map[string]any)
	env, _ := p["env"].(map[string]any)
	data := filepath.Join(w.dataDir(), "shimdata")
	for k, want := range map[string]string{
		"METNOS_LANG": "it", "METNOS_USER_DATA": data, "METNOS_WORKSPACE": filepath.Join(data, "workspace"),
		"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUTF8": "1", "HOME": w.home,
	} {
		if env[k] != want {
			t.Errorf("%s=%v, want %s", k, env[k], want)
		}
	}
	if !strings.HasPrefix(env["PYTHONPATH"].(string), filepath.Join(w.cacheDir(), "shim")) {
		t.Errorf("PYTHONPATH %v", env["PYTHONPATH"])
	}
	if p["wrote_user_data"] != true {
		t.Error("the executor could not write its user data folder")
	}
	if seen := p["seen"].(map[string]any)[key].(string); !strings.HasPrefix(seen, "error") {
		t.Errorf("the executor read the device key: %s", seen)
	}
	if p["cwd"] != filepath.Join(data, "workspace") {
		t.Errorf("cwd %v", p["cwd"])
	}
}

// TestDurableIDDoesNotBlock: an invocation with a durable id runs, and
// so do the ordinary ones queued after it (docs/protocol.md §17.1).
func TestDurableIDDoesNotBlock(t *testing.T) {
	w := newWorld(t)
	w.pair()
	w.start()
	first := w.enqueue("echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{})
	w.wait(first)
	durable := w.enqueue("echo_args", map[string]any{"i": 2}, refserver.EnqueueOptions{ID: "inv-durable-0123456789abcdef0123456789abcdef"})
	if info := w.wait(durable); info.State != "done" {
		t.Fatalf("the durable invocation: %s %s", info.State, info.ResultBody)
	}
	for i := 3; i < 5; i++ {
		id := w.enqueue("echo_args", map[string]any{"i": i}, refserver.EnqueueOptions{})
		if info := w.wait(id); info.State != "done" {
			t.Fatalf("invocation %d after the durable one: %s", i, info.State)
		}
	}
}

// TestOversizedResult: a result over the server's 4 MiB is cut to fit,
// says so, and is delivered rather than dead-lettered.
func TestOversizedResult(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	id := w.enqueue("big_output", map[string]any{"bytes": 5 << 20}, refserver.EnqueueOptions{})
	info := w.wait(id)
	r := result(t, info)
	if info.State != "failed" || r["error_class"] != "result_too_large" || !strings.Contains(r["error"].(string), "limit") {
		t.Fatalf("state %s, result %.300s", info.State, info.ResultBody)
	}
	if dead, _ := filepath.Glob(filepath.Join(w.dataDir(), "spool", "dead-results", "*")); len(dead) != 0 {
		t.Errorf("dead-lettered: %v", dead)
	}
	time.Sleep(100 * time.Millisecond)
	if !logHas(p, "4 MiB") {
		t.Error("the log does not say the result was cut")
	}
}

// TestDeadline: at the deadline the whole tree dies, the detached
// grandchild included, and the result says timeout.
func TestDeadline(t *testing.T) {
	w := newWorld(t)
	w.pair()
	w.start()
	id := w.enqueue("sleeper", map[string]any{"folder": w.work}, refserver.EnqueueOptions{DeadlineMS: 3000})
	info := w.wait(id)
	r := result(t, info)
	if r["error_class"] != "timeout" || r["sandbox"] != bestSandbox() {
		t.Fatalf("result %s", info.ResultBody)
	}
	b, err := os.ReadFile(filepath.Join(w.work, "pids"))
	if err != nil {
		t.Fatalf("the executor never started its tree: %v", err)
	}
	// The pids are the sandbox's own (a PID namespace); check that no
	// process of that tree survives on the host by its command line.
	_ = b
	time.Sleep(200 * time.Millisecond)
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		cl, _ := os.ReadFile(c)
		if strings.Contains(string(cl), "time.sleep(3600)") {
			t.Errorf("a process of the timed-out tree survives: %s %q", c, cl)
		}
	}
}

// TestRevocation: a revoked device gets no more work.
func TestRevocation(t *testing.T) {
	w := newWorld(t)
	w.pair()
	p := w.start()
	w.wait(w.enqueue("echo_args", map[string]any{}, refserver.EnqueueOptions{}))
	if err := w.srv.Revoke(w.device); err != nil {
		t.Fatal(err)
	}
	id := w.enqueue("echo_args", map[string]any{}, refserver.EnqueueOptions{})
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !logHas(p, "unknown_device") {
		time.Sleep(50 * time.Millisecond)
	}
	if !logHas(p, "unknown_device") {
		t.Error("the agent's log does not say the server no longer knows it")
	}
	if info, _ := w.srv.Invocation(id); info.State != "queued" || info.Deliveries != 0 {
		t.Errorf("a revoked device got work: %+v", info.State)
	}
}

// TestWeakerSandbox: on a machine without a usable bubblewrap (here:
// the agent is pointed at one that fails), results name the layers
// really applied and say why, the heartbeat reports the same, and an
// executor whose manifest asks for the full sandbox is refused rather
// than run weaker; with the full sandbox it runs.
func TestWeakerSandbox(t *testing.T) {
	// The first agent's last long-poll can outlive its process on the
	// server's side for a moment; an invocation it claims then is lost
	// to it and handed out again after its deadline and the grace, as
	// the protocol says. Short ones keep that within the test's wait.
	w := newWorld(t, func(c *refserver.Config) { c.RedeliveryGrace = time.Second })
	short := refserver.EnqueueOptions{DeadlineMS: 20000}
	needFull(t, "this test takes bubblewrap away from a run that had it")
	w.pair()
	p := w.start()
	if info := w.wait(w.enqueue("needs_full", map[string]any{}, refserver.EnqueueOptions{})); info.State != "done" {
		t.Fatalf("with the full sandbox: %s", info.ResultBody)
	}
	p.stop(t)

	t.Setenv("METNOS_BWRAP", "/bin/false")
	w.start()
	r := result(t, w.wait(w.enqueue("echo_args", map[string]any{}, short)))
	reason, _ := r["sandbox_downgrade_reason"].(string)
	if r["ok"] != true || r["sandbox"] != "landlock+seccomp" || !strings.Contains(reason, "bwrap") {
		t.Fatalf("without bwrap: sandbox %v, reason %q", r["sandbox"], reason)
	}
	dev, _ := w.srv.Device(w.device)
	if dev.Profile["sandbox_level"] != "landlock+seccomp" {
		t.Errorf("heartbeat sandbox_level %v", dev.Profile["sandbox_level"])
	}
	info := w.wait(w.enqueue("needs_full", map[string]any{}, short))
	r = result(t, info)
	if info.State != "failed" || r["error_class"] != "device_error" || !strings.Contains(r["error"].(string), "minimum sandbox \"") {
		t.Fatalf("min_sandbox full without bwrap: %s", info.ResultBody)
	}
}

// TestOrganizeAndUndo: the demo's chain with the agent as a process, in
// the full sandbox and without bwrap: photos sorted into YYYY/MM (one
// file replaced, its backup blob kept on the device), then the server's
// undo puts every file, name, mode and byte back and removes the
// folders it created.
func TestOrganizeAndUndo(t *testing.T) {
	// Inside bwrap /tmp is the command's own, so the folder lives in
	// /var/tmp, as the demo's does.
	t.Setenv("TMPDIR", "/var/tmp")
	for _, mode := range []struct{ name, bwrap string }{{"full", ""}, {"landlock-only", "/bin/false"}} {
		t.Run(mode.name, func(t *testing.T) {
			w := newWorld(t)
			t.Setenv("METNOS_BWRAP", mode.bwrap)
			w.pair()
			w.start()
			photos := filepath.Join(w.work, "photos")
			if err := examples.GeneratePhotos(photos, examples.DemoPhotos()); err != nil {
				t.Fatal(err)
			}
			old := filepath.Join(photos, "2024", "07", "vacanza_mare.jpg")
			os.MkdirAll(filepath.Dir(old), 0o755)
			os.WriteFile(old, []byte("an older edit\n"), 0o640)
			before := tree(t, photos)
			const turn = "turn-e2e"
			info := w.wait(w.enqueue("organize_photos", map[string]any{"folder": photos},
				refserver.EnqueueOptions{TurnID: turn, Reversibility: "revertible", Env: map[string]string{"METNOS_TURN_ID": turn}}))
			r := result(t, info)
			if info.State != "done" || r["n_processed"] != float64(8) {
				t.Fatalf("organize: %s", info.ResultBody)
			}
			blobs, _ := filepath.Glob(filepath.Join(w.dataDir(), "shimdata", "_history", turn, "blob", "*.bin"))
			if len(blobs) != 1 {
				t.Fatalf("backup blobs on the device: %v", blobs)
			}
			if tree(t, photos) == before {
				t.Fatal("organize changed nothing")
			}
			plan, err := w.srv.Undo(w.device, turn, refserver.EnqueueOptions{})
			if err != nil || len(plan.IDs) != 3 || len(plan.Unsupported) != 0 {
				t.Fatalf("undo plan: %+v %v", plan, err)
			}
			for _, id := range plan.IDs {
				if info := w.wait(id); info.State != "done" {
					t.Fatalf("undo step %s: %s", info.Executor, info.ResultBody)
				}
			}
			if after := tree(t, photos); after != before {
				t.Fatalf("the folder is not restored:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// tree describes every entry under root: path, mode, content.
func tree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fmt.Fprintf(&b, "%s %v", rel, fi.Mode())
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(data))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestProvisionedRuntime: the runtime the server signs a descriptor for
// is downloaded, verified and installed by the agent at start
// (METNOS_PYTHON_RUNTIME, as the installers set it), and executors run
// with it in the sandbox; the heartbeat says so.
func TestProvisionedRuntime(t *testing.T) {
	rtDir := t.TempDir()
	var buf bytes.Buffer
	ver, err := pbstest.Write(&buf, gzip.BestSpeed)
	if err != nil {
		t.Skip(err)
	}
	name := "cpython-" + ver + ".0+e2e-x86_64-unknown-linux-gnu-install_only.tar.gz"
	if err := os.WriteFile(filepath.Join(rtDir, name), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, func(c *refserver.Config) { c.RuntimeDir = rtDir })
	w.pair()
	t.Setenv("METNOS_PYTHON_RUNTIME", name)
	p := w.start()
	info := w.wait(w.enqueue("echo_args", map[string]any{"q": 1}, refserver.EnqueueOptions{}))
	r := result(t, info)
	if info.State != "done" || r["sandbox"] != bestSandbox() {
		t.Fatalf("%s", info.ResultBody)
	}
	dev, _ := w.srv.Device(w.device)
	py, _ := dev.Profile["python"].(string)
	if dev.Profile["python_source"] != "provisioned" || !strings.HasPrefix(py, filepath.Join(w.cacheDir(), "runtime", "versions")) {
		t.Fatalf("heartbeat python %v (%v)", py, dev.Profile["python_source"])
	}
	if !logHas(p, "python runtime installed") {
		t.Error("the log does not say the runtime was installed")
	}
	if code, out := w.cli("runtime", "status"); code != 0 || !strings.Contains(out, "(provisioned)") {
		t.Errorf("runtime status: exit %d\n%s", code, out)
	}
}
