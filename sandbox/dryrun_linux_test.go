package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox/changes"
)

// stamp is one path of a tree as the dry run tests compare it: what
// package changes compares, and the times a dry run must not touch
// either: modification, change and access (the files are this user's,
// which the layer and package changes read without touching it: the
// test's files are read after they were written, when a relatime mount
// would update it).
type stamp struct {
	changes.Entry
	Mtime, Ctime, Atime unix.Timespec
}

// stamps is every path beneath root (root included).
func stamps(t *testing.T, root string) map[string]stamp {
	t.Helper()
	s, err := changes.Take(root)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]stamp{}
	for p, e := range s {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		out[p] = stamp{Entry: e, Mtime: st.Mtim, Ctime: st.Ctim, Atime: st.Atim}
	}
	return out
}

// sameTree fails t unless the tree holds what before held, path for
// path: kind, mode, size, content, link target, inode, modification,
// change and access times.
func sameTree(t *testing.T, before, after map[string]stamp) {
	t.Helper()
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			t.Errorf("%s is gone", p)
		case !reflect.DeepEqual(a, b):
			t.Errorf("%s changed:\n before %+v\n after  %+v", p, b, a)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s appeared", p)
		}
	}
}

// needDryRun skips (or fails, with METNOS_REQUIRE_SANDBOX=1) where this
// machine gives no bwrap, Landlock and seccomp.
func needDryRun(t *testing.T) {
	t.Helper()
	c := Probe(Options{})
	if !c.BwrapUsable || c.LandlockABI == 0 || !c.Seccomp {
		skipOrFail(t, fmt.Sprintf("a dry run needs bwrap, Landlock and seccomp (bwrap: %v %s; Landlock ABI %d; seccomp %v)", c.BwrapUsable, c.BwrapError, c.LandlockABI, c.Seccomp))
	}
}

var testSystem = []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}

// shRun runs the shell script with W set to w (and OUT to out), under
// a supervised policy that grants grants.
func shRun(t *testing.T, script, w, out string, grants []policy.Grant, dry bool, o Options) (Output, error) {
	t.Helper()
	return shRunMasked(t, script, w, out, grants, nil, dry, o)
}

// shRunMasked is shRun with masks in the policy.
func shRunMasked(t *testing.T, script, w, out string, grants []policy.Grant, masks []policy.Mask, dry bool, o Options) (Output, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return Run(ctx, Request{
		Argv:    []string{"/bin/sh", "-c", script},
		Env:     []string{"W=" + w, "OUT=" + out},
		Policy:  policy.Policy{Profile: policy.ProfileSupervised, System: testSystem, Grants: grants, Masks: masks},
		DryRun:  dry,
		Options: o,
	})
}

func showChanges(cs []changes.Change) string {
	b, _ := json.MarshalIndent(cs, "", "  ")
	return string(b)
}

// canonTemp is a temporary folder, its links resolved (policies hold
// canonical paths), readable by all (so that a run as another user in
// the tests of other packages could reach it).
func canonTemp(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func put(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// dryTree is the tree every dry run case starts from, in root: the
// writable folder w (a file f, a file g, a folder d holding x, a link
// lf to f), and a folder outside no policy grants, holding o.
func dryTree(t *testing.T, root string) {
	t.Helper()
	put(t, root+"/w/f", "F\n", 0o644)
	put(t, root+"/w/g", "G\n", 0o644)
	put(t, root+"/w/d/x", "X\n", 0o640)
	put(t, root+"/outside/o", "O\n", 0o644)
	if err := os.Symlink("f", root+"/w/lf"); err != nil {
		t.Fatal(err)
	}
}

// TestDryRunMatchesRealRun: for each script, a dry run leaves the tree
// as it was, byte for byte and timestamp for timestamp (modification
// and change times), and lists exactly what a real run of the same
// script changes on a copy of the tree, as two snapshots of it show.
func TestDryRunMatchesRealRun(t *testing.T) {
	needDryRun(t)
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, root string)
		script string
		// fileGrant grants the file w/f alone, not the folder w.
		fileGrant bool
		// none: the script changes nothing (the list must be empty).
		none bool
		// outside is what links_outside must say for w/o.
		outside int
		// masks are paths beneath w the policy masks (relative).
		masks []string
		// root: the case needs root (files of another user).
		root bool
	}{
		{name: "create", script: "echo new > $W/n && mkdir -p $W/a/b && echo z > $W/a/b/z && mkfifo $W/p"},
		{name: "modify, truncate, mode, touch", script: "echo more >> $W/f && : > $W/g && chmod 600 $W/d/x && touch $W/lf && chmod 700 $W/d"},
		{name: "delete", script: "rm $W/f && rm -r $W/d"},
		{name: "delete a folder and make it again", script: "rm -r $W/d && mkdir $W/d && echo x2 > $W/d/y"},
		{name: "rename a file", script: "mv $W/f $W/d/f2"},
		// The overlay refuses to rename a folder of the lower layer
		// (EXDEV): mv then copies and deletes, as across file systems,
		// and the list pairs the files.
		{name: "rename a folder", script: "mv $W/d $W/d2"},
		{name: "a file replaced by a folder", script: "rm $W/g && mkdir $W/g && echo in > $W/g/in"},
		{name: "write through a link inside", script: "echo via >> $W/lf && ln -s d/x $W/l2 && echo via2 >> $W/l2"},
		{name: "write through a link that leads outside", script: "ln -s ../outside/o $W/lo; echo evil >> $W/lo; echo status $?"},
		{name: "write through a hard link inside",
			setup:  func(t *testing.T, root string) { must(t, os.Link(root+"/w/f", root+"/w/hf")) },
			script: "echo more >> $W/hf"},
		{name: "write through a hard link to a file outside",
			setup:   func(t *testing.T, root string) { must(t, os.Link(root+"/outside/o", root+"/w/o")) },
			script:  "echo more >> $W/o",
			outside: 1},
		{name: "a writable file, not its folder", fileGrant: true, script: "echo over > $W/f && echo no > $W/g; true"},
		{name: "nothing changed", none: true, script: "cat $W/f $W/d/x > /dev/null && touch $W/f && ls -R $W > /dev/null"},
		// A root agent's layer maps every id: a file of another user is
		// copied up as that user's, and written as in a real run.
		{name: "files of another user", root: true,
			setup: func(t *testing.T, root string) {
				must(t, os.Chmod(root+"/w/g", 0o666))
				must(t, os.Chmod(root+"/w/d", 0o777))
				for _, p := range []string{root + "/w/g", root + "/w/d", root + "/w/d/x"} {
					must(t, os.Lchown(p, 65534, 65534))
				}
			},
			script: "echo more >> $W/g && echo new > $W/d/n && rm $W/d/x"},
		// Absent masked paths get placeholders (and the folders above
		// them), which a real run removes afterwards: the layer gets
		// them instead, and they are not the command's changes.
		{name: "masked paths beneath the folder", masks: []string{"d", "secret", "deep/er/key"},
			script: "echo new > $W/n && mkdir -p $W/deep/other && ls $W/d; cat $W/secret; true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("files of another user need root (an agent that is not root cannot write them in a dry run: docs/dryrun.md)")
			}
			base := canonTemp(t)
			dryRoot, realRoot := base+"/dry", base+"/real"
			for _, r := range []string{dryRoot, realRoot} {
				dryTree(t, r)
				if tc.setup != nil {
					tc.setup(t, r)
				}
			}
			grants := func(root string) []policy.Grant {
				if tc.fileGrant {
					return []policy.Grant{{Path: root + "/w/f", Access: policy.Write}}
				}
				return []policy.Grant{{Path: root + "/w", Access: policy.Write}}
			}
			masks := func(root string) []policy.Mask {
				var ms []policy.Mask
				for _, m := range tc.masks {
					ms = append(ms, policy.Mask{Path: root + "/w/" + m, Kind: policy.MaskDir})
				}
				return ms
			}
			before := stamps(t, dryRoot)
			dry, err := shRunMasked(t, tc.script, dryRoot+"/w", dryRoot+"/outside", grants(dryRoot), masks(dryRoot), true, Options{})
			if err != nil {
				t.Fatalf("dry run: %v", err)
			}
			sameTree(t, before, stamps(t, dryRoot))

			realBefore, err := changes.Take(realRoot + "/w")
			if err != nil {
				t.Fatal(err)
			}
			real, err := shRunMasked(t, tc.script, realRoot+"/w", realRoot+"/outside", grants(realRoot), masks(realRoot), false, Options{})
			if err != nil {
				t.Fatalf("real run: %v", err)
			}
			realAfter, err := changes.Take(realRoot + "/w")
			if err != nil {
				t.Fatal(err)
			}
			if dry.ExitCode != real.ExitCode || string(dry.Stderr) != strings.ReplaceAll(string(real.Stderr), realRoot, dryRoot) {
				t.Errorf("the dry run ended otherwise than the real one: exit %d, stderr %q; real: exit %d, stderr %q", dry.ExitCode, dry.Stderr, real.ExitCode, real.Stderr)
			}
			if dry.DryRun == nil || dry.DryRun.Applied || dry.DryRun.Layer != "overlay" {
				t.Fatalf("the dry run's report: %+v", dry.DryRun)
			}
			if real.DryRun != nil {
				t.Errorf("a real run has a dry run report: %+v", real.DryRun)
			}
			want := changes.Relative(changes.Diff(realBefore, realAfter), realRoot+"/w")
			got := changes.Relative(dry.DryRun.Changes, dryRoot+"/w")
			for i, c := range got {
				if strings.HasSuffix(c.Path, "/o") && c.LinksOutside != tc.outside {
					t.Errorf("%s: links_outside %d, want %d", c.Path, c.LinksOutside, tc.outside)
				}
				got[i].LinksOutside = 0
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("the dry run lists\n%s\na real run changes\n%s", showChanges(got), showChanges(want))
			}
			if len(want) == 0 && !tc.none {
				t.Errorf("the real run changed nothing: the case proves nothing")
			}
			if tc.none && len(want) != 0 {
				t.Errorf("the real run changed %d paths, want none", len(want))
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestDryRunEnvironmentAndConfinement: a dry run's command gets
// METNOS_DRY_RUN=1, and it is held to its policy as any run is: it
// cannot write outside its grants, whatever the layer.
func TestDryRunEnvironmentAndConfinement(t *testing.T) {
	needDryRun(t)
	root := canonTemp(t)
	dryTree(t, root)
	before := stamps(t, root)
	script := `echo "dry=$METNOS_DRY_RUN"; echo evil > $OUT/planted && echo PLANTED; echo evil >> $OUT/o && echo APPENDED; true`
	grants := []policy.Grant{{Path: root + "/w", Access: policy.Write}}
	out, err := shRun(t, script, root+"/w", root+"/outside", grants, true, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameTree(t, before, stamps(t, root))
	if !strings.Contains(string(out.Stdout), "dry=1") {
		t.Errorf("the command did not get METNOS_DRY_RUN=1: %s", out.Stdout)
	}
	if strings.Contains(string(out.Stdout), "PLANTED") || strings.Contains(string(out.Stdout), "APPENDED") {
		t.Errorf("a dry run wrote outside its grants: %s", out.Stdout)
	}
	// The same script, granted the outside folder, writes there: the
	// attempt above was a real one.
	out, err = shRun(t, script, root+"/w", root+"/outside", append(grants, policy.Grant{Path: root + "/outside", Access: policy.Write}), false, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out.Stdout), "dry=\n") || !strings.Contains(string(out.Stdout), "PLANTED") {
		t.Errorf("a real run granted the folder did not write there: %s", out.Stdout)
	}
}

// TestDryRunRefused: where the layer cannot be made, a dry run is
// refused with the reason, and its command does not run; the same
// request without DryRun runs it (so the refusal is what kept it from
// running).
func TestDryRunRefused(t *testing.T) {
	needDryRun(t)
	for _, tc := range []struct {
		name   string
		opts   func(root string) Options
		policy func(root string) policy.Policy
		// hostTmp: the tree must not be in the temporary folder (a
		// root profile's /tmp is private too).
		hostTmp bool
		why     string
	}{
		{name: "sandbox off", opts: func(string) Options { return Options{Disabled: "turned off for the test"} },
			why: "the sandbox is off here (turned off for the test)"},
		{name: "no bubblewrap", opts: func(string) Options { return Options{Bwrap: "/nonexistent/metnos/bwrap"} },
			why: "which needs bubblewrap's namespaces"},
		{name: "the kernel cannot mount the layer", opts: func(string) Options { return Options{dryRunFS: "metnos-no-such-fs"} },
			why: "the kernel has no metnos-no-such-fs file system"},
		{name: "the scratch folder inside a grant", opts: func(root string) Options { return Options{DryRunScratch: root + "/w/d"} },
			why: "which the run may write and the dry run must put behind a layer"},
		{name: "the whole root writable",
			policy: func(root string) policy.Policy {
				return policy.Policy{Profile: policy.ProfileFull, RootWritable: true, Network: true}
			},
			hostTmp: true,
			why:     "makes the whole root writable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := canonTemp(t)
			if tc.hostTmp {
				dir, err := os.MkdirTemp("/var/tmp", "metnos-dry-test-")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.RemoveAll(dir) })
				root = dir
			}
			dryTree(t, root)
			o := Options{}
			if tc.opts != nil {
				o = tc.opts(root)
			}
			// The network open: with the sandbox off, a policy that cuts
			// it is refused for that.
			pol := policy.Policy{Profile: policy.ProfileSupervised, System: testSystem, Network: true, Grants: []policy.Grant{{Path: root + "/w", Access: policy.Write}}}
			if tc.policy != nil {
				pol = tc.policy(root)
			}
			req := func(dry bool) Request {
				return Request{Argv: []string{"/bin/sh", "-c", "echo ran > " + root + "/w/ran"}, Policy: pol, DryRun: dry, Options: o}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, err := Run(ctx, req(true))
			var re *RefusedError
			if !errors.As(err, &re) || !re.DryRun || !errors.Is(err, ErrRefused) {
				t.Fatalf("got %v, want a dry run's refusal", err)
			}
			if !strings.Contains(re.Why, tc.why) {
				t.Errorf("refused with %q, want it to say %q", re.Why, tc.why)
			}
			if _, err := os.Lstat(root + "/w/ran"); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the refused dry run ran its command: %v", err)
			}
			out, err := Run(ctx, req(false))
			if err != nil || out.ExitCode != 0 {
				t.Fatalf("the same run, not dry: %v, exit %d, %s", err, out.ExitCode, out.Stderr)
			}
			if b, err := os.ReadFile(root + "/w/ran"); err != nil || string(b) != "ran\n" {
				t.Fatalf("the same run, not dry, did not write: %q %v", b, err)
			}
		})
	}
}

// TestDryRunScratchBesideTmp: upstream executors' manifests grant the
// host's /tmp for writing; a dry run of such a grant puts /tmp behind a
// layer and keeps its layers in /var/tmp (the temporary folder would be
// inside the layer), runs, lists the change and leaves both folders as
// they were. With METNOS_DRY_RUN_SCRATCH (Options.DryRunScratch) inside
// the grant, it is refused instead.
func TestDryRunScratchBesideTmp(t *testing.T) {
	needDryRun(t)
	t.Setenv("TMPDIR", "")
	tmp, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if tmp != "/tmp" {
		t.Skipf("the temporary folder is %s, not /tmp", tmp)
	}
	root, err := os.MkdirTemp("/tmp", "metnos-dry-tmpgrant-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	before, _ := os.ReadDir("/var/tmp")
	out, err := shRun(t, "echo new > $W/made", root, "/nonexistent", []policy.Grant{{Path: "/tmp", Access: policy.Write}}, true, Options{})
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("a dry run with /tmp granted: %v, exit %d: %s", err, out.ExitCode, out.Stderr)
	}
	if out.DryRun == nil || !slices.Contains(out.DryRun.Layered, "/tmp") || len(out.DryRun.Changes) != 1 || out.DryRun.Changes[0].Path != root+"/made" {
		t.Fatalf("dry run %+v, want /tmp layered and %s/made created", out.DryRun, root)
	}
	if _, err := os.Lstat(root + "/made"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the dry run wrote in the host's /tmp: %v", err)
	}
	after, _ := os.ReadDir("/var/tmp")
	if len(after) != len(before) {
		t.Errorf("/var/tmp held %d entries before the run and %d after: its layers were left behind", len(before), len(after))
	}
	_, err = shRun(t, "echo new > $W/made", root, "/nonexistent", []policy.Grant{{Path: "/tmp", Access: policy.Write}}, true, Options{DryRunScratch: root})
	var re *RefusedError
	if !errors.As(err, &re) || !strings.Contains(re.Why, "which the run may write and the dry run must put behind a layer") {
		t.Fatalf("the scratch folder given inside the grant: %v, want a refusal", err)
	}
}

// TestDryRunScratchRemoved: a dry run leaves no scratch folder behind,
// even when its command made folders it cannot read.
func TestDryRunScratchRemoved(t *testing.T) {
	needDryRun(t)
	root := canonTemp(t)
	dryTree(t, root)
	scratch := canonTemp(t)
	out, err := shRun(t, "mkdir -p $W/locked/in && echo x > $W/locked/in/f && chmod 0 $W/locked/in $W/locked", root+"/w", root+"/outside",
		[]policy.Grant{{Path: root + "/w", Access: policy.Write}}, true, Options{DryRunScratch: scratch})
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("%v, exit %d: %s", err, out.ExitCode, out.Stderr)
	}
	if n := len(out.DryRun.Changes); n != 3 {
		t.Errorf("%d changes, want the 3 made:\n%s", n, showChanges(out.DryRun.Changes))
	}
	ents, err := os.ReadDir(scratch)
	if err != nil || len(ents) != 0 {
		t.Errorf("the scratch folder holds %v (%v)", ents, err)
	}
}

// TestDryRunSurvivesSweeps: a dry run's bwrap is not taken for a
// sandbox left half set up by the sweep another agent of this user may
// make at any time (SweepOrphans): dry runs made while this process
// sweeps without pause all end by themselves.
func TestDryRunSurvivesSweeps(t *testing.T) {
	needDryRun(t)
	if !subreaper() {
		t.Skip("cannot become a child subreaper")
	}
	root := canonTemp(t)
	dryTree(t, root)
	stop := make(chan struct{})
	swept := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				swept <- n
				return
			default:
				n++
				SweepOrphans(nil)
			}
		}
	}()
	grants := []policy.Grant{{Path: root + "/w", Access: policy.Write}}
	for i := range 15 {
		out, err := shRun(t, "echo run > $W/n && rm $W/f", root+"/w", root+"/outside", grants, true, Options{})
		if err != nil || out.ExitCode != 0 || out.DryRun == nil || len(out.DryRun.Changes) != 2 {
			close(stop)
			<-swept
			t.Fatalf("dry run %d beside the sweeps: %v, exit %d, signal %q, %+v", i, err, out.ExitCode, out.Signal, out.DryRun)
		}
	}
	close(stop)
	t.Logf("%d sweeps beside 15 dry runs", <-swept)
}
