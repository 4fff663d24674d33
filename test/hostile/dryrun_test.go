//go:build linux

package hostile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/sandbox/changes"
	"github.com/metnos/agent/testkit/testbin"
)

// The dry run (docs/dryrun.md) against executors: the sample ones that
// mirror the upstream file executors, and hostile ones that ignore
// METNOS_DRY_RUN and write anyway, through symbolic and hard links. Each
// dry run must leave every file where it ran as it was, timestamps
// included, and list exactly what a real run of the same invocation
// changes on a copy of the tree.

// Test executors, beside the samples: they import the shim as the
// samples do.
var dryExecutors = map[string]string{
	// ignores_dry_run sees METNOS_DRY_RUN=1 and writes anyway.
	"ignores_dry_run": `import os, shutil
import executor_helpers as h

def main(args):
    w = h.abs_path(args["folder"], "folder")
    os.remove(os.path.join(w, "a.txt"))
    with open(os.path.join(w, "b.txt"), "a") as f:
        f.write("appended anyway\n")
    shutil.rmtree(os.path.join(w, "sub"))
    os.rename(os.path.join(w, "c.txt"), os.path.join(w, "c-renamed.txt"))
    os.makedirs(os.path.join(w, "made", "deep"))
    with open(os.path.join(w, "made", "deep", "new.txt"), "w") as f:
        f.write("new\n")
    fd = os.open(os.path.join(w, "d.txt"), os.O_WRONLY)
    os.fchmod(fd, 0o600)  # by descriptor: a folder named may be removable, and its run refuses mode changes by path
    os.close(fd)
    return {"ok": True, "saw_dry_run": os.environ.get("METNOS_DRY_RUN", "")}

if __name__ == "__main__":
    h.run_stdio(main)
`,
	// through_links appends to each name of args.links in the folder,
	// whatever it is a link to.
	"through_links": `import os
import executor_helpers as h

def main(args):
    w = h.abs_path(args["folder"], "folder")
    out = {}
    for name in args["links"]:
        try:
            with open(os.path.join(w, name), "a") as f:
                f.write("through %s\n" % name)
            out[name] = "written"
        except OSError as e:
            out[name] = type(e).__name__
    return {"ok": True, "results": out, "saw_dry_run": os.environ.get("METNOS_DRY_RUN", "")}

if __name__ == "__main__":
    h.run_stdio(main)
`,
}

// dryCode lays the shim and the executors out in dir, as the agent's
// cache holds them.
func dryCode(t *testing.T, dir string) {
	t.Helper()
	copyFS := func(fsys fs.FS, to string) {
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			dst := filepath.Join(to, p)
			if d.IsDir() {
				return os.MkdirAll(dst, 0o755)
			}
			b, err := fs.ReadFile(fsys, p)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, b, 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	copyFS(examples.Shim, filepath.Join(dir, "shim"))
	copyFS(examples.Executors, filepath.Join(dir, "executors"))
	for name, code := range dryExecutors {
		mkdir(t, filepath.Join(dir, "executors", name), 0o755)
		writeFile(t, filepath.Join(dir, "executors", name, name+".py"), code, 0o644)
	}
}

// dryCase is one invocation, made on two copies of a tree: w is the
// folder the invocation names, outside a folder beside it that no
// argument names.
type dryCase struct {
	name     string
	executor string
	tree     func(t *testing.T, w, outside string)
	args     func(w, outside string) map[string]any
	// outside is, by path relative to w, what links_outside must say.
	outside map[string]int
}

var dryCases = []dryCase{
	{
		name: "write_files", executor: "write_files",
		tree: func(t *testing.T, w, _ string) { writeFile(t, w+"/existing.txt", "before\n", 0o640) },
		args: func(w, _ string) map[string]any {
			return map[string]any{"files": []any{
				map[string]any{"path": w + "/new.txt", "content": "hello\n"},
				map[string]any{"path": w + "/existing.txt", "content": "after\n"},
				map[string]any{"path": w + "/sub/deep/n.txt", "content": "deep\n"},
			}}
		},
	},
	{
		name: "move_files", executor: "move_files",
		tree: func(t *testing.T, w, _ string) {
			writeFile(t, w+"/a.txt", "A\n", 0o644)
			writeFile(t, w+"/b.txt", "B\n", 0o644)
			writeFile(t, w+"/c.txt", "C, replaced\n", 0o644)
		},
		args: func(w, _ string) map[string]any {
			return map[string]any{"parents": true, "entries": []any{
				map[string]any{"src": w + "/a.txt", "dst": w + "/moved/a.txt"},
			}}
		},
	},
	{
		name: "move_files over a file", executor: "move_files",
		tree: func(t *testing.T, w, _ string) {
			writeFile(t, w+"/b.txt", "B\n", 0o644)
			writeFile(t, w+"/c.txt", "C, replaced\n", 0o644)
		},
		args: func(w, _ string) map[string]any {
			return map[string]any{"overwrite": true, "entries": []any{
				map[string]any{"src": w + "/b.txt", "dst": w + "/c.txt"},
			}}
		},
	},
	{
		name: "delete_files", executor: "delete_files",
		tree: func(t *testing.T, w, _ string) {
			writeFile(t, w+"/a.txt", "A\n", 0o644)
			mkdir(t, w+"/sub", 0o755)
			writeFile(t, w+"/sub/x.txt", "X\n", 0o600)
			writeFile(t, w+"/keep.txt", "K\n", 0o644)
		},
		args: func(w, _ string) map[string]any {
			return map[string]any{"paths": []any{w + "/a.txt", w + "/sub/x.txt"}}
		},
	},
	{
		name: "create_dirs", executor: "create_dirs",
		tree: func(t *testing.T, w, _ string) {},
		args: func(w, _ string) map[string]any {
			return map[string]any{"paths": []any{w + "/new/deeper", w + "/other"}}
		},
	},
	{
		// The folder named is removable: the run mounts its parent,
		// which the dry run layers.
		name: "delete_dirs", executor: "delete_dirs",
		tree: func(t *testing.T, w, _ string) {
			mkdir(t, w+"/empty", 0o755)
			writeFile(t, w+"/keep.txt", "K\n", 0o644)
		},
		args: func(w, _ string) map[string]any {
			return map[string]any{"paths": []any{w + "/empty"}}
		},
	},
	{
		name: "ignores METNOS_DRY_RUN", executor: "ignores_dry_run",
		tree: func(t *testing.T, w, _ string) {
			for _, f := range []string{"a.txt", "b.txt", "c.txt", "d.txt"} {
				writeFile(t, w+"/"+f, strings.ToUpper(f)+"\n", 0o644)
			}
			mkdir(t, w+"/sub/inner", 0o755)
			writeFile(t, w+"/sub/inner/s.txt", "S\n", 0o644)
		},
		args: func(w, _ string) map[string]any { return map[string]any{"folder": w} },
	},
	{
		name: "writes through symbolic links", executor: "through_links",
		tree: func(t *testing.T, w, outside string) {
			writeFile(t, w+"/target.txt", "T\n", 0o644)
			writeFile(t, outside+"/o.txt", "O\n", 0o644)
			must(t, os.Symlink("target.txt", w+"/in-link"))
			must(t, os.Symlink(outside+"/o.txt", w+"/out-link"))
		},
		args: func(w, _ string) map[string]any {
			return map[string]any{"folder": w, "links": []any{"in-link", "out-link"}}
		},
	},
	{
		name: "writes through hard links", executor: "through_links",
		tree: func(t *testing.T, w, outside string) {
			writeFile(t, w+"/target.txt", "T\n", 0o644)
			writeFile(t, outside+"/o.txt", "O\n", 0o644)
			must(t, os.Link(w+"/target.txt", w+"/in-link"))
			must(t, os.Link(outside+"/o.txt", w+"/out-link"))
		},
		args: func(w, _ string) map[string]any {
			return map[string]any{"folder": w, "links": []any{"in-link", "out-link"}}
		},
		outside: map[string]int{"/out-link": 1, "/in-link": 0, "/target.txt": 0},
	},
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// dryStamp is one path as these tests compare it: kind, mode, size,
// SHA-256, link target, inode, modification, change and access times
// (the files are this user's, which the layer reads without touching
// their access time).
type dryStamp struct {
	changes.Entry
	Mtime, Ctime, Atime unix.Timespec
}

func dryStamps(t *testing.T, roots ...string) map[string]dryStamp {
	t.Helper()
	s, err := changes.Take(roots...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dryStamp{}
	for p, e := range s {
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		out[p] = dryStamp{Entry: e, Mtime: st.Mtim, Ctime: st.Ctim, Atime: st.Atim}
	}
	return out
}

// execRun runs the executor as the agent runs an invocation of it:
// the policy Derive makes of an fs:write manifest and the arguments,
// with the executor and the shim readable and the user data folder
// writable (the agent's own, through the mask on its folders), its
// arguments on stdin, the agent's environment variables.
func execRun(t *testing.T, fx *fixture, code, executor string, args map[string]any, dry bool) (sandbox.Output, map[string]any, error) {
	t.Helper()
	return execRunNet(t, fx, code, executor, args, dry, false)
}

// execRunNet is execRun, with the network open when network is set.
func execRunNet(t *testing.T, fx *fixture, code, executor string, args map[string]any, dry, network bool) (sandbox.Output, map[string]any, error) {
	t.Helper()
	data := fx.path(".local/share/metnos/shimdata")
	exDir := filepath.Join(code, "executors", executor)
	pol, err := policy.Derive(policy.DeriveInput{
		Manifest: manifestOf("", []policy.Capability{{Name: "fs:write"}}),
		Args:     args,
		Extra: []policy.Grant{
			{Path: exDir, Access: policy.Read, Own: true, Why: "executor"},
			{Path: filepath.Join(code, "shim"), Access: policy.Read, Own: true, Why: "shim"},
			{Path: data, Access: policy.Write, Own: true, Why: "user data"},
		},
		Host: fx.Host,
	})
	if err != nil {
		t.Fatal(err)
	}
	pol.Network = network
	stdin, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := sandbox.Run(ctx, sandbox.Request{
		Argv:  []string{python, filepath.Join(exDir, executor+".py")},
		Stdin: bytes.NewReader(stdin),
		Env: append(fx.env(), "PYTHONPATH="+filepath.Join(code, "shim")+":"+exDir, "PYTHONDONTWRITEBYTECODE=1",
			"METNOS_USER_DATA="+data, "METNOS_TURN_ID=turn-dry"),
		Dir:     "/",
		Policy:  pol,
		Options: testbin.SandboxOptions(),
		DryRun:  dry,
	})
	var payload map[string]any
	if err == nil {
		if jerr := json.Unmarshal(out.Stdout, &payload); jerr != nil {
			t.Fatalf("the executor's output is not one JSON object: %v\nstdout %s\nstderr %s", jerr, out.Stdout, out.Stderr)
		}
	}
	return out, payload, err
}

// dryFixture is a fixture with the executors' code and user data
// folder, the code outside every folder an invocation names.
func dryFixture(t *testing.T) (*fixture, string) {
	t.Helper()
	fx := newFixture(t)
	code := filepath.Join(fx.Root, "code")
	dryCode(t, code)
	mkdir(t, fx.path(".local/share/metnos/shimdata"), 0o700)
	writeFile(t, fx.path(".local/share/metnos/shimdata/kept.txt"), "KEPT\n", 0o600)
	return fx, code
}

// TestDryRunExecutors: each invocation, run dry, leaves its tree, the
// folder beside it and the agent's user data folder as they were, byte
// for byte and timestamp for timestamp, and lists exactly what a real
// run of the same invocation changes on a copy of the tree (links to
// files outside the folder: what they change there is counted, not
// listed).
func TestDryRunExecutors(t *testing.T) {
	modeBwrap.use(t)
	// The trees outside /tmp: a folder the arguments name can be
	// removed only where its parent may be mounted in its stead, which
	// the private /tmp of the sandbox is not.
	t.Setenv("TMPDIR", "/var/tmp")
	for _, tc := range dryCases {
		t.Run(tc.name, func(t *testing.T) {
			fx, code := dryFixture(t)
			tree := func(which string) (w, outside string) {
				w, outside = filepath.Join(fx.Home, which, "w"), filepath.Join(fx.Root, which+"-outside")
				mkdir(t, w, 0o755)
				mkdir(t, outside, 0o755)
				tc.tree(t, w, outside)
				return w, outside
			}
			dryW, dryOut := tree("dry")
			realW, realOut := tree("real")
			data := fx.path(".local/share/metnos/shimdata")

			before := dryStamps(t, dryW, dryOut, data)
			out, dryPayload, err := execRun(t, fx, code, tc.executor, tc.args(dryW, dryOut), true)
			if err != nil {
				t.Fatalf("dry run: %v", err)
			}
			if out.Sandbox != modeBwrap.word() || out.DryRun == nil || out.DryRun.Applied || out.DryRun.Layer != "overlay" {
				t.Fatalf("dry run: sandbox %q, report %+v", out.Sandbox, out.DryRun)
			}
			after := dryStamps(t, dryW, dryOut, data)
			for p, b := range before {
				if a, ok := after[p]; !ok || !reflect.DeepEqual(a, b) {
					t.Errorf("the dry run changed %s:\n before %+v\n after  %+v", p, b, a)
				}
			}
			for p := range after {
				if _, ok := before[p]; !ok {
					t.Errorf("the dry run made %s", p)
				}
			}

			realBefore, err := changes.Take(realW)
			must(t, err)
			_, realPayload, err := execRun(t, fx, code, tc.executor, tc.args(realW, realOut), false)
			if err != nil {
				t.Fatalf("real run: %v", err)
			}
			realAfter, err := changes.Take(realW)
			must(t, err)
			want := changes.Relative(changes.Diff(realBefore, realAfter), realW)
			got := changes.Relative(out.DryRun.Changes, dryW)
			for i, c := range got {
				if n, ok := tc.outside[c.Path]; ok && c.LinksOutside != n {
					t.Errorf("%s: links_outside %d, want %d", c.Path, c.LinksOutside, n)
				}
				got[i].LinksOutside = 0
			}
			if !reflect.DeepEqual(got, want) {
				g, _ := json.MarshalIndent(got, "", "  ")
				w, _ := json.MarshalIndent(want, "", "  ")
				t.Errorf("the dry run lists\n%s\na real run changes\n%s\n(dry stderr: %s)", g, w, out.Stderr)
			}
			if len(want) == 0 {
				t.Errorf("the real run changed nothing: the case proves nothing (payload %v)", realPayload)
			}
			// The executor said the same, dry or not, but for paths.
			if dryPayload["ok"] != true || realPayload["ok"] != true {
				t.Errorf("ok: dry %v, real %v (dry %v, real %v)", dryPayload["ok"], realPayload["ok"], dryPayload, realPayload)
			}
			if r, ok := dryPayload["results"].(map[string]any); ok && !reflect.DeepEqual(r, realPayload["results"]) {
				t.Errorf("through the links: dry %v, real %v", r, realPayload["results"])
			}
			if s, ok := dryPayload["saw_dry_run"]; ok && (s != "1" || realPayload["saw_dry_run"] != "") {
				t.Errorf("METNOS_DRY_RUN: dry run saw %v, real run %v", s, realPayload["saw_dry_run"])
			}
		})
	}
}

// TestDryRunRefusedWithoutLayer: where the layer cannot be made (no
// bubblewrap: landlock-only; the sandbox off), a dry run is refused
// and the executor does not run; the same invocation not dry does run
// there, and writes (with the sandbox off, with the network open: a
// run that cuts it is refused there for that).
func TestDryRunRefusedWithoutLayer(t *testing.T) {
	for _, tc := range []struct {
		name string
		use  func(t *testing.T)
		why  string
		// network opens the network of the run not dry: with the
		// sandbox off, a run whose network is cut is refused for that.
		network bool
	}{
		{"landlock-only", func(t *testing.T) { modeLandlock.use(t) }, "which needs bubblewrap's namespaces", false},
		{"sandbox off", func(t *testing.T) {
			t.Setenv("METNOS_BWRAP", "")
			t.Setenv("METNOS_SANDBOX", "off")
		}, "the sandbox is off here", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.use(t)
			fx, code := dryFixture(t)
			w := filepath.Join(fx.Home, "w")
			mkdir(t, w, 0o755)
			args := map[string]any{"files": []any{map[string]any{"path": w + "/new.txt", "content": "hello\n"}}}
			_, _, err := execRunNet(t, fx, code, "write_files", args, true, tc.network)
			var re *sandbox.RefusedError
			if !errors.As(err, &re) || !re.DryRun || !strings.Contains(re.Why, tc.why) {
				t.Fatalf("got %v, want a dry run refused because %q", err, tc.why)
			}
			if exists(w + "/new.txt") {
				t.Fatal("the refused dry run wrote new.txt")
			}
			_, payload, err := execRunNet(t, fx, code, "write_files", args, false, tc.network)
			if err != nil || payload["ok"] != true || !fileHas(w+"/new.txt", "hello") {
				t.Fatalf("the same invocation, not dry: %v, %v", err, payload)
			}
		})
	}
}
