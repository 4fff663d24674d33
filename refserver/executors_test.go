package refserver

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/metnos/agent/agent"
)

func (h *harness) bundle(name string) agent.Bundle {
	h.t.Helper()
	st, b, _ := h.do("GET", "/agent/executor/"+name, nil, nil)
	if st != 200 {
		h.t.Fatalf("GET executor %s: %d %s", name, st, b)
	}
	var out agent.Bundle
	if err := json.Unmarshal(b, &out); err != nil {
		h.t.Fatal(err)
	}
	return out
}

func TestExecutorBundleMaterializes(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	h.enqueue(d, "echo_args", map[string]any{"n": 1}, EnqueueOptions{})
	inv := h.pollInvocation(d, nil)
	cache := t.TempDir()
	ex, err := agent.Materialize(cache, h.bundle("echo_args"), "echo_args", inv.ManifestSHA256, inv.CodeSHA256, h.srv.PublicKey())
	if err != nil {
		t.Fatalf("the agent refuses the bundle: %v", err)
	}
	if !strings.HasSuffix(ex.Entry, "echo_args.py") || len(ex.Manifest.Code.Files) != 2 {
		t.Errorf("executor %+v", ex)
	}
	// The code digest is sha256 over the [code].files in order, and the
	// manifest carries it in place of the placeholder, comments kept.
	main, _ := os.ReadFile("testdata/executors/echo_args/echo_args.py")
	helper, _ := os.ReadFile("testdata/executors/echo_args/lib/helper.py")
	sum := sha256.Sum256(append(main, helper...))
	if inv.CodeSHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("code_sha256 %s", inv.CodeSHA256)
	}
	manifest, _ := base64.StdEncoding.DecodeString(h.bundle("echo_args").ManifestTOML)
	orig, _ := os.ReadFile("testdata/executors/echo_args/manifest.toml")
	want := strings.Replace(string(orig), `digest = "sha256:0"  # placeholder`, `digest = "sha256:`+inv.CodeSHA256+`"`, 1)
	if string(manifest) != want {
		t.Errorf("signed manifest:\n%s\nwant:\n%s", manifest, want)
	}

	// Tampered code, served without signing again: the agent refuses it.
	if err := h.srv.SetExecutorFile("echo_args", "lib/helper.py", []byte("evil = 1\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Materialize(cache, h.bundle("echo_args"), "echo_args", inv.ManifestSHA256, inv.CodeSHA256, h.srv.PublicKey()); !errors.Is(err, agent.ErrUnverified) {
		t.Errorf("tampered code: %v", err)
	}
	if err := h.srv.SetExecutorFile("echo_args", "manifest.toml", append(manifest, '\n')); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Materialize(cache, h.bundle("echo_args"), "echo_args", inv.ManifestSHA256, inv.CodeSHA256, h.srv.PublicKey()); !errors.Is(err, agent.ErrUnverified) {
		t.Errorf("tampered manifest: %v", err)
	}
	if err := h.srv.SetExecutorFile("nope", "x.py", nil); err == nil {
		t.Error("SetExecutorFile on an unknown executor")
	}
	// Reload serves the signed bundle again.
	if err := h.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Materialize(cache, h.bundle("echo_args"), "echo_args", inv.ManifestSHA256, inv.CodeSHA256, h.srv.PublicKey()); err != nil {
		t.Errorf("after Reload: %v", err)
	}
	// A manifest without a digest line gets one after [code].
	b, _ := base64.StdEncoding.DecodeString(h.bundle("move_files").ManifestTOML)
	_, cs, _ := h.srv.ExecutorDigests("move_files")
	if !strings.Contains(string(b), "[code]\ndigest = \"sha256:"+cs+"\"\nfiles = [\"move_files.py\"]") {
		t.Errorf("move_files manifest:\n%s", b)
	}
}

func TestExecutorEndpointErrors(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		name   string
		status int
		code   string
	}{
		{"Echo_args", 400, ErrInvalidName},
		{"e", 400, ErrInvalidName},
		{"9lives", 400, ErrInvalidName},
		{strings.Repeat("a", 66), 400, ErrInvalidName},
		{"no_such_executor", 404, ErrUnknownExecutor},
	}
	for _, c := range cases {
		st, b, _ := h.do("GET", "/agent/executor/"+c.name, nil, nil)
		if m := h.object(b); st != c.status || m["error"] != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, st, b, c.status, c.code)
		}
	}
	if got := h.srv.Executors(); strings.Join(got, ",") != "delete_dirs,delete_files,echo_args,move_files,write_files" {
		t.Errorf("executors %v", got)
	}
}

func TestSetCodeDigest(t *testing.T) {
	const d = "sha256:abc"
	cases := []struct {
		name, in, want string
	}{
		{"replace", "name = \"x\"\n[code]\nfiles = [\"a.py\"]\ndigest = \"sha256:0\"\n", "name = \"x\"\n[code]\nfiles = [\"a.py\"]\ndigest = \"sha256:abc\"\n"},
		{"insert", "[code]\nfiles = [\"a.py\"]\n\n[placement]\nmin_sandbox = \"none\"\n", "[code]\ndigest = \"sha256:abc\"\nfiles = [\"a.py\"]\n\n[placement]\nmin_sandbox = \"none\"\n"},
		{"other table's digest untouched", "[code]\nfiles = []\n[other]\ndigest = \"keep\"\n", "[code]\ndigest = \"sha256:abc\"\nfiles = []\n[other]\ndigest = \"keep\"\n"},
		{"digest before [code] untouched", "digest = \"top\"\n[code] # code\n  digest = \"old\"\n", "digest = \"top\"\n[code] # code\ndigest = \"sha256:abc\"\n"},
		{"CRLF", "[code]\r\nfiles = []\r\n", "[code]\r\ndigest = \"sha256:abc\"\r\nfiles = []\r\n"},
		{"header at EOF", "[code]", "[code]\ndigest = \"sha256:abc\"\n"},
		{"array of tables is not [code]", "[[code]]\n", ""},
	}
	for _, c := range cases {
		got, err := SetCodeDigest([]byte(c.in), d)
		if c.want == "" {
			if err == nil {
				t.Errorf("%s: no error", c.name)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}

func TestLoadExecutorErrors(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	cases := []struct {
		name string
		fs   fstest.MapFS
		want string
	}{
		{"bad folder name", fstest.MapFS{"Bad/manifest.toml": file("[code]\nfiles=[\"a.py\"]\n"), "Bad/a.py": file("")}, "Bad"},
		{"no manifest", fstest.MapFS{"ex_a/a.py": file("")}, "ex_a"},
		{"missing code file", fstest.MapFS{"ex_b/manifest.toml": file("[code]\nfiles=[\"a.py\"]\n")}, "ex_b"},
		{"name mismatch", fstest.MapFS{"ex_c/manifest.toml": file("name = \"other\"\n[code]\nfiles=[\"a.py\"]\n"), "ex_c/a.py": file("")}, "ex_c"},
		{"no files", fstest.MapFS{"ex_d/manifest.toml": file("[code]\nfiles=[]\n")}, "ex_d"},
		{"unsafe path", fstest.MapFS{"ex_e/manifest.toml": file("[code]\nfiles=[\"../a.py\"]\n")}, "ex_e"},
		{"bad reverse_pattern", fstest.MapFS{"ex_f/manifest.toml": file("reverse_pattern = 3\n[code]\nfiles=[\"a.py\"]\n"), "ex_f/a.py": file("")}, "ex_f"},
		{"bad TOML", fstest.MapFS{"ex_g/manifest.toml": file("[code\n")}, "ex_g"},
	}
	for _, c := range cases {
		_, err := New(Config{Executors: c.fs})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to name %s", c.name, err, c.want)
		}
	}
	s, err := New(Config{Executors: fstest.MapFS{
		"ok_ex/manifest.toml": file("reverse_pattern = [\"swap_src_dst\", \"delete_created_dirs\"]\n[code]\nfiles=[\"a.py\"]\n"),
		"ok_ex/a.py":          file("print(1)\n"),
		"README.md":           file("not an executor"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if p := s.executors["ok_ex"].reversePattern; strings.Join(p, ",") != "swap_src_dst,delete_created_dirs" {
		t.Errorf("reverse_pattern %v", p)
	}
}
