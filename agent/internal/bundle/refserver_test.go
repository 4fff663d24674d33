package bundle_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/agent/internal/bundle"
	"github.com/metnos/agent/client"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/wire"
)

// The reference server's bundles, checked with the device's own
// verification: what the server signs, the agent accepts, and what it
// serves changed without signing again, the agent refuses.

// testdata holds the reference server's test executors and shim.
const testdata = "../../../refserver/testdata"

// harness is a reference server on 127.0.0.1 and the device client's
// view of it.
type harness struct {
	t   *testing.T
	srv *refserver.Server
	url string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	srv, err := refserver.New(refserver.Config{Executors: os.DirFS(testdata + "/executors"), Shim: os.DirFS(testdata + "/shim")})
	if err != nil {
		t.Fatal(err)
	}
	url, err := srv.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return &harness{t: t, srv: srv, url: url}
}

// pair registers a fresh device key and returns its client.
func (h *harness) pair(name string) *client.Client {
	h.t.Helper()
	tok, err := h.srv.IssueToken(name, time.Minute)
	if err != nil {
		h.t.Fatal(err)
	}
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		h.t.Fatal(err)
	}
	reg, err := client.New(h.url, k, "", nil).Register(context.Background(), tok)
	if err != nil {
		h.t.Fatal(err)
	}
	return client.New(h.url, k, reg.DeviceID, nil)
}

func (h *harness) enqueue(d *client.Client, executor string, args any, o refserver.EnqueueOptions) string {
	h.t.Helper()
	id, err := h.srv.Enqueue(d.DeviceID(), executor, args, o)
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

// poll polls once without blocking.
func (h *harness) poll(d *client.Client) wire.PollResponse {
	h.t.Helper()
	r, err := d.Poll(context.Background(), "", 0)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// pollInvocation polls once and returns the parsed, verified invocation.
func (h *harness) pollInvocation(d *client.Client, _ any) wire.Invocation {
	h.t.Helper()
	r := h.poll(d)
	if r.Invocation == nil {
		h.t.Fatalf("poll: no invocation: %+v", r)
	}
	inv, err := wire.ParseInvocation(r.Invocation)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := inv.Verify(h.srv.PublicKey()); err != nil {
		h.t.Fatal(err)
	}
	return inv
}

func (h *harness) bundle(name string) wire.ExecutorBundle {
	h.t.Helper()
	b, err := client.New(h.url, nil, "", nil).Executor(context.Background(), name)
	if err != nil {
		h.t.Fatalf("GET executor %s: %v", name, err)
	}
	return b
}

func (h *harness) shim() wire.ShimBundle {
	h.t.Helper()
	b, err := client.New(h.url, nil, "", nil).Shim(context.Background())
	if err != nil {
		h.t.Fatalf("GET /agent/shim: %v", err)
	}
	return b
}

func TestExecutorBundleMaterializes(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	h.enqueue(d, "echo_args", map[string]any{"n": 1}, refserver.EnqueueOptions{})
	inv := h.pollInvocation(d, nil)
	cache := t.TempDir()
	ex, err := bundle.Materialize(layout.Layout{Cache: cache}, h.bundle("echo_args"), "echo_args", inv.ManifestSHA256, inv.CodeSHA256, h.srv.PublicKey())
	if err != nil {
		t.Fatalf("the agent refuses the bundle: %v", err)
	}
	if !strings.HasSuffix(ex.Entry, "echo_args.py") || len(ex.Manifest.Code.Files) != 2 {
		t.Errorf("executor %+v", ex)
	}
	// The code digest is sha256 over the [code].files in order, and the
	// manifest carries it in place of the placeholder, comments kept.
	main, _ := os.ReadFile(testdata + "/executors/echo_args/echo_args.py")
	helper, _ := os.ReadFile(testdata + "/executors/echo_args/lib/helper.py")
	sum := sha256.Sum256(append(main, helper...))
	if inv.CodeSHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("code_sha256 %s", inv.CodeSHA256)
	}
	manifest, _ := base64.StdEncoding.DecodeString(h.bundle("echo_args").ManifestTOML)
	orig, _ := os.ReadFile(testdata + "/executors/echo_args/manifest.toml")
	want := strings.Replace(string(orig), `digest = "sha256:0"  # placeholder`, `digest = "sha256:`+inv.CodeSHA256+`"`, 1)
	if string(manifest) != want {
		t.Errorf("signed manifest:\n%s\nwant:\n%s", manifest, want)
	}

	// Tampered code, served without signing again: the agent refuses it.
	if err := h.srv.SetExecutorFile("echo_args", "lib/helper.py", []byte("evil = 1\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Materialize(layout.Layout{Cache: cache}, h.bundle("echo_args"), "echo_args", inv.ManifestSHA256, inv.CodeSHA256, h.srv.PublicKey()); !errors.Is(err, bundle.ErrUnverified) {
		t.Errorf("tampered code: %v", err)
	}
	if err := h.srv.SetExecutorFile("echo_args", "manifest.toml", append(manifest, '\n')); err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Materialize(layout.Layout{Cache: cache}, h.bundle("echo_args"), "echo_args", inv.ManifestSHA256, inv.CodeSHA256, h.srv.PublicKey()); !errors.Is(err, bundle.ErrUnverified) {
		t.Errorf("tampered manifest: %v", err)
	}
	if err := h.srv.SetExecutorFile("nope", "x.py", nil); err == nil {
		t.Error("SetExecutorFile on an unknown executor")
	}
	// Reload serves the signed bundle again.
	if err := h.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Materialize(layout.Layout{Cache: cache}, h.bundle("echo_args"), "echo_args", inv.ManifestSHA256, inv.CodeSHA256, h.srv.PublicKey()); err != nil {
		t.Errorf("after Reload: %v", err)
	}
	// A manifest without a digest line gets one after [code].
	b, _ := base64.StdEncoding.DecodeString(h.bundle("move_files").ManifestTOML)
	_, cs, _ := h.srv.ExecutorDigests("move_files")
	if !strings.Contains(string(b), "[code]\ndigest = \"sha256:"+cs+"\"\nfiles = [\"move_files.py\"]") {
		t.Errorf("move_files manifest:\n%s", b)
	}
}

func TestShimInstallsAndTamperingIsRefused(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	b := h.shim()
	dir, digest, err := bundle.InstallShim(layout.Layout{Cache: t.TempDir()}, b, h.srv.PublicKey())
	if err != nil {
		t.Fatalf("the agent refuses the shim: %v", err)
	}
	if digest != b.SHA256 || digest != h.poll(d).ShimSHA256 {
		t.Errorf("digest %s, bundle %s", digest, b.SHA256)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "backends", "files", "local.py")); string(got) != "ROOT = \"local\"\n" {
		t.Errorf("local.py = %q", got)
	}
	if len(b.Files) != 4 {
		t.Errorf("shim files %v", b.Files)
	}

	// Changed without signing again: refused, and the announced digest stays.
	if err := h.srv.SetShimFile("executor_helpers.py", []byte("evil = 1\n"), false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := bundle.InstallShim(layout.Layout{Cache: t.TempDir()}, h.shim(), h.srv.PublicKey()); !errors.Is(err, bundle.ErrUnverified) {
		t.Errorf("tampered shim: %v", err)
	}
	if h.srv.ShimDigest() != digest {
		t.Error("an unsigned change moved the announced digest")
	}
	// Signed again (a server upgrade): accepted, new digest announced.
	if err := h.srv.SetShimFile("parallel_walk.py", []byte("X = 2\n"), true); err != nil {
		t.Fatal(err)
	}
	b2 := h.shim()
	_, digest2, err := bundle.InstallShim(layout.Layout{Cache: t.TempDir()}, b2, h.srv.PublicKey())
	if err != nil || digest2 == digest || digest2 != h.poll(d).ShimSHA256 || len(b2.Files) != 5 {
		t.Errorf("resigned shim: %v, %s vs %s", err, digest2, digest)
	}
	if err := h.srv.SetShimFile("../x.py", nil, true); err == nil {
		t.Error("unsafe shim path accepted")
	}
}

// TestDownloadRetried: a bundle GET that fails in a way that may pass
// (a 502, a connection cut halfway through the bundle) is tried again
// with the polls' backoff, and the bundle then verifies; one that will
// not pass (404) is not; and the retries stop at the invocation's
// deadline.
func TestDownloadRetried(t *testing.T) {
	h := newHarness(t)
	c := client.New(h.url, nil, "", nil)
	var calls int // the gate runs on the server's goroutine; each GET returns before the next
	answers := []int{502, refserver.CutAnswer}
	h.srv.SetExecutorGate(func(string) int {
		calls++
		if calls <= len(answers) {
			return answers[calls-1]
		}
		return 0
	})
	b, err := c.ExecutorUntil(context.Background(), "echo_args", time.Now().Add(20*time.Second))
	if err != nil {
		t.Fatalf("after a 502 and a cut: %v", err)
	}
	if calls != 3 {
		t.Errorf("%d GETs, want 3", calls)
	}
	ms, cs, _ := h.srv.ExecutorDigests("echo_args")
	cache := t.TempDir()
	if _, err := bundle.Materialize(layout.Layout{Cache: cache}, b, "echo_args", ms, cs, h.srv.PublicKey()); err != nil {
		t.Fatal(err)
	}

	calls = 0
	h.srv.SetExecutorGate(func(string) int { calls++; return 404 })
	if _, err := c.ExecutorUntil(context.Background(), "echo_args", time.Now().Add(20*time.Second)); err == nil || calls != 1 {
		t.Errorf("a 404: %v after %d GETs, want an error after 1", err, calls)
	}

	calls = 0
	h.srv.SetExecutorGate(func(string) int { calls++; return 503 })
	start := time.Now()
	_, err = c.ExecutorUntil(context.Background(), "echo_args", time.Now().Add(2*time.Second))
	if client.StatusOf(err) != 503 || !strings.Contains(err.Error(), "attempts") {
		t.Errorf("503 until the deadline: %v", err)
	}
	if calls < 2 || time.Since(start) > 2*time.Second {
		t.Errorf("%d GETs in %s: want retries, ending by the deadline", calls, time.Since(start))
	}
}
