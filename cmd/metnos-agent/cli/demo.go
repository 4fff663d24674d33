package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/metnos/agent/agent"
	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/client"
	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/undo"
	"github.com/metnos/agent/wire"
)

func runDemo(std stdio, args []string) int {
	fs := newFlagSet("demo", std, "Run the whole chain on loopback with no setup: a reference server with a throwaway key, this agent paired with it, three sample executors, and the undo of a change. Everything lives in a temporary folder, removed at the end.")
	keep := fs.Bool("keep", false, "keep the temporary folder, to look around")
	verbose := fs.Bool("v", false, "show the agent's log")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	d := &demo{w: std.out, env: e}
	err = d.run(ctx, *keep, *verbose, std.err)
	if err != nil {
		fmt.Fprintf(std.err, "\nmetnos-agent demo: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// demo is one run of `metnos-agent demo`.
type demo struct {
	w      io.Writer
	dir    string
	srv    *refserver.Server
	device string
	step   int
	// env is the environment the command read.
	env environment
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.w, format+"\n", args...) }

func (d *demo) run(ctx context.Context, keep, verbose bool, stderr io.Writer) (err error) {
	d.say("metnos-agent demo: the whole chain on loopback, in a throwaway folder\n")
	if d.dir, err = os.MkdirTemp(demoTempRoot(), "metnos-demo-"); err != nil {
		return err
	}
	if d.dir, err = filepath.EvalSymlinks(d.dir); err != nil {
		return err
	}
	defer func() {
		if keep {
			d.say("\nKept %s (the agent's data is in agent/, its log in agent/data/client.log).", d.dir)
			return
		}
		if rerr := os.RemoveAll(d.dir); rerr != nil {
			d.say("\ncould not remove %s: %v", d.dir, rerr)
			return
		}
		d.say("\nCleaned up %s (use --keep to look around).", d.dir)
	}()
	// The layout of this user, with the agent's folders in the demo's.
	lay := d.env.lay
	lay.Data, lay.Cache = filepath.Join(d.dir, "agent", "data"), filepath.Join(d.dir, "agent", "cache")

	// The server.
	d.srv, err = refserver.New(refserver.Config{Executors: examples.Executors, Shim: examples.Shim, PollCheck: 10 * time.Millisecond})
	if err != nil {
		return err
	}
	defer d.srv.Close()
	url, err := d.srv.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	d.say("  ✓ reference server  %s  (throwaway key %s…, executors %s)", url, wire.ServerFingerprint(d.srv.PublicKey())[:12], strings.Join(d.srv.Executors(), ", "))

	// Pairing, as `register` does it.
	token, err := d.srv.IssueToken("demo-laptop", 10*time.Minute)
	if err != nil {
		return err
	}
	key, err := pairing.LoadOrCreateKey(lay)
	if err != nil {
		return err
	}
	// Not connect: the demo's server runs in this process, on loopback,
	// never over a tailnet (whatever $METNOS_TAILNET_AUTHKEY says).
	reg, err := client.New(url, key, "", nil).Register(ctx, token)
	if err != nil {
		return err
	}
	if err := pairing.SaveState(lay, pairing.State{DeviceID: &reg.DeviceID, DeviceName: &reg.Name, ServerURL: &url,
		Fingerprint: &reg.Fingerprint, PairedAt: &reg.PairedAt, ServerPublicKey: reg.ServerPublicKey}); err != nil {
		return err
	}
	d.device = reg.DeviceID
	d.say("  ✓ paired            device %s… %q, server key pinned", reg.DeviceID[:12], reg.Name)

	// The agent, in this process.
	logf, err := openLog(lay.Log(), stderr)
	if err != nil {
		return err
	}
	defer logf.Close()
	errw := io.Discard
	if verbose {
		errw = stderr
	}
	ac, err := agentConfig(environment{cfg: d.env.cfg, lay: lay})
	if err != nil {
		return err
	}
	log := newLogger(logf, stderrLog{w: errw}, slog.LevelInfo)
	ac.Client, ac.Version, ac.Logger, ac.Watchdog = client.New(url, key, reg.DeviceID, nil), version(), log, exitOnOverrun(log)
	a, err := agent.New(ac)
	if err != nil {
		return err
	}
	defer a.Close()
	actx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { a.Run(actx); close(done) }()
	defer func() { stop(); <-done }()
	py, perr := a.Python()
	pyWords := "none: " + fmt.Sprint(perr)
	if perr == nil {
		v, _ := py.Version()
		pyWords = fmt.Sprintf("Python %s (%s)", v, py.Source)
	}
	d.say("  ✓ agent running     sandbox %s · %s", a.SandboxLevel(), pyWords)

	// 1. echo
	r, err := d.invoke(ctx, "echo_args — a round trip", "echo_args", map[string]any{"greeting": "ciao", "from": "metnos-agent demo", "n": 3}, refserver.EnqueueOptions{})
	if err != nil {
		return err
	}
	if e, ok := r["entries"].([]any); ok && len(e) > 0 {
		b, _ := json.Marshal(e[0])
		d.say("     %s", b)
	}

	// 2. read a folder
	docs := filepath.Join(d.dir, "documents")
	for name, text := range map[string]string{"shopping.txt": "bread, olive oil, basil\n", "recipes/pesto.md": "# Pesto\nbasil, pine nuts, parmigiano\n", "taxes-2025.pdf": strings.Repeat("%PDF", 300)} {
		p := filepath.Join(docs, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return err
		}
	}
	r, err = d.invoke(ctx, "list_folder — read "+d.rel(docs), "list_folder", map[string]any{"path": docs}, refserver.EnqueueOptions{})
	if err != nil {
		return err
	}
	if e, ok := r["entries"].([]any); ok {
		for _, x := range e {
			m, _ := x.(map[string]any)
			d.say("     %-16s %-4v %v B", m["name"], m["kind"], m["size"])
		}
	}

	// 3. organise photos
	photos := filepath.Join(d.dir, "photos")
	if err := examples.GeneratePhotos(photos, examples.DemoPhotos()); err != nil {
		return err
	}
	// An older edit already sits where one photo will go: it is replaced,
	// and its backup blob is what brings it back.
	old := filepath.Join(photos, "2024", "07", "vacanza_mare.jpg")
	os.MkdirAll(filepath.Dir(old), 0o755)
	if err := os.WriteFile(old, []byte("an older edit of vacanza_mare.jpg\n"), 0o644); err != nil {
		return err
	}
	before, err := treeSum(photos)
	if err != nil {
		return err
	}
	d.say("")
	d.say("   the photo folder before:")
	d.tree(photos)
	const turn = "turn-demo-photos"
	r, err = d.invoke(ctx, "organize_photos — sort "+d.rel(photos)+" into YYYY/MM", "organize_photos", map[string]any{"folder": photos},
		refserver.EnqueueOptions{TurnID: turn, Reversibility: "revertible", Env: map[string]string{"METNOS_TURN_ID": turn, "METNOS_LANG": "en"}})
	if err != nil {
		return err
	}
	p, _ := r["payload"].(map[string]any)
	d.say("     moved %v photos, created %d folders, replaced %v file(s)", r["n_processed"], lenOf(p["dirs_created"]), p["replaced"])
	if rows, ok := p["results"].([]any); ok {
		for _, x := range rows {
			if m, _ := x.(map[string]any); m["blob_path"] != nil {
				d.say("     backup blob kept on this device: %s", d.rel(fmt.Sprint(m["blob_path"])))
			}
		}
	}
	d.say("   after:")
	d.tree(photos)

	// 4. undo through the server
	d.step++
	d.say("\n%d. undo — the server turns the change into reverse operations and sends them back to this device", d.step)
	plan, err := d.srv.Undo(d.device, turn, refserver.EnqueueOptions{})
	if err != nil {
		return err
	}
	for i, id := range plan.IDs {
		info, err := d.wait(ctx, id)
		if err != nil {
			return err
		}
		res := map[string]any{}
		json.Unmarshal(info.ResultBody, &res)
		var args map[string]any
		if i < len(plan.Calls) {
			args = plan.Calls[i].Args
		}
		what := info.Executor
		if args["copy"] == true {
			what += " (copy from blob)"
		}
		mark := "✓"
		if res["ok"] != true {
			mark = "✗"
		}
		d.say("   %s %-28s %v item(s) in %v ms · sandbox %v", mark, what, res["n_processed"], res["elapsed_ms"], res["sandbox"])
		if res["ok"] != true {
			return fmt.Errorf("undo step %s failed: %v", info.Executor, res["error"])
		}
	}
	if len(plan.Unsupported) > 0 {
		d.say("   not undoable: %s", strings.Join(plan.Unsupported, ", "))
	}
	after, err := treeSum(photos)
	if err != nil {
		return err
	}
	d.say("   the photo folder now:")
	d.tree(photos)
	if after != before {
		return errors.New("the folder is not as it was before the change")
	}
	d.say("   ✓ restored: every file, name and byte as before (tree sha256 %s…)", before[:16])
	return d.records()
}

// records shows what the device itself kept: its history journal, in
// which the reverse invocations marked the organise undone, and its
// audit log, verified.
func (d *demo) records() error {
	lay := d.env.lay
	lay.Data = filepath.Join(d.dir, "agent", "data")
	d.step++
	d.say("\n%d. the device's own records (metnos-agent history, metnos-agent audit verify)", d.step)
	j, err := undo.Load(lay.Journal())
	if err != nil {
		return err
	}
	entries := j.Entries()
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		note := e.Summary()
		if len(e.Reverses) > 0 {
			note = "put back changes of " + e.Reverses[0]
		}
		d.say("   %-16s %-10s %s", e.Executor, e.State(), note)
	}
	rep, err := audit.Verify(lay.Audit())
	if err != nil {
		return err
	}
	if !rep.OK() {
		return fmt.Errorf("the audit log does not verify: %s", rep)
	}
	d.say("   ✓ audit log %s, chained with blake3", rep)
	return nil
}

// invoke enqueues one invocation, waits for its result and prints it.
func (d *demo) invoke(ctx context.Context, title, executor string, args map[string]any, o refserver.EnqueueOptions) (map[string]any, error) {
	d.step++
	d.say("\n%d. %s", d.step, title)
	start := time.Now()
	id, err := d.srv.Enqueue(d.device, executor, args, o)
	if err != nil {
		return nil, err
	}
	info, err := d.wait(ctx, id)
	if err != nil {
		return nil, err
	}
	r := map[string]any{}
	if err := json.Unmarshal(info.ResultBody, &r); err != nil {
		return nil, fmt.Errorf("%s: the result is not JSON: %w", executor, err)
	}
	mark := "✓"
	if r["ok"] != true {
		mark = "✗"
	}
	d.say("   %s %s in %d ms (executor %v ms) · sandbox %v", mark, info.State, time.Since(start).Milliseconds(), r["elapsed_ms"], r["sandbox"])
	if reason, ok := r["sandbox_downgrade_reason"]; ok {
		d.say("     fewer sandbox layers than this OS has: %v", reason)
	}
	if r["ok"] != true {
		return r, fmt.Errorf("%s failed: %v (%v)", executor, r["error"], r["error_class"])
	}
	return r, nil
}

func (d *demo) wait(ctx context.Context, id string) (refserver.InvocationInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	info, err := d.srv.Wait(ctx, id)
	if err != nil {
		return info, fmt.Errorf("invocation %s: %w (see the agent's log with -v)", id, err)
	}
	return info, nil
}

// rel shows a path relative to the demo folder.
func (d *demo) rel(p string) string {
	if r, err := filepath.Rel(d.dir, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

// tree prints the files under root, one a line.
func (d *demo) tree(root string) {
	var files []string
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	sort.Strings(files)
	for _, f := range files {
		fi, _ := os.Stat(f)
		d.say("     %-44s %6d B", d.rel(f), fi.Size())
	}
}

// treeSum hashes every file's path, mode and content under root.
func treeSum(root string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := e.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v\n", rel, fi.Mode())
		if e.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

func lenOf(v any) int {
	l, _ := v.([]any)
	return len(l)
}

// demoTempRoot is where the demo makes its folder: /var/tmp where it
// exists, since inside bwrap /tmp is the command's own private one
// (which the undo's folder removal cannot use safely), else the OS's.
func demoTempRoot() string {
	if fi, err := os.Stat("/var/tmp"); err == nil && fi.IsDir() && runtime.GOOS == "linux" {
		return "/var/tmp"
	}
	return ""
}
