//go:build linux

package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/testkit/testbin"
	"github.com/metnos/agent/wire"
)

// The user the tests act as, made in the root filesystem by
// .ci/service-rootfs.
const (
	user = "ada"
	uid  = 1000
	home = "/home/ada"
)

// fullSandbox is the word of a run with every Linux layer.
const fullSandbox = "bwrap+landlock+seccomp"

// binDir holds the agent and its shim, built once for the package.
var binDir string

func TestMain(m *testing.M) {
	if why := cannotBoot(); why != "" {
		// Each test says why it skips; nothing to build.
		os.Exit(m.Run())
	}
	dir, cleanup, err := testbin.Prepare()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// rootfs is the cached root filesystem the containers boot over.
func rootfs() string { return os.Getenv("METNOS_SERVICE_ROOTFS") }

// cannotBoot says why this machine cannot boot the tests' container,
// or "" when it can.
func cannotBoot() string {
	switch {
	case runtime.GOOS != "linux":
		return "booting a systemd container needs Linux"
	case os.Geteuid() != 0:
		return "booting a systemd container needs root (systemd-nspawn, overlay mounts)"
	case rootfs() == "":
		return "METNOS_SERVICE_ROOTFS is not set: .ci/service-rootfs makes the container's root filesystem (debootstrap) and prints the folder to set it to"
	}
	if _, err := os.Stat(filepath.Join(rootfs(), "usr/lib/systemd/systemd")); err != nil {
		return fmt.Sprintf("METNOS_SERVICE_ROOTFS=%s holds no systemd (%v): make it again with .ci/service-rootfs", rootfs(), err)
	}
	if _, err := os.Stat(filepath.Join(rootfs(), "home", user)); err != nil {
		return fmt.Sprintf("METNOS_SERVICE_ROOTFS=%s has no user %s: make it again with .ci/service-rootfs", rootfs(), user)
	}
	if _, err := exec.LookPath("systemd-nspawn"); err != nil {
		return "systemd-nspawn is not installed (apt-get install systemd-container)"
	}
	return ""
}

// needContainer skips (or, with METNOS_REQUIRE_SANDBOX=1, fails) where
// this machine cannot boot the container.
func needContainer(t *testing.T) {
	t.Helper()
	if why := cannotBoot(); why != "" {
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatal(why + " (METNOS_REQUIRE_SANDBOX=1 makes this a failure)")
		}
		t.Skip(why)
	}
}

// A container is one booted systemd over an overlay of [rootfs]: its
// upper layer keeps what the test changed across reboots.
type container struct {
	t      *testing.T
	name   string
	dir    string // the test's folder: upper, work, the console logs
	tree   string // the merged tree the container boots
	nspawn *exec.Cmd
	exited chan struct{}
	leader int
	boots  int
	booted time.Time // when the last boot reached "running"
}

var machineSeq atomic.Int64

// newContainer mounts an overlay of the root filesystem for t and
// boots it.
func newContainer(t *testing.T) *container {
	t.Helper()
	needContainer(t)
	dir, err := os.MkdirTemp("/var/tmp", "metnos-service-")
	if err != nil {
		t.Fatal(err)
	}
	c := &container{t: t, dir: dir, tree: filepath.Join(dir, "root"),
		name: fmt.Sprintf("metnos-svc-%d-%d", os.Getpid()%100000, machineSeq.Add(1))}
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", rootfs(), filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := syscall.Mount("overlay", c.tree, "overlay", 0, opts); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("mounting an overlay of %s: %v", rootfs(), err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dump()
		}
		c.poweroff()
		if err := syscall.Unmount(c.tree, syscall.MNT_DETACH); err != nil {
			t.Logf("unmounting %s: %v", c.tree, err)
		}
		os.RemoveAll(dir)
	})
	c.boot()
	return c
}

// boot starts the container and waits until its systemd says it is
// running.
func (c *container) boot() {
	t := c.t
	t.Helper()
	c.boots++
	console, err := os.Create(filepath.Join(c.dir, fmt.Sprintf("console-%d.log", c.boots)))
	if err != nil {
		t.Fatal(err)
	}
	// Unified: the container gets a cgroup2 tree of its own (with the
	// host's controllers on v1, a hybrid guest hangs at power-off).
	// Landlock's calls are not in systemd-nspawn's default filter.
	cmd := exec.Command("systemd-nspawn", "--boot", "-D", c.tree, "--machine="+c.name,
		"--register=no", "--keep-unit", "--console=read-only",
		"--system-call-filter=landlock_create_ruleset landlock_add_rule landlock_restrict_self")
	cmd.Env = append(os.Environ(), "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1")
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("systemd-nspawn: %v", err)
	}
	c.nspawn, c.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); console.Close(); close(c.exited) }()
	deadline := time.Now().Add(90 * time.Second)
	for c.leader = 0; c.leader == 0; c.leader = initOf(cmd.Process.Pid) {
		select {
		case <-c.exited:
			t.Fatalf("systemd-nspawn exited at boot %d:\n%s", c.boots, c.console())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container's init never started:\n%s", c.console())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		out, _ := c.rootRun("systemctl", "is-system-running")
		if s := strings.TrimSpace(out); s == "running" || s == "degraded" {
			if s == "degraded" {
				failed, _ := c.rootRun("systemctl", "--failed", "--no-legend")
				t.Logf("boot %d: the container's systemd is degraded: %s", c.boots, failed)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container's systemd did not reach running (says %q):\n%s", out, c.console())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.booted = time.Now()
}

// initOf is the container's init under systemd-nspawn's process pid:
// the descendant that is pid 1 of its PID namespace (0: not yet; the
// first children are nspawn's own, before it executes systemd).
func initOf(pid int) int {
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p, p))
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", n))
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", n))
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
					f := strings.Fields(v)
					if len(f) > 1 && f[len(f)-1] == "1" && strings.TrimSpace(string(comm)) == "systemd" {
						return n
					}
				}
			}
			queue = append(queue, n)
		}
	}
	return 0
}

// poweroff shuts the container down in order (SIGTERM to
// systemd-nspawn is a power-off) and waits for it.
func (c *container) poweroff() {
	if c.nspawn == nil {
		return
	}
	select {
	case <-c.exited:
	default:
		c.nspawn.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(60 * time.Second):
			c.t.Errorf("the container did not power off within 60 s; killing it")
			syscall.Kill(-c.nspawn.Process.Pid, syscall.SIGKILL)
			<-c.exited
		}
	}
	c.nspawn = nil
}

// reboot powers the container off and boots it again.
func (c *container) reboot() {
	c.t.Helper()
	c.poweroff()
	c.boot()
}

func (c *container) console() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("console-%d.log", c.boots)))
	return string(b)
}

// dump logs what a failed test needs: the user's units and the journal.
func (c *container) dump() {
	if c.nspawn == nil {
		return
	}
	out, _ := c.rootRun("journalctl", "--no-pager", "-n", "400", "-o", "short-precise")
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		// The tests' own commands, each a transient service.
		if !strings.Contains(l, "run-u") && !strings.Contains(l, "session-") && !strings.Contains(l, "pam_unix") {
			keep = append(keep, l)
		}
	}
	c.t.Logf("the container's journal (the last 400 lines but the tests' commands):\n%s", strings.Join(keep, "\n"))
	out, _ = c.as("systemctl", "--user", "status", "--no-pager", "metnos-agent", "metnos-client")
	c.t.Logf("systemctl --user status:\n%s", out)
}

// rootRun runs a command as root inside the container.
func (c *container) rootRun(args ...string) (string, error) {
	cmd := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(c.leader), "-a", "--"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s (in the container): %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// root runs a command as root inside the container, failing the test
// if it fails.
func (c *container) root(args ...string) string {
	c.t.Helper()
	out, err := c.rootRun(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// as runs a command as ada inside the container and returns its
// combined output, with an error saying how it failed. It runs as a
// transient service of the container's systemd with a PAM session
// (PAMName=login), so that the command is in a logind session of ada's,
// under the container's cgroups and system call filter, as a command in
// a terminal of ada's would be: the first one starts ada's user manager,
// as a login does, and polkit lets a session set its own linger.
func (c *container) as(args ...string) (string, error) {
	full := []string{"systemd-run", "--quiet", "--uid=" + user, "--property=PAMName=login", "--pipe", "--wait", "--collect",
		"--working-directory=" + home, "--setenv=PATH=" + home + "/.local/bin:/usr/local/bin:/usr/bin:/bin", "--setenv=LANG=C.UTF-8", "--", "/usr/bin/env"}
	cmd := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(c.leader), "-a", "--"}, append(full, args...)...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s (as %s): %w: %s", strings.Join(args, " "), user, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// must is as, failing the test if the command fails.
func (c *container) must(args ...string) string {
	c.t.Helper()
	out, err := c.as(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// exitOf is the exit status in err from [container.as] (0: none).
func exitOf(err error) int {
	var ee *exec.ExitError
	if err != nil && errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

// login starts ada's user manager, as logind does when ada logs in.
func (c *container) login() {
	c.t.Helper()
	c.root("systemctl", "start", fmt.Sprintf("user@%d.service", uid))
}

// readFile reads p in the container.
func (c *container) readFile(p string) ([]byte, error) { return os.ReadFile(c.path(p)) }

// must returns b, ignoring err (a file not there yet reads empty).
func must(b []byte, err error) []byte { return b }

// path is p inside the container, seen from the host.
func (c *container) path(p string) string { return filepath.Join(c.tree, p) }

// put copies the host file src to dst in the container, owned by ada.
func (c *container) put(src, dst string, mode fs.FileMode) {
	c.t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		c.t.Fatal(err)
	}
	c.write(dst, b, mode)
}

// write writes dst in the container, owned by ada, making its folders.
func (c *container) write(dst string, b []byte, mode fs.FileMode) {
	c.t.Helper()
	p := c.path(dst)
	c.mkdir(filepath.Dir(dst))
	if err := os.WriteFile(p+".tmp", b, mode); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Chown(p+".tmp", uid, uid); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		c.t.Fatal(err)
	}
}

// mkdir makes the folder d in ada's home, and its parents below home,
// owned by ada.
func (c *container) mkdir(d string) {
	c.t.Helper()
	var chain []string
	for p := d; strings.HasPrefix(p, home+"/") || p == home; p = filepath.Dir(p) {
		chain = append([]string{p}, chain...)
	}
	for _, p := range chain {
		if err := os.Mkdir(c.path(p), 0o755); err != nil && !os.IsExist(err) {
			c.t.Fatal(err)
		}
		os.Chown(c.path(p), uid, uid)
	}
	if len(chain) == 0 {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			c.t.Fatal(err)
		}
	}
}

// installAgent puts the agent and its shim where ada installs them,
// ~/.local/bin, from the folder dir (binDir: the build under test).
func (c *container) installAgent(dir string) string {
	c.t.Helper()
	for _, n := range []string{"metnos-agent", "metnos-shim"} {
		c.put(filepath.Join(dir, n), home+"/.local/bin/"+n, 0o755)
	}
	return home + "/.local/bin/metnos-agent"
}

// unitProp is one property of ada's unit, as systemctl --user show
// says it.
func (c *container) unitProp(unit, prop string) string {
	c.t.Helper()
	out, err := c.as("systemctl", "--user", "show", "--value", "--property="+prop, unit)
	if err != nil {
		c.t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// mainPID is the unit's main process, as the host sees it (0: none).
func (c *container) mainPID(unit string) int {
	c.t.Helper()
	n, _ := strconv.Atoi(c.unitProp(unit, "MainPID"))
	if n == 0 {
		return 0
	}
	// The container shares no PID namespace with the host: find the
	// host's pid of the container's n through NSpid.
	return hostPID(c.leader, n)
}

// hostPID finds the host pid of the process whose pid in the PID
// namespace of process leader is n (0: none).
func hostPID(leader, n int) int {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", leader))
	if err != nil {
		return 0
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); l != ns {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 && f[len(f)-1] == strconv.Itoa(n) {
					return pid
				}
			}
		}
	}
	return 0
}

// processes lists ada's processes in the container, one "pid command
// line" a line, but for the user manager's own.
func (c *container) processes() []string {
	c.t.Helper()
	// ps exits 1 when it lists nothing.
	out, err := c.rootRun("ps", "-u", user, "-o", "pid=,args=")
	if err != nil && strings.TrimSpace(out) != "" {
		c.t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.Contains(l, "systemd --user") || strings.Contains(l, "(sd-pam)") || strings.Contains(l, "dbus-daemon") || strings.Contains(l, "ps -u") {
			continue
		}
		keep = append(keep, l)
	}
	return keep
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// journal is ada's agent's journal lines (MESSAGE and PRIORITY),
// oldest first.
type journalLine struct {
	Message  string `json:"MESSAGE"`
	Priority string `json:"PRIORITY"`
	PID      string `json:"_PID"`
}

func (c *container) journal(unit string) []journalLine {
	c.t.Helper()
	out := c.root("journalctl", "--no-pager", "-o", "json", "_SYSTEMD_USER_UNIT="+unit, "+", "USER_UNIT="+unit)
	var lines []journalLine
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		var j journalLine
		if err := json.Unmarshal([]byte(l), &j); err != nil {
			// MESSAGE may be an array of bytes (not UTF-8): keep it out.
			continue
		}
		lines = append(lines, j)
	}
	return lines
}

// world is the reference server on the host's loopback, behind a
// front that can be told to fail, and the device paired with it.
type world struct {
	t      *testing.T
	srv    *refserver.Server
	url    string // the front's URL: what the agent talks to
	mirror string
	broken atomic.Bool // the front answers 500 to everything
	device string
}

// executorsFS is the sample executors and the end-to-end tests' ones.
func executorsFS(t *testing.T) fs.FS {
	t.Helper()
	out := fstest.MapFS{}
	add := func(fsys fs.FS) {
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(fsys, p)
			out[p] = &fstest.MapFile{Data: b, Mode: 0o644}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	add(examples.Executors)
	add(os.DirFS(filepath.Join("..", "e2e", "testdata", "executors")))
	return out
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, mirror: t.TempDir()}
	if _, err := refserver.WriteInstallers(w.mirror); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	srv, err := refserver.New(refserver.Config{Executors: executorsFS(t), Shim: examples.Shim,
		PollCheck: 20 * time.Millisecond, Mirror: w.mirror, Logger: slog.New(slog.NewTextHandler(logf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	base, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	w.srv = srv
	target, _ := url.Parse(base)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	proxy.ErrorLog = log.New(io.Discard, "", 0) // a long-poll cut by a reboot is no news
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if w.broken.Load() {
			http.Error(rw, "the test's front fails on purpose", http.StatusInternalServerError)
			return
		}
		proxy.ServeHTTP(rw, r)
	})}
	go front.Serve(ln)
	t.Cleanup(func() { front.Close() })
	w.url = "http://" + ln.Addr().String()
	return w
}

// join is a fresh join link for the device.
func (w *world) join() string {
	w.t.Helper()
	j, err := w.srv.NewJoin("laptop", "linux", 0)
	if err != nil {
		w.t.Fatal(err)
	}
	return j.Link(w.url)
}

// token is a fresh device token, for register.
func (w *world) token() string {
	w.t.Helper()
	tok, err := w.srv.IssueToken("laptop", 10*time.Minute)
	if err != nil {
		w.t.Fatal(err)
	}
	return tok
}

// paired records the device the server knows (exactly one).
func (w *world) paired() {
	w.t.Helper()
	devs := w.srv.Devices()
	if len(devs) != 1 {
		w.t.Fatalf("the server knows %d devices, want 1", len(devs))
	}
	w.device = devs[0].ID
}

func (w *world) enqueue(executor string, args any, o refserver.EnqueueOptions) string {
	w.t.Helper()
	id, err := w.srv.Enqueue(w.device, executor, args, o)
	if err != nil {
		w.t.Fatal(err)
	}
	return id
}

// wait waits for the invocation's result and decodes it.
func (w *world) wait(id string, within time.Duration) (refserver.InvocationInfo, map[string]any) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	info, err := w.srv.Wait(ctx, id)
	if err != nil {
		w.t.Fatalf("invocation %s got no result within %s: %v", id, within, err)
	}
	var m map[string]any
	if err := json.Unmarshal(info.ResultBody, &m); err != nil {
		w.t.Fatalf("result of %s is not JSON: %v", id, err)
	}
	return info, m
}

// polledSince waits until the device polls after t0.
func (w *world) polledSince(t0 time.Time, within time.Duration) {
	w.t.Helper()
	waitFor(w.t, "the device polls the server", within, func() bool {
		d, ok := w.srv.Device(w.device)
		return ok && d.LastPoll.After(t0)
	})
}

// profile waits until the device's heartbeat profile satisfies ok.
func (w *world) profile(what string, within time.Duration, ok func(map[string]any) bool) map[string]any {
	w.t.Helper()
	var last map[string]any
	waitFor(w.t, "the heartbeat shows "+what, within, func() bool {
		d, found := w.srv.Device(w.device)
		last = d.Profile
		return found && d.Profile != nil && ok(d.Profile)
	})
	return last
}

// publish publishes the build of the agent in dir as version v.
func (w *world) publish(v, dir string) string {
	w.t.Helper()
	f, err := os.Open(filepath.Join(dir, "metnos-agent"))
	if err != nil {
		w.t.Fatal(err)
	}
	defer f.Close()
	e, err := refserver.Publish(w.mirror, v, wire.UpdateTarget(runtime.GOOS, runtime.GOARCH), wire.AgentComponent, f)
	if err != nil {
		w.t.Fatal(err)
	}
	return e.SHA256
}

// build builds the agent and its shim stamped with version, into a
// folder of its own.
func build(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	if err := testbin.Build(dir, "-ldflags=-X github.com/metnos/agent/cmd/metnos-agent/cli.Version="+version); err != nil {
		t.Fatal(err)
	}
	return dir
}
