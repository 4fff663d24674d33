package refserver

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/metnos/agent/wire"
)

func TestExecutorEndpointErrors(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		name   string
		status int
		code   string
	}{
		{"Echo_args", 400, wire.CodeInvalidName},
		{"e", 400, wire.CodeInvalidName},
		{"9lives", 400, wire.CodeInvalidName},
		{strings.Repeat("a", 66), 400, wire.CodeInvalidName},
		{"no_such_executor", 404, wire.CodeUnknownExecutor},
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
