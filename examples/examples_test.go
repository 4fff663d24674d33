package examples

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	toml "github.com/pelletier/go-toml/v2"
)

// manifest is what the tests read of an executor's manifest.toml.
type manifest struct {
	Name           string   `toml:"name"`
	Description    string   `toml:"description"`
	ReversePattern []string `toml:"reverse_pattern"`
	Code           struct {
		Files  []string `toml:"files"`
		Digest string   `toml:"digest"`
	} `toml:"code"`
	Capabilities []struct {
		Name string   `toml:"name"`
		Hint []string `toml:"hint"`
	} `toml:"capabilities"`
	Placement struct {
		MinSandbox string `toml:"min_sandbox"`
	} `toml:"placement"`
}

// result is the union of the executors' output shapes.
type result struct {
	OK          bool             `json:"ok"`
	Error       string           `json:"error"`
	ErrorClass  string           `json:"error_class"`
	OKCount     int              `json:"ok_count"`
	FailCount   int              `json:"fail_count"`
	Skipped     int              `json:"skipped"`
	Replaced    int              `json:"replaced"`
	Duplicates  int              `json:"duplicates"`
	Python      string           `json:"python"`
	Path        string           `json:"path"`
	Entries     []map[string]any `json:"entries"`
	Results     []row            `json:"results"`
	Failed      []failure        `json:"failed"`
	DirsCreated []string         `json:"dirs_created"`
}

type row struct {
	Src        string `json:"src"`
	Dst        string `json:"dst"`
	Path       string `json:"path"`
	Removed    bool   `json:"removed"`
	Date       string `json:"date"`
	DateSource string `json:"date_source"`
	Replaced   bool   `json:"replaced"`
	Duplicate  bool   `json:"duplicate"`
	BlobPath   string `json:"blob_path"`
	BlobSHA256 string `json:"blob_sha256"`
	Mode       uint32 `json:"mode"`
	MtimeNs    int64  `json:"mtime_ns"`
	AtimeNs    int64  `json:"atime_ns"`
	Size       int64  `json:"size"`
}

type failure struct {
	Index int    `json:"index"`
	Src   any    `json:"src"`
	Path  string `json:"path"`
	Error string `json:"error"`
}

var executorNames = []string{"echo_args", "list_folder", "organize_photos", "move_files", "delete_dirs", "delete_files", "write_files", "create_dirs"}

// runner runs the embedded executors, copied to a temporary directory, as
// the agent does (docs/protocol.md §8): `<python> <entry>`, environment cleared, args on
// stdin.
type runner struct {
	py, root, shim, data string
}

func newRunner(t *testing.T) *runner {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		if py, err = exec.LookPath("python3"); err != nil {
			t.Skip("no python3")
		}
	}
	root := t.TempDir()
	r := &runner{py: py, root: root, shim: filepath.Join(root, "shim"), data: filepath.Join(root, "shimdata")}
	if err := os.CopyFS(r.shim, Shim); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(root, "executors"), Executors); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(r.data, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // PYTHONDONTWRITEBYTECODE: nothing may be compiled next to the code
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && (d.Name() == "__pycache__" || strings.HasSuffix(p, ".pyc")) {
				t.Errorf("bytecode written: %s", p)
			}
			return nil
		})
	})
	return r
}

func (r *runner) dir(name string) string { return filepath.Join(r.root, "executors", name) }

func readManifest(t *testing.T, fsys fs.FS, name string) manifest {
	t.Helper()
	b, err := fs.ReadFile(fsys, path.Join(name, "manifest.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := toml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s/manifest.toml: %v", name, err)
	}
	return m
}

// runRaw runs executor name with stdin; env ("K=V") overrides the
// defaults, and "K=" clears K.
func (r *runner) runRaw(t *testing.T, name string, stdin []byte, env ...string) (stdout, stderr []byte) {
	t.Helper()
	m := readManifest(t, Executors, name)
	vars := map[string]string{
		"PATH":                    os.Getenv("PATH"),
		"PYTHONPATH":              r.shim + string(os.PathListSeparator) + r.dir(name),
		"METNOS_USER_DATA":        r.data,
		"METNOS_TURN_ID":          "turn-1",
		"PYTHONDONTWRITEBYTECODE": "1",
	}
	if vars["PATH"] == "" {
		vars["PATH"] = "/usr/bin:/bin"
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if v == "" {
			delete(vars, k)
		} else {
			vars[k] = v
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.py, filepath.Join(r.dir(name), m.Code.Files[0]))
	cmd.Env = []string{}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run() // the exit code is not part of the protocol (docs/protocol.md §8)
	if ctx.Err() != nil {
		t.Fatalf("%s: timed out", name)
	}
	return out.Bytes(), errb.Bytes()
}

// run marshals args, runs the executor and parses its one JSON line.
func (r *runner) run(t *testing.T, name string, args any, env ...string) result {
	t.Helper()
	in, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	out, errb := r.runRaw(t, name, in, env...)
	return parseOne(t, name, out, errb)
}

func parseOne(t *testing.T, name string, out, errb []byte) result {
	t.Helper()
	trimmed := bytes.TrimSpace(out)
	if bytes.Count(trimmed, []byte("\n")) != 0 || !json.Valid(trimmed) {
		t.Fatalf("%s: stdout is not one JSON line:\n%s\nstderr:\n%s", name, out, errb)
	}
	var res result
	if err := json.Unmarshal(trimmed, &res); err != nil {
		t.Fatalf("%s: %v\nstdout: %s", name, err, out)
	}
	return res
}

func mustOK(t *testing.T, what string, res result) {
	t.Helper()
	if !res.OK || res.FailCount != 0 {
		t.Fatalf("%s: not ok: %+v", what, res)
	}
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha(b)
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// treeState lists every path under root with its kind, permission bits
// and, for files, the SHA-256 of its bytes.
func treeState(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		line := fmt.Sprintf("%s %v", filepath.ToSlash(rel), info.Mode())
		if info.Mode().IsRegular() {
			line += " " + fileSHA(t, p)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// call is one executor invocation of an undo.
type call struct {
	executor string
	args     map[string]any
}

// reverseCalls translates a result with the manifest's reverse_pattern
// the way the server's undo does (docs/protocol.md §10.1): swap_src_dst → move_files grouped
// by source folder with dst_template "<parent>/{name}" (a literal
// template for a rename); restore_blob_backup → move_files with copy:true,
// dst_template "{dst}" and entries {src: blob_path, dst: path}, in
// batches of 100; delete_created_dirs → delete_dirs, deepest first.
func reverseCalls(t *testing.T, patterns []string, res result) []call {
	t.Helper()
	var calls []call
	for _, p := range patterns {
		switch p {
		case "swap_src_dst":
			var parents []string
			groups := map[string][]any{}
			for _, r := range res.Results {
				if filepath.Base(r.Src) != filepath.Base(r.Dst) {
					calls = append(calls, call{"move_files", map[string]any{
						"entries": []any{map[string]any{"src": r.Dst}}, "dst_template": r.Src, "client": "local"}})
					continue
				}
				parent := filepath.Dir(r.Src)
				if _, ok := groups[parent]; !ok {
					parents = append(parents, parent)
				}
				groups[parent] = append(groups[parent], map[string]any{"src": r.Dst})
			}
			for _, parent := range parents {
				calls = append(calls, call{"move_files", map[string]any{
					"entries": groups[parent], "dst_template": parent + "/{name}", "client": "local"}})
			}
		case "restore_blob_backup":
			var entries []any
			for _, r := range res.Results {
				if r.BlobPath != "" {
					entries = append(entries, map[string]any{"src": r.BlobPath, "dst": r.Path})
				}
			}
			for len(entries) > 0 {
				n := min(100, len(entries))
				calls = append(calls, call{"move_files", map[string]any{
					"entries": entries[:n], "copy": true, "dst_template": "{dst}", "client": "local"}})
				entries = entries[n:]
			}
		case "delete_created_dirs":
			if len(res.DirsCreated) > 0 {
				paths := slices.Clone(res.DirsCreated) // deepest first
				calls = append(calls, call{"delete_dirs", map[string]any{"paths": paths, "client": "local"}})
			}
		default:
			t.Fatalf("reverse pattern %q not translated here", p)
		}
	}
	return calls
}

// undo runs the translated reverse calls as the server would send them:
// without a turn id.
func (r *runner) undo(t *testing.T, executor string, res result) {
	t.Helper()
	m := readManifest(t, Executors, executor)
	for _, c := range reverseCalls(t, m.ReversePattern, res) {
		got := r.run(t, c.executor, c.args, "METNOS_TURN_ID=")
		mustOK(t, fmt.Sprintf("undo %s %v", c.executor, c.args), got)
	}
}

func TestEmbeddedLayout(t *testing.T) {
	if _, err := fs.Stat(Shim, "executor_helpers.py"); err != nil {
		t.Fatal(err)
	}
	dirs, err := fs.ReadDir(Executors, ".")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range dirs {
		got = append(got, d.Name())
	}
	want := slices.Sorted(slices.Values(executorNames))
	if !slices.Equal(got, want) {
		t.Fatalf("executors = %v, want %v", got, want)
	}
	caps := map[string]string{"echo_args": "", "list_folder": "fs:read"}
	reverse := map[string][]string{
		"organize_photos": {"swap_src_dst", "restore_blob_backup", "delete_created_dirs"},
		"move_files":      {"swap_src_dst", "restore_blob_backup", "delete_created_dirs"},
		"delete_files":    {"restore_blob_backup"},
		"write_files":     {"restore_blob_backup", "delete_created_paths"},
		"create_dirs":     {"delete_created_paths"},
	}
	for _, name := range executorNames {
		m := readManifest(t, Executors, name)
		if m.Name != name || m.Description == "" || len(m.Code.Files) == 0 || m.Code.Files[0] != name+".py" {
			t.Errorf("%s: manifest %+v", name, m)
		}
		if m.Code.Digest != "sha256:0" || m.Placement.MinSandbox != "job-object" {
			t.Errorf("%s: digest %q, min_sandbox %q", name, m.Code.Digest, m.Placement.MinSandbox)
		}
		wantCap, ok := caps[name]
		if !ok {
			wantCap = "fs:write"
		}
		var gotCap string
		if len(m.Capabilities) > 0 {
			gotCap = m.Capabilities[0].Name
		}
		if len(m.Capabilities) > 1 || gotCap != wantCap {
			t.Errorf("%s: capabilities %+v, want %q", name, m.Capabilities, wantCap)
		}
		if !slices.Equal(m.ReversePattern, reverse[name]) {
			t.Errorf("%s: reverse_pattern %v, want %v", name, m.ReversePattern, reverse[name])
		}
		for _, f := range m.Code.Files {
			if _, err := fs.Stat(Executors, path.Join(name, f)); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	for _, fsys := range []fs.FS{Shim, Executors} {
		fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if d.Name() == "__pycache__" || strings.HasSuffix(p, ".pyc") {
				t.Errorf("bytecode embedded: %s", p)
			}
			return nil
		})
	}
}

// TestStdlibOnly: every Python file parses as Python 3.8 and imports only
// the standard library and the shim.
func TestStdlibOnly(t *testing.T) {
	r := newRunner(t)
	const check = `
import ast, sys
if not hasattr(sys, "stdlib_module_names"):
    print("SKIP: python < 3.10 has no sys.stdlib_module_names"); sys.exit(0)
allowed = set(sys.stdlib_module_names) | {"executor_helpers"}
bad = []
for p in sys.argv[1:]:
    tree = ast.parse(open(p, encoding="utf-8").read(), p, feature_version=(3, 8))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else ["<relative>"]
        bad += ["%s: %s" % (p, n) for n in names if n.split(".")[0] not in allowed]
print("\n".join(bad))
`
	var files []string
	filepath.WalkDir(r.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".py") {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != len(executorNames)+1 {
		t.Fatalf("python files: %v", files)
	}
	cmd := exec.Command(r.py, append([]string{"-c", check}, files...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1"}
	out, err := cmd.CombinedOutput()
	if strings.HasPrefix(string(out), "SKIP: ") {
		t.Skip(strings.TrimSpace(string(out)))
	}
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("import check: %v\n%s", err, out)
	}
}

func TestEchoArgs(t *testing.T) {
	r := newRunner(t)
	args := map[string]any{"msg": "ciao, è così — 日本語 🙂", "n": 3, "list": []any{"α", nil, true}}
	in, _ := json.Marshal(args)
	out, errb := r.runRaw(t, "echo_args", in)
	if !bytes.Contains(out, []byte("日本語 🙂")) {
		t.Errorf("non-ASCII not written as UTF-8: %s", out)
	}
	res := parseOne(t, "echo_args", out, errb)
	mustOK(t, "echo_args", res)
	if res.OKCount != 1 || len(res.Entries) != 1 {
		t.Fatalf("%+v", res)
	}
	echo, _ := json.Marshal(res.Entries[0]["echo"])
	if want, _ := json.Marshal(args); !bytes.Equal(echo, want) {
		t.Errorf("echo = %s, want %s", echo, want)
	}
	if !regexp.MustCompile(`^3\.\d+\.\d+`).MatchString(res.Python) {
		t.Errorf("python = %q", res.Python)
	}
}

func TestListFolder(t *testing.T) {
	r := newRunner(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b.txt"), "abc")
	writeFile(t, filepath.Join(dir, "a.jpg"), "12345")
	writeFile(t, filepath.Join(dir, "sub", "inner.txt"), "x")

	res := r.run(t, "list_folder", map[string]any{"path": dir})
	mustOK(t, "list_folder", res)
	var got []string
	for _, e := range res.Entries {
		got = append(got, fmt.Sprintf("%v %v %v", e["name"], e["kind"], e["size"]))
	}
	want := []string{"a.jpg file 5", "b.txt file 3", "sub dir 0"}
	if !slices.Equal(got, want) || res.OKCount != 3 || res.Path != dir {
		t.Errorf("entries = %q (ok_count %d, path %q), want %q", got, res.OKCount, res.Path, want)
	}

	res = r.run(t, "list_folder", map[string]any{"path": dir, "pattern": "*.txt"})
	if len(res.Entries) != 1 || res.Entries[0]["name"] != "b.txt" {
		t.Errorf("pattern *.txt: %+v", res.Entries)
	}

	missing := filepath.Join(dir, "nope")
	res = r.run(t, "list_folder", map[string]any{"path": missing})
	if res.OK || !strings.Contains(res.Error, missing) || res.ErrorClass == "" {
		t.Errorf("missing folder: %+v", res)
	}
	res = r.run(t, "list_folder", map[string]any{"path": "relative/dir"})
	if res.OK || res.ErrorClass != "bad_args" {
		t.Errorf("relative path: %+v", res)
	}
}

// TestOrganizeAndUndo sorts the demo photos, with one destination already
// taken by a different file (replaced, a blob kept) and one by an identical
// file, then undoes it with exactly the calls the server's undo would
// send, and checks the folder is back to its original state.
func TestOrganizeAndUndo(t *testing.T) {
	r := newRunner(t)
	dir := filepath.Join(t.TempDir(), "photos")
	photos := DemoPhotos()
	if err := GeneratePhotos(dir, photos); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "notes.txt"), "not a photo")
	shas := map[string]string{}
	for _, p := range photos {
		shas[p.Name] = fileSHA(t, filepath.Join(dir, p.Name))
	}
	if len(slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for _, s := range shas {
			yield(s)
		}
	}))) != len(photos) {
		t.Fatal("two demo photos have the same bytes")
	}
	dest := func(p Photo) string {
		return filepath.Join(dir, p.Taken.Format("2006"), p.Taken.Format("01"), p.Name)
	}

	// A different file already where vacanza_mare.jpg goes.
	taken := photos[6]
	if err := GeneratePhotos(filepath.Dir(dest(taken)), []Photo{{Name: taken.Name, Taken: taken.Taken.AddDate(0, 0, 1), Seed: 100}}); err != nil {
		t.Fatal(err)
	}
	oldMtime := time.Date(2020, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	if err := os.Chmod(dest(taken), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dest(taken), oldMtime, oldMtime); err != nil {
		t.Fatal(err)
	}
	oldSHA := fileSHA(t, dest(taken))

	// An identical copy already where IMG_2001.jpg goes.
	dup := photos[4]
	b, err := os.ReadFile(filepath.Join(dir, dup.Name))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dest(dup), string(b))

	before := treeState(t, dir)

	res := r.run(t, "organize_photos", map[string]any{"folder": dir})
	mustOK(t, "organize_photos", res)
	if res.OKCount != len(photos) || res.Replaced != 1 || res.Duplicates != 1 {
		t.Fatalf("ok_count %d replaced %d duplicates %d: %+v", res.OKCount, res.Replaced, res.Duplicates, res)
	}
	wantDirs := []string{filepath.Join(dir, "2023"), filepath.Join(dir, "2023", "05"), filepath.Join(dir, "2023", "08")}
	if !slices.Equal(res.DirsCreated, wantDirs) {
		t.Errorf("dirs_created = %q, want %q", res.DirsCreated, wantDirs)
	}
	rows := map[string]row{}
	for _, rw := range res.Results {
		rows[filepath.Base(rw.Src)] = rw
	}
	for _, p := range photos {
		rw := rows[p.Name]
		if rw.Src != filepath.Join(dir, p.Name) || rw.Dst != dest(p) || rw.DateSource != "exif" {
			t.Errorf("%s: row %+v, want dst %s from exif", p.Name, rw, dest(p))
		}
		if exists(rw.Src) {
			t.Errorf("%s: source still there", p.Name)
		}
		if got := fileSHA(t, dest(p)); got != shas[p.Name] {
			t.Errorf("%s: destination does not hold the photo", p.Name)
		}
	}
	if !exists(filepath.Join(dir, "notes.txt")) {
		t.Error("notes.txt moved")
	}

	// The replaced destination: blob first, with the old bytes and metadata.
	rw := rows[taken.Name]
	wantBlob := filepath.Join(r.data, "_history", "turn-1", "blob", oldSHA+".bin")
	if !rw.Replaced || rw.Path != dest(taken) || rw.BlobPath != wantBlob || rw.BlobSHA256 != oldSHA {
		t.Errorf("replaced row %+v, want blob %s", rw, wantBlob)
	}
	if got := fileSHA(t, wantBlob); got != oldSHA {
		t.Errorf("blob holds %s, want %s", got, oldSHA)
	}
	if rw.Mode != 0o640 || rw.MtimeNs != oldMtime.UnixNano() || rw.AtimeNs == 0 || rw.Size == 0 {
		t.Errorf("blob metadata: mode %o mtime_ns %d atime_ns %d size %d", rw.Mode, rw.MtimeNs, rw.AtimeNs, rw.Size)
	}
	if d := rows[dup.Name]; !d.Duplicate || d.Replaced || d.BlobSHA256 != shas[dup.Name] || !exists(d.BlobPath) {
		t.Errorf("duplicate row %+v", d)
	}

	// Undo, as the server translates it.
	r.undo(t, "organize_photos", res)
	if after := treeState(t, dir); !slices.Equal(before, after) {
		t.Errorf("after undo the folder differs:\nbefore %q\nafter  %q", before, after)
	}
	if info, err := os.Stat(dest(taken)); err != nil || !info.ModTime().Equal(oldMtime) {
		t.Errorf("restored file mtime: %v %v, want %v", info.ModTime(), err, oldMtime)
	}
	if !exists(wantBlob) {
		t.Error("restoring consumed the blob")
	}
}

// TestEXIFByteOrders: the Python reader agrees with ReadTaken and with
// the dates written, for both byte orders, DateTime alone, and
// DateTimeOriginal preferred over DateTime.
func TestEXIFByteOrders(t *testing.T) {
	r := newRunner(t)
	dir := t.TempDir()
	t1 := time.Date(2022, 11, 5, 8, 9, 10, 0, time.UTC)
	t2 := time.Date(2021, 2, 28, 23, 59, 59, 0, time.UTC)
	photos := []Photo{{Name: "le.jpg", Taken: t1, Seed: 10}, {Name: "be.jpg", Taken: t2, Seed: 11}}
	if err := GeneratePhotos(dir, photos); err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Time{"le.jpg": t1, "be.jpg": t2}
	custom := []struct {
		name          string
		little        bool
		original, mod time.Time
		want          time.Time
		seed          int64
	}{
		{"datetime_only_le.jpg", true, time.Time{}, t1, t1, 12},
		{"datetime_only_be.jpg", false, time.Time{}, t2, t2, 13},
		{"original_wins_le.jpg", true, t2, t1, t2, 14},
		{"original_wins_be.jpg", false, t1, t2, t1, 15},
	}
	for _, c := range custom {
		data, err := jpegWithEXIF(c.seed, exifSegment(c.little, c.original, c.mod))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, c.name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		want[c.name] = c.want
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "be.jpg")); !bytes.Contains(b, []byte("Exif\x00\x00MM\x00\x2a")) {
		t.Error("odd seed did not give a big-endian TIFF header")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "le.jpg")); !bytes.Contains(b, []byte("Exif\x00\x00II\x2a\x00")) {
		t.Error("even seed did not give a little-endian TIFF header")
	}
	for name, w := range want {
		got, err := ReadTaken(filepath.Join(dir, name))
		if err != nil || !got.Equal(w) {
			t.Errorf("ReadTaken(%s) = %v, %v; want %v", name, got, err, w)
		}
	}

	res := r.run(t, "organize_photos", map[string]any{"folder": dir})
	mustOK(t, "organize_photos", res)
	if res.OKCount != len(want) {
		t.Fatalf("ok_count %d: %+v", res.OKCount, res)
	}
	for _, rw := range res.Results {
		name := filepath.Base(rw.Src)
		w := want[name]
		if rw.DateSource != "exif" || rw.Date != w.Format("2006-01-02T15:04:05") {
			t.Errorf("%s: date %s from %s, want %v from exif", name, rw.Date, rw.DateSource, w)
		}
		got, err := ReadTaken(rw.Dst)
		if err != nil || !got.Equal(w) {
			t.Errorf("ReadTaken(%s) after the move = %v, %v", rw.Dst, got, err)
		}
	}
}

// TestDateFallbacks: no EXIF → a YYYYMMDD in the name → the mtime.
func TestDateFallbacks(t *testing.T) {
	r := newRunner(t)
	dir := t.TempDir()
	if err := GeneratePhotos(dir, []Photo{
		{Name: "IMG_20210314_101500.jpg", Seed: 1},
		{Name: "PXL_20190902143015123.JPEG", Seed: 2},
		{Name: "scan.jpg", Seed: 3},
		{Name: "IMG_20221345.jpg", Seed: 4}, // not a date
	}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "broken.jpg"), "not a jpeg at all")
	// Mid-month noon: the same month in any time zone.
	mtime := time.Date(2018, 7, 15, 12, 0, 0, 0, time.Local)
	for _, n := range []string{"scan.jpg", "IMG_20221345.jpg", "broken.jpg"} {
		if err := os.Chtimes(filepath.Join(dir, n), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ReadTaken(filepath.Join(dir, "scan.jpg")); err == nil {
		t.Error("ReadTaken found a date in a photo without EXIF")
	}

	res := r.run(t, "organize_photos", map[string]any{"folder": dir})
	mustOK(t, "organize_photos", res)
	want := map[string]string{
		"IMG_20210314_101500.jpg":    "name 2021/03",
		"PXL_20190902143015123.JPEG": "name 2019/09",
		"scan.jpg":                   "mtime 2018/07",
		"IMG_20221345.jpg":           "mtime 2018/07",
		"broken.jpg":                 "mtime 2018/07",
	}
	if len(res.Results) != len(want) {
		t.Fatalf("%d results: %+v", len(res.Results), res)
	}
	for _, rw := range res.Results {
		name := filepath.Base(rw.Src)
		rel, _ := filepath.Rel(dir, filepath.Dir(rw.Dst))
		if got := rw.DateSource + " " + filepath.ToSlash(rel); got != want[name] {
			t.Errorf("%s: %q, want %q", name, got, want[name])
		}
		if !exists(rw.Dst) || exists(rw.Src) {
			t.Errorf("%s: not moved", name)
		}
	}
}

func TestMoveFiles(t *testing.T) {
	r := newRunner(t)
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	writeFile(t, filepath.Join(a, "x.txt"), "new x")
	writeFile(t, filepath.Join(a, "y.txt"), "y")
	writeFile(t, filepath.Join(b, "x.txt"), "old x")

	// An occupied destination fails that entry only; nothing is lost.
	res := r.run(t, "move_files", map[string]any{
		"entries":      []any{map[string]any{"src": filepath.Join(a, "x.txt")}, map[string]any{"src": filepath.Join(a, "y.txt")}},
		"dst_template": b + "/{name}", "client": "local"})
	if res.OK || res.OKCount != 1 || res.FailCount != 1 || len(res.Failed) != 1 || res.Failed[0].Index != 0 ||
		!strings.Contains(res.Failed[0].Error, "exists") {
		t.Fatalf("occupied destination: %+v", res)
	}
	if readString(t, filepath.Join(a, "x.txt")) != "new x" || readString(t, filepath.Join(b, "x.txt")) != "old x" {
		t.Error("a file was lost or changed")
	}
	if exists(filepath.Join(a, "y.txt")) || readString(t, filepath.Join(b, "y.txt")) != "y" {
		t.Error("y.txt not moved")
	}
	if len(res.Results) != 1 || res.Results[0].Src != filepath.Join(a, "y.txt") || res.Results[0].Dst != filepath.Join(b, "y.txt") {
		t.Errorf("results %+v", res.Results)
	}

	// overwrite:true replaces it.
	res = r.run(t, "move_files", map[string]any{
		"entries": []any{map[string]any{"src": filepath.Join(a, "x.txt")}}, "dst_template": b + "/{name}", "overwrite": true})
	mustOK(t, "overwrite", res)
	if exists(filepath.Join(a, "x.txt")) || readString(t, filepath.Join(b, "x.txt")) != "new x" {
		t.Error("overwrite did not move x.txt")
	}

	// A missing folder fails without parents.
	res = r.run(t, "move_files", map[string]any{
		"entries": []any{map[string]any{"src": filepath.Join(b, "y.txt"), "dst": filepath.Join(c, "d", "y2.txt")}}, "dst_template": "{dst}"})
	if res.OK || res.FailCount != 1 || !exists(filepath.Join(b, "y.txt")) {
		t.Errorf("missing parent without parents: %+v", res)
	}

	// copy + parents: the source stays, the created folders are reported.
	res = r.run(t, "move_files", map[string]any{
		"entries":      []any{map[string]any{"src": filepath.Join(b, "y.txt"), "dst": filepath.Join(c, "d", "y2.txt")}},
		"dst_template": "{dst}", "copy": true, "parents": true})
	mustOK(t, "copy", res)
	if readString(t, filepath.Join(b, "y.txt")) != "y" || readString(t, filepath.Join(c, "d", "y2.txt")) != "y" {
		t.Error("copy did not copy")
	}
	if want := []string{filepath.Join(c, "d"), c}; !slices.Equal(res.DirsCreated, want) { // deepest first, as upstream
		t.Errorf("dirs_created %q, want %q", res.DirsCreated, want)
	}

	// A literal template pointing at an existing file (here the copy's
	// source) is occupied too: the move fails rather than clobber it.
	if got := r.run(t, "move_files", map[string]any{
		"entries": []any{map[string]any{"src": filepath.Join(c, "d", "y2.txt")}}, "dst_template": filepath.Join(b, "y.txt")}); got.OK {
		t.Errorf("move onto an existing file succeeded: %+v", got)
	}

	// A move with parents, undone as the server would.
	before := treeState(t, dir)
	res = r.run(t, "move_files", map[string]any{
		"entries": []any{map[string]any{"src": filepath.Join(b, "x.txt")}}, "dst_template": filepath.Join(dir, "e", "f") + "/{name}", "parents": true})
	mustOK(t, "move with parents", res)
	r.undo(t, "move_files", res)
	if after := treeState(t, dir); !slices.Equal(before, after) {
		t.Errorf("undo of move_files:\nbefore %q\nafter  %q", before, after)
	}

	res = r.run(t, "move_files", map[string]any{"entries": []any{}, "client": "gdrive"})
	if res.OK || res.ErrorClass != "bad_args" {
		t.Errorf("client gdrive: %+v", res)
	}
}

func TestDeleteFiles(t *testing.T) {
	r := newRunner(t)
	dir := t.TempDir()
	f := filepath.Join(dir, "doc.txt")
	writeFile(t, f, "precious bytes")
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	before := treeState(t, dir)
	want := sha([]byte("precious bytes"))

	// Without a place for the blob nothing is deleted.
	res := r.run(t, "delete_files", map[string]any{"paths": []string{f}}, "METNOS_USER_DATA=")
	if res.OK || !exists(f) {
		t.Fatalf("deleted without a blob: %+v", res)
	}

	res = r.run(t, "delete_files", map[string]any{"paths": []string{f, filepath.Join(dir, "missing.txt"), dir}})
	if res.OK || res.OKCount != 1 || res.FailCount != 2 {
		t.Fatalf("%+v", res)
	}
	rw := res.Results[0]
	blob := filepath.Join(r.data, "_history", "turn-1", "blob", want+".bin")
	if rw.Path != f || !rw.Removed || rw.BlobPath != blob || rw.BlobSHA256 != want || rw.Mode != 0o600 || rw.Size != 14 {
		t.Errorf("row %+v", rw)
	}
	if exists(f) || fileSHA(t, blob) != want {
		t.Error("file still there, or blob wrong")
	}

	r.undo(t, "delete_files", result{Results: []row{rw}})
	if after := treeState(t, dir); !slices.Equal(before, after) {
		t.Errorf("restore:\nbefore %q\nafter  %q", before, after)
	}
	if !exists(blob) {
		t.Error("restore consumed the blob")
	}

	// METNOS_HISTORY_DIR and no turn id.
	hist := filepath.Join(dir, "hist")
	res = r.run(t, "delete_files", map[string]any{"paths": []string{f}}, "METNOS_HISTORY_DIR="+hist, "METNOS_TURN_ID=")
	mustOK(t, "delete_files", res)
	if want := filepath.Join(hist, "no_turn", "blob", want+".bin"); res.Results[0].BlobPath != want || !exists(want) {
		t.Errorf("blob %s, want %s", res.Results[0].BlobPath, want)
	}
}

func TestDeleteDirs(t *testing.T) {
	r := newRunner(t)
	dir := t.TempDir()
	empty, parent, full := filepath.Join(dir, "e"), filepath.Join(dir, "p"), filepath.Join(dir, "full")
	for _, d := range []string{empty, filepath.Join(parent, "child")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(full, "keep.txt"), "keep")

	// parent listed before its child: still removed, deepest first.
	res := r.run(t, "delete_dirs", map[string]any{"paths": []string{
		parent, filepath.Join(parent, "child"), empty, full, filepath.Join(dir, "missing"), filepath.Join(full, "keep.txt")}})
	if res.OK || res.OKCount != 3 || res.FailCount != 2 || res.Skipped != 1 {
		t.Fatalf("%+v", res)
	}
	if exists(empty) || exists(parent) || readString(t, filepath.Join(full, "keep.txt")) != "keep" {
		t.Error("wrong folders removed")
	}
	for _, f := range res.Failed {
		if f.Path == full && !strings.Contains(f.Error, "not empty") {
			t.Errorf("failure for a full folder: %q", f.Error)
		}
	}
}

// TestMalformedStdin: bad input always gives one JSON error object on
// stdout, never a traceback.
func TestMalformedStdin(t *testing.T) {
	r := newRunner(t)
	inputs := []string{"", "  \n", "not json", `{"a":`, `[1, 2]`, `"text"`, "\xff\xfe", `{"path": 5, "paths": 5, "entries": 5, "folder": 5}`}
	for _, name := range executorNames {
		for _, in := range inputs {
			out, errb := r.runRaw(t, name, []byte(in))
			if bytes.Contains(out, []byte("Traceback")) {
				t.Errorf("%s %q: traceback on stdout: %s", name, in, out)
			}
			res := parseOne(t, name, out, errb)
			if name == "echo_args" && strings.HasPrefix(in, "{\"path") {
				mustOK(t, "echo", res) // echo takes any object
				continue
			}
			if res.OK || res.Error == "" || res.ErrorClass == "" {
				t.Errorf("%s %q: %s", name, in, out)
			}
		}
	}
}
