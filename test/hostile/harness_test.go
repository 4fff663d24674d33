//go:build linux

package hostile

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/testkit/testbin"
)

// python is the system interpreter, the same inside and outside.
const python = "/usr/bin/python3"

// startedMark is printed first by every attack, so that a sandboxed
// run that never got to the attack cannot pass for a blocked attack.
const startedMark = "METNOS-HOSTILE-STARTED"

// hiddenBwrap is what METNOS_BWRAP points to in landlock-only mode.
const hiddenBwrap = "/nonexistent/metnos-hostile/bwrap"

// mode is one way Run can sandbox on this machine.
type mode struct {
	name  string
	bwrap bool
}

var (
	modeBwrap    = mode{"bwrap", true}
	modeLandlock = mode{"landlock-only", false}
	modes        = []mode{modeBwrap, modeLandlock}
)

// word is the Output.Sandbox this mode must report.
func (m mode) word() string {
	if m.bwrap {
		return "bwrap+landlock+seccomp"
	}
	return "landlock+seccomp"
}

// use checks that the machine has the layers of m and makes Run see
// the machine m describes: landlock-only hides bwrap behind
// METNOS_BWRAP (Probe caches per bwrap path, so this is cheap).
func (m mode) use(t *testing.T) {
	t.Helper()
	t.Setenv("METNOS_SANDBOX", "")
	t.Setenv("METNOS_BWRAP", "")
	requireSandbox(t, m.bwrap)
	if !m.bwrap {
		t.Setenv("METNOS_BWRAP", hiddenBwrap)
	}
}

// forModes runs f once per mode, as subtests named after the mode.
func forModes(t *testing.T, f func(t *testing.T, m mode)) {
	t.Helper()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			m.use(t)
			f(t, m)
		})
	}
}

// requireSandbox skips the test (or fails it, with
// METNOS_REQUIRE_SANDBOX=1) when this machine lacks Landlock, seccomp or,
// when needBwrap, a usable bubblewrap.
func requireSandbox(t *testing.T, needBwrap bool) {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("the hostile suite needs %s: %v", python, err)
	}
	c := sandbox.Probe(testbin.SandboxOptions())
	var missing []string
	if needBwrap && !c.BwrapUsable {
		missing = append(missing, "bwrap: "+c.BwrapError)
	}
	if c.LandlockABI == 0 {
		missing = append(missing, "landlock: the kernel has none (Linux 5.13+, landlock in lsm=)")
	}
	if !c.Seccomp {
		missing = append(missing, "seccomp: the kernel does not support filters")
	}
	if c.Disabled != "" {
		missing = append(missing, c.Disabled)
	}
	if len(missing) == 0 {
		return
	}
	msg := "this machine lacks sandbox layers: " + strings.Join(missing, "; ")
	if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
		t.Fatal(msg + " (METNOS_REQUIRE_SANDBOX=1 makes this a failure)")
	}
	t.Skip(msg + " (set METNOS_REQUIRE_SANDBOX=1 to fail instead)")
}

func isRoot() bool { return os.Geteuid() == 0 }

func token(prefix string) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return prefix + "-" + hex.EncodeToString(b)
}

// secret is one file of the fake home's device nucleus.
type secret struct {
	Name  string // nucleus entry, for messages
	Rel   string // path below the home
	Token string // the file's content
}

// fixture is a fake home and its surroundings in a private temporary
// directory: the only place the suite writes on the host.
type fixture struct {
	Root    string // 0755 temporary directory
	Home    string // the fake home
	Work    string // ~/work, the usual write grant
	Docs    string // ~/docs, the usual read grant (holds readme.txt)
	Outside string // a host directory no policy grants (holds target.txt)
	RunDir  string // the fake $XDG_RUNTIME_DIR (~/run)
	Secrets []secret
	Host    policy.Host
	vars    map[string]string
}

// nucleusFiles are the fake secrets planted in every fixture.
var nucleusFiles = []struct{ name, rel string }{
	{"~/.ssh", ".ssh/id_rsa"},
	{"~/.gnupg", ".gnupg/x"},
	{"~/.aws", ".aws/credentials"},
	{"~/.netrc", ".netrc"},
	{"~/.config/gh", ".config/gh/hosts.yml"},
	{"~/.password-store", ".password-store/x"},
	{"~/.mozilla", ".mozilla/x"},
	{"~/.config/metnos (agent key)", ".config/metnos/key"},
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	root, err := os.MkdirTemp("", "metnos-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(root); err != nil {
			t.Logf("removing the fixture %s: %v", root, err)
		}
	})
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// Resolve it: Policies hold canonical paths.
	if root, err = filepath.EvalSymlinks(root); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(root, "home")
	fx := &fixture{
		Root:    root,
		Home:    home,
		Work:    filepath.Join(home, "work"),
		Docs:    filepath.Join(home, "docs"),
		Outside: filepath.Join(root, "outside"),
		RunDir:  filepath.Join(home, "run"),
	}
	for _, n := range nucleusFiles {
		fx.Secrets = append(fx.Secrets, secret{Name: n.name, Rel: n.rel, Token: token("METNOS-SECRET")})
	}
	fx.Host = policy.Host{
		Home:        home,
		UID:         os.Getuid(),
		RuntimeDir:  fx.RunDir,
		DBusSession: "unix:path=" + filepath.Join(fx.RunDir, "bus"),
		AgentDataDirs: []string{
			filepath.Join(home, ".config", "metnos"),
			filepath.Join(home, ".local", "share", "metnos"),
			filepath.Join(home, ".cache", "metnos"),
		},
	}
	fx.reset(t)
	return fx
}

// reset empties the fixture and plants it again: every run of an
// attack starts from the same host state.
func (fx *fixture) reset(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir(fx.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(fx.Root, e.Name())); err != nil {
			t.Fatalf("resetting the fixture: %v", err)
		}
	}
	for _, d := range []string{fx.Home, fx.Work, fx.Docs, fx.Outside} {
		mkdir(t, d, 0o755)
	}
	mkdir(t, fx.RunDir, 0o700)
	for _, s := range fx.Secrets {
		p := filepath.Join(fx.Home, s.Rel)
		mkdir(t, filepath.Dir(p), 0o700)
		writeFile(t, p, s.Token+"\n", 0o600)
	}
	writeFile(t, filepath.Join(fx.Docs, "readme.txt"), "DOCS-ORIGINAL\n", 0o644)
	writeFile(t, filepath.Join(fx.Outside, "target.txt"), "OUTSIDE-ORIGINAL\n", 0o644)
	writeFile(t, filepath.Join(fx.Home, "notes.txt"), "NOTES\n", 0o644)
	if fx.vars == nil {
		fx.vars = map[string]string{}
	}
	for k, v := range map[string]string{
		"ROOT":    fx.Root,
		"HOME":    fx.Home,
		"WORK":    fx.Work,
		"DOCS":    fx.Docs,
		"OUTSIDE": fx.Outside,
		"RUNDIR":  fx.RunDir,
		"PYTHON":  python,
	} {
		fx.vars[k] = v
	}
}

// set adds a template variable; it survives resets.
func (fx *fixture) set(k, v string) { fx.vars[k] = v }

// expand replaces {{KEY}} by the fixture's variables.
func (fx *fixture) expand(s string) string {
	var kv []string
	for k, v := range fx.vars {
		kv = append(kv, "{{"+k+"}}", v)
	}
	return strings.NewReplacer(kv...).Replace(s)
}

func (fx *fixture) path(rel string) string { return filepath.Join(fx.Home, rel) }

func (fx *fixture) env() []string {
	return []string{"PATH=/usr/bin:/bin", "HOME=" + fx.Home, "LC_ALL=C"}
}

func mkdir(t *testing.T, p string, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func fileHas(p, s string) bool {
	b, err := os.ReadFile(p)
	return err == nil && strings.Contains(string(b), s)
}

// policies

// profile builds a named profile's Policy for the fixture's host.
func (fx *fixture) profile(t *testing.T, p policy.Profile, read, write []string, network bool) policy.Policy {
	t.Helper()
	pol, err := policy.ForProfile(policy.ProfileInput{Profile: p, Read: read, Write: write, Network: network, Host: fx.Host})
	if err != nil {
		t.Fatalf("building the %s policy: %v", p, err)
	}
	return pol
}

type policyFunc func(t *testing.T, fx *fixture) policy.Policy

// supervised is the CLI's default profile with explicit grants; the
// paths are fixture templates ("{{WORK}}").
func supervised(read, write []string) policyFunc {
	return func(t *testing.T, fx *fixture) policy.Policy {
		return fx.profile(t, policy.ProfileSupervised, fx.expandAll(read), fx.expandAll(write), false)
	}
}

func profileOnly(p policy.Profile) policyFunc {
	return func(t *testing.T, fx *fixture) policy.Policy { return fx.profile(t, p, nil, nil, false) }
}

func (fx *fixture) expandAll(ss []string) []string {
	var out []string
	for _, s := range ss {
		out = append(out, fx.expand(s))
	}
	return out
}

// running

// result is what one run of an attack produced.
type result struct {
	where  string
	stdout string
	stderr string
	exit   int
	out    sandbox.Output
}

func (r result) String() string {
	return fmt.Sprintf("%s: exit %d\n--- stdout:\n%s--- stderr:\n%s", r.where, r.exit, clip(r.stdout), clip(r.stderr))
}

func clip(s string) string {
	if len(s) > 2000 {
		s = s[:2000] + "...(clipped)\n"
	}
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s
}

// shArgv and pyArgv wrap a script so that it first prints startedMark.
func shArgv(script string) []string {
	return []string{"/bin/sh", "-c", "echo " + startedMark + "\n" + script}
}

const pyPrelude = `import ctypes, errno, os, socket, sys, time
print("` + startedMark + `", flush=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *a)
    return r, ctypes.get_errno()
def ename(e):
    return errno.errorcode.get(e, str(e))
`

func pyArgv(code string) []string {
	return []string{python, "-c", pyPrelude + code}
}

// runOutside runs argv directly on the host with the same environment
// the sandboxed run gets.
func runOutside(t *testing.T, fx *fixture, argv []string, timeout time.Duration) result {
	t.Helper()
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = fx.env()
	cmd.Dir = "/"
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	r := result{where: "outside the sandbox", stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.exit = ee.ExitCode()
	default:
		t.Fatalf("running %q outside the sandbox: %v", argv[0], err)
	}
	return r
}

// runInside runs argv through sandbox.Run and checks that it ran with
// every layer of m and got as far as the attack.
func runInside(t *testing.T, fx *fixture, m mode, pol policy.Policy, argv []string, lim sandbox.Limits) result {
	t.Helper()
	r, err := tryInside(fx, pol, argv, lim)
	r.where = "inside the sandbox (" + m.name + ")"
	if err != nil {
		t.Fatalf("sandbox.Run failed, so the attack was not tried: %v\n%s", err, r)
	}
	if r.out.Sandbox != m.word() {
		t.Fatalf("the run reported sandbox %q, want %q (reason: %s): a layer is missing", r.out.Sandbox, m.word(), r.out.Reason)
	}
	if !strings.Contains(r.stdout, startedMark) {
		t.Fatalf("the command never started inside the sandbox, so the attack proves nothing:\n%s", r)
	}
	return r
}

func tryInside(fx *fixture, pol policy.Policy, argv []string, lim sandbox.Limits) (result, error) {
	if lim.Timeout == 0 {
		lim.Timeout = 20 * time.Second
	}
	out, err := sandbox.Run(context.Background(), sandbox.Request{
		Argv:    argv,
		Env:     fx.env(),
		Policy:  pol,
		Limits:  lim,
		Options: testbin.SandboxOptions(),
	})
	return result{stdout: string(out.Stdout), stderr: string(out.Stderr), exit: out.ExitCode, out: out}, err
}

// attacks

// attackCase is one attack: a script that, when it succeeds, leaves
// evidence (a secret in its output, a changed host file, a packet at a
// host listener, a dead host process).
type attackCase struct {
	name   string
	policy policyFunc
	// sh or py is the attack, with fixture templates ("{{HOME}}").
	sh, py string
	// secrets are tokens the attack prints when it succeeds.
	secrets []string
	// setup runs after the fixture is reset, before each run.
	setup func(t *testing.T, fx *fixture)
	// landed returns evidence of success other than secrets in the
	// output, in words a user can check.
	landed func(t *testing.T, fx *fixture, r result) []string
	// cleanup runs after each run.
	cleanup func(t *testing.T, fx *fixture)
	// afterInside checks the host after the sandboxed run.
	afterInside func(t *testing.T, fx *fixture)
	// outsideFails is why the attack cannot succeed outside either for
	// this user (then only its failure inside is checked).
	outsideFails string
	// mayRefuse accepts a refusal by Run (nothing ran) as a pass: for
	// policies a weaker sandbox cannot enforce.
	mayRefuse bool
	limits    sandbox.Limits
}

func (c attackCase) argv(fx *fixture) []string {
	if c.py != "" {
		return pyArgv(fx.expand(c.py))
	}
	return shArgv(fx.expand(c.sh))
}

func (c attackCase) evidence(t *testing.T, fx *fixture, r result) (ev []string, missing []string) {
	for _, s := range c.secrets {
		s = fx.expand(s)
		if strings.Contains(r.stdout, s) || strings.Contains(r.stderr, s) {
			ev = append(ev, "secret readable: "+fx.secretName(s))
		} else {
			missing = append(missing, fx.secretName(s))
		}
	}
	if c.landed != nil {
		ev = append(ev, c.landed(t, fx, r)...)
	} else if len(c.secrets) == 0 && r.exit == 0 {
		ev = append(ev, "the attack script exited 0")
	}
	return ev, missing
}

// secretName names a token for messages: its nucleus entry, or itself.
func (fx *fixture) secretName(tok string) string {
	for _, s := range fx.Secrets {
		if s.Token == tok {
			return fmt.Sprintf("%s (%s)", s.Name, tok)
		}
	}
	return tok
}

// attack runs c outside the sandbox, where it must succeed, then inside
// with c's policy under m, where it must fail.
func attack(t *testing.T, fx *fixture, m mode, c attackCase) {
	t.Helper()
	t.Run(c.name, func(t *testing.T) {
		fx.reset(t)
		if c.setup != nil {
			c.setup(t, fx)
		}
		r := runOutside(t, fx, c.argv(fx), c.limits.Timeout)
		ev, missing := c.evidence(t, fx, r)
		switch {
		case c.outsideFails != "":
			if len(ev) > 0 {
				t.Errorf("expected the attack to fail outside too (%s), but: %s\n%s", c.outsideFails, strings.Join(ev, "; "), r)
			}
			t.Logf("outside half skipped: %s", c.outsideFails)
		case len(ev) == 0 || (len(c.secrets) > 0 && len(missing) > 0):
			t.Fatalf("the attack does not work even outside the sandbox, so this test proves nothing (missing: %s)\n%s",
				strings.Join(missing, ", "), r)
		}
		if c.cleanup != nil {
			c.cleanup(t, fx)
		}

		fx.reset(t)
		if c.setup != nil {
			c.setup(t, fx)
		}
		pol := c.policy(t, fx)
		if c.mayRefuse {
			if _, err := tryInside(fx, pol, c.argv(fx), c.limits); errors.Is(err, sandbox.ErrRefused) {
				t.Logf("Run refused the policy, so nothing ran: %v", err)
				if c.cleanup != nil {
					c.cleanup(t, fx)
				}
				return
			}
			fx.reset(t)
			if c.setup != nil {
				c.setup(t, fx)
			}
		}
		r = runInside(t, fx, m, pol, c.argv(fx), c.limits)
		if ev, _ := c.evidence(t, fx, r); len(ev) > 0 {
			t.Errorf("ATTACK SUCCEEDED inside the sandbox (%s, profile %s, policy %s): %s\n%s",
				m.word(), pol.Profile, r.out.Policy, strings.Join(ev, "; "), r)
		}
		if c.afterInside != nil {
			c.afterInside(t, fx)
		}
		if c.cleanup != nil {
			c.cleanup(t, fx)
		}
	})
}

// hostProc is a process started on the host for an attack to target.
type hostProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *hostProc) pid() int { return p.cmd.Process.Pid }

// alive reports whether the process still runs, after a grace period
// for a kill to land.
func (p *hostProc) alive() bool {
	select {
	case <-p.done:
		return false
	case <-time.After(150 * time.Millisecond):
		return true
	}
}

func (p *hostProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// manifestOf is policy.ParseManifest(caps, min) for a test's own, valid
// input.
func manifestOf(min string, caps []policy.Capability) policy.Manifest {
	m, err := policy.ParseManifest(caps, min)
	if err != nil {
		panic(err)
	}
	return m
}
