package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/testkit/winetest"
)

// helperEnv, when set in a process of this test binary, makes it a
// helper child instead of running tests: its value is the mode, and
// os.Args[1:] are the mode's arguments.
const helperEnv = "METNOS_WINTEST_HELPER"

func init() {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode, os.Args[1:]))
	}
}

// helperMain runs one helper mode and returns its exit status.
func helperMain(mode string, args []string) int {
	switch mode {
	case "exit": // exit with args[0]
		n, _ := strconv.Atoi(args[0])
		return n
	case "echo": // stdin to stdout, a line to stderr
		n, _ := io.Copy(os.Stdout, os.Stdin)
		fmt.Fprintf(os.Stderr, "read %d bytes", n)
		return 0
	case "env": // the environment, one per line
		fmt.Print(strings.Join(os.Environ(), "\n"))
		return 0
	case "where": // working directory, then TEMP, then write files there
		wd, _ := os.Getwd()
		fmt.Println(wd)
		fmt.Println(os.Getenv("TEMP"))
		_ = os.MkdirAll(filepath.Join(wd, "sub", "deeper"), 0o755)
		_ = os.WriteFile(filepath.Join(wd, "sub", "deeper", "f"), []byte("x"), 0o644)
		_ = os.WriteFile(filepath.Join(wd, "readonly"), []byte("x"), 0o400)
		_ = os.WriteFile(filepath.Join(os.TempDir(), "t"), []byte("x"), 0o644)
		return 0
	case "marker": // write args[0] at once
		if os.WriteFile(args[0], []byte("ran"), 0o644) != nil {
			return 3
		}
		return 0
	case "cat": // print the file args[0], or fail
		b, err := os.ReadFile(args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 5
		}
		os.Stdout.Write(b)
		return 0
	case "injob": // say whether this process is in a job
		in, err := isProcessInJob(windows.CurrentProcess(), 0)
		fmt.Printf("%v %v", in, err)
		return 0
	case "beat": // write a heartbeat to args[0] every 50 ms, forever
		beat(args[0])
	case "tree": // start beat children for args[1:], beat to args[0]; stay unless args[0] is "-"
		for _, f := range args[1:] {
			c := exec.Command(os.Args[0], f)
			c.Env = append(os.Environ(), helperEnv+"=beat")
			if err := c.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 4
			}
		}
		if args[0] == "-" {
			return 0
		}
		beat(args[0])
	case "spawn": // start args[0] sleepers, print how many started, stay
		n, _ := strconv.Atoi(args[0])
		started := 0
		for range n {
			c := exec.Command(os.Args[0], "-")
			c.Env = append(os.Environ(), helperEnv+"=sleep")
			if c.Start() == nil {
				started++
			}
		}
		fmt.Print(started)
		return 0
	case "sleep":
		for {
			time.Sleep(time.Second)
		}
	case "spew": // write to stdout as fast as it can, until it cannot
		b := make([]byte, 64<<10)
		for {
			if _, err := os.Stdout.Write(b); err != nil {
				return 0
			}
		}
	case "gcspew": // start a spew grandchild that keeps our stdout, and exit
		c := exec.Command(os.Args[0], "-")
		c.Env = append(os.Environ(), helperEnv+"=spew")
		c.Stdout = os.Stdout
		if err := c.Start(); err != nil {
			return 4
		}
		return 0
	case "proxyget": // GET each URL in args through $HTTP_PROXY, print the statuses
		proxy, err := url.Parse(os.Getenv("HTTP_PROXY"))
		if err != nil || proxy.Host == "" {
			fmt.Fprintf(os.Stderr, "no HTTP_PROXY: %q", os.Getenv("HTTP_PROXY"))
			return 6
		}
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 10 * time.Second}
		for _, u := range args {
			resp, err := c.Get(u)
			if err != nil {
				fmt.Print("error ")
				continue
			}
			resp.Body.Close()
			fmt.Print(resp.StatusCode, " ")
		}
		return 0
	case "alloc": // commit args[0] MiB; exit 0 if it could, 5 if not
		mb, _ := strconv.Atoi(args[0])
		_, err := windows.VirtualAlloc(0, uintptr(mb)<<20, windows.MEM_COMMIT|windows.MEM_RESERVE, windows.PAGE_READWRITE)
		if err != nil {
			return 5
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q", mode)
	return 99
}

// beat writes an increasing counter to path every 50 ms, forever.
func beat(path string) {
	for i := 0; ; i++ {
		_ = os.WriteFile(path, []byte(strconv.Itoa(i)), 0o644)
		time.Sleep(50 * time.Millisecond)
	}
}

// helper is a Request running this test binary in helper mode with
// args, with a small environment of its own.
func helper(t *testing.T, mode string, args ...string) Request {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{helperEnv + "=" + mode}
	for _, k := range []string{"SystemRoot", "PATH"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	// The job object's own tests: the stronger rungs have theirs.
	return Request{Argv: append([]string{self}, args...), Env: env, Limits: Limits{Timeout: 20 * time.Second}, Options: Options{jobOnly: true}}
}

func mustRun(t *testing.T, req Request) Output {
	t.Helper()
	out, err := Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v (stderr %q)", err, out.Stderr)
	}
	return out
}

func TestWindowsExitCodes(t *testing.T) {
	for _, code := range []int{0, 1, 42, 255} {
		out := mustRun(t, helper(t, "exit", strconv.Itoa(code)))
		if out.ExitCode != code || out.TimedOut {
			t.Errorf("exit %d: got ExitCode %d TimedOut %v", code, out.ExitCode, out.TimedOut)
		}
		if out.Sandbox != "job-object" || out.LimitsBy != "job-object" {
			t.Errorf("Sandbox %q LimitsBy %q, want job-object", out.Sandbox, out.LimitsBy)
		}
		if !strings.Contains(out.Reason, "file and network isolation are not applied") {
			t.Errorf("Reason %q does not say what is not isolated", out.Reason)
		}
	}
}

func TestWindowsStdinStdout(t *testing.T) {
	in := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, more than a pipe holds
	req := helper(t, "echo")
	req.Stdin = bytes.NewReader(in)
	out := mustRun(t, req)
	if !bytes.Equal(out.Stdout, in) {
		t.Errorf("stdout: got %d bytes, want the %d of stdin", len(out.Stdout), len(in))
	}
	if want := fmt.Sprintf("read %d bytes", len(in)); string(out.Stderr) != want {
		t.Errorf("stderr %q, want %q", out.Stderr, want)
	}
	if out.StdoutTruncated || out.StderrTruncated {
		t.Errorf("truncated: %v %v", out.StdoutTruncated, out.StderrTruncated)
	}

	req.Limits.OutputBytes = 1000
	req.Stdin = bytes.NewReader(in) // the first run read the first reader
	out = mustRun(t, req)
	if len(out.Stdout) != 1000 || !out.StdoutTruncated || !bytes.Equal(out.Stdout, in[:1000]) {
		t.Errorf("capped stdout: %d bytes, truncated %v", len(out.Stdout), out.StdoutTruncated)
	}

	out = mustRun(t, helper(t, "echo")) // nil stdin is empty
	if len(out.Stdout) != 0 || string(out.Stderr) != "read 0 bytes" {
		t.Errorf("nil stdin: stdout %q stderr %q", out.Stdout, out.Stderr)
	}
}

func TestWindowsEnvExact(t *testing.T) {
	req := helper(t, "env")
	req.Env = []string{helperEnv + "=env", "A=1", "B=two words", "Unicode=città", "TEMP=agent-temp"}
	out := mustRun(t, req)
	got := strings.Split(string(out.Stdout), "\n")
	scratch := ""
	var rest []string
	for _, kv := range got {
		switch k, v, _ := strings.Cut(kv, "="); {
		case k == "TEMP" || k == "TMP":
			if scratch != "" && v != scratch {
				t.Errorf("TEMP and TMP differ: %q", got)
			}
			scratch = v
		default:
			rest = append(rest, kv)
		}
	}
	want := []string{helperEnv + "=env", "A=1", "B=two words", "Unicode=città"}
	if winetest.UnderWine() {
		// Wine adds WINE* variables, SystemDrive and SystemRoot to
		// every process it starts; anything else is ours to explain.
		var added []string
		rest = slices.DeleteFunc(rest, func(kv string) bool {
			k, _, _ := strings.Cut(kv, "=")
			if slices.Contains(want, kv) || !strings.HasPrefix(k, "WINE") && k != "SystemDrive" && k != "SystemRoot" {
				return false
			}
			added = append(added, kv)
			return true
		})
		t.Logf("under Wine: ignoring the variables Wine added itself: %q", added)
	}
	slices.Sort(rest)
	slices.Sort(want)
	if !slices.Equal(rest, want) {
		t.Errorf("environment %q, want %q plus TEMP and TMP", rest, want)
	}
	if !strings.HasPrefix(filepath.Base(scratch), scratchPrefix) {
		t.Errorf("TEMP/TMP %q is not the scratch folder", scratch)
	}
}

func TestWindowsScratchFolder(t *testing.T) {
	out := mustRun(t, helper(t, "where"))
	lines := strings.Split(strings.TrimSpace(string(out.Stdout)), "\n")
	if len(lines) != 2 {
		t.Fatalf("output %q", out.Stdout)
	}
	wd, temp := strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1])
	if !strings.EqualFold(wd, temp) || !strings.HasPrefix(filepath.Base(wd), scratchPrefix+strconv.Itoa(os.Getpid())+"-") {
		t.Errorf("working directory %q, TEMP %q: want the same scratch folder", wd, temp)
	}
	if _, err := os.Lstat(wd); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scratch folder %s still there after the run: %v", wd, err)
	}

	dir := winetest.TempDir(t)
	req := helper(t, "where")
	req.Dir = dir
	out = mustRun(t, req)
	lines = strings.Split(strings.TrimSpace(string(out.Stdout)), "\n")
	if len(lines) != 2 || !strings.EqualFold(strings.TrimSpace(lines[0]), dir) {
		t.Fatalf("with Dir %s: output %q", dir, out.Stdout)
	}
	if temp := strings.TrimSpace(lines[1]); !strings.HasPrefix(filepath.Base(temp), scratchPrefix) {
		t.Errorf("with Dir, TEMP is %q, want a scratch folder", temp)
	}
	if _, err := os.Stat(filepath.Join(dir, "sub", "deeper", "f")); err != nil {
		t.Errorf("the command did not write in Dir: %v", err)
	}
}

func TestWindowsInJobBeforeItRuns(t *testing.T) {
	out := mustRun(t, helper(t, "injob"))
	if string(out.Stdout) != "true <nil>" {
		t.Errorf("the command says it is in a job: %q", out.Stdout)
	}
}

// TestWindowsSuspendedStart drives the pieces Run uses one by one: a
// child created suspended does nothing until resumed, and is in its job
// (alone) before that.
func TestWindowsSuspendedStart(t *testing.T) {
	dir := winetest.TempDir(t)
	marker := filepath.Join(dir, "marker")
	req := helper(t, "marker", marker)
	exe, err := lookPath(req.Argv[0], req.Env, isRegularFile)
	if err != nil {
		t.Fatal(err)
	}
	j, err := newJob(jobLimits{memory: 256 << 20, processes: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	ch, err := startSuspended(exe, req.Argv, req.Env, dir, spawnOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.close()
	defer ch.closePipes()
	if in, err := isProcessInJob(ch.process, j.h); err != nil || in {
		t.Fatalf("in the job before assignment: %v %v", in, err)
	}
	if err := j.assign(ch.process); err != nil {
		t.Fatal(err)
	}
	if in, err := isProcessInJob(ch.process, j.h); err != nil || !in {
		t.Fatalf("not in the job after assignment: %v %v", in, err)
	}
	if a, err := j.accounting(); err != nil || a.ActiveProcesses != 1 {
		t.Errorf("job accounting %+v, %v: want 1 active process", a, err)
	}
	time.Sleep(700 * time.Millisecond)
	if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the suspended child ran: marker %v", err)
	}
	if err := ch.resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := windows.WaitForSingleObject(ch.process, 20000); err != nil {
		t.Fatal(err)
	}
	if code, err := ch.exitCode(); err != nil || code != 0 {
		t.Fatalf("exit %d %v", code, err)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "ran" {
		t.Errorf("after resume: marker %q %v", b, err)
	}
}

// beats reads each heartbeat file (missing ones as "").
func beats(files []string) []string {
	var out []string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		out = append(out, string(b))
	}
	return out
}

// assertStopped checks that every heartbeat file exists and stays still.
func assertStopped(t *testing.T, files []string) {
	t.Helper()
	before := beats(files)
	for i, b := range before {
		if b == "" {
			t.Fatalf("heartbeat %s never written: the tree did not start in time", files[i])
		}
	}
	time.Sleep(400 * time.Millisecond) // 8 beats
	if after := beats(files); !slices.Equal(before, after) {
		t.Errorf("heartbeats went on after the run: %q then %q", before, after)
	}
}

func TestWindowsDeadlineKillsTree(t *testing.T) {
	dir := winetest.TempDir(t)
	var files []string
	for i := range 4 {
		files = append(files, filepath.Join(dir, fmt.Sprintf("beat%d", i)))
	}
	req := helper(t, "tree", files...)
	req.Limits.Timeout = 3 * time.Second
	start := time.Now()
	out := mustRun(t, req)
	if !out.TimedOut || out.ExitCode != -1 {
		t.Errorf("TimedOut %v ExitCode %d, want true -1", out.TimedOut, out.ExitCode)
	}
	if el := time.Since(start); el > 8*time.Second {
		t.Errorf("Run took %v with a 3 s deadline", el)
	}
	assertStopped(t, files)
}

func TestWindowsContextCancelKillsTree(t *testing.T) {
	dir := winetest.TempDir(t)
	files := []string{filepath.Join(dir, "parent"), filepath.Join(dir, "child")}
	req := helper(t, "tree", files...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	out, err := Run(ctx, req)
	if !errors.Is(err, context.DeadlineExceeded) || out.ExitCode != -1 {
		t.Errorf("err %v ExitCode %d, want the context's error and -1", err, out.ExitCode)
	}
	assertStopped(t, files)
}

func TestWindowsLeftoversDieWithCommand(t *testing.T) {
	dir := winetest.TempDir(t)
	files := []string{filepath.Join(dir, "orphan1"), filepath.Join(dir, "orphan2")}
	req := helper(t, "tree", append([]string{"-"}, files...)...)
	out := mustRun(t, req)
	if out.ExitCode != 0 || out.TimedOut {
		t.Fatalf("ExitCode %d TimedOut %v stderr %q", out.ExitCode, out.TimedOut, out.Stderr)
	}
	// The children may not have written before the job was terminated;
	// what matters is that none is writing now.
	time.Sleep(200 * time.Millisecond)
	before := beats(files)
	time.Sleep(400 * time.Millisecond)
	if after := beats(files); !slices.Equal(before, after) {
		t.Errorf("children of an exited command went on: %q then %q", before, after)
	}
}

func TestWindowsMinSandboxRefused(t *testing.T) {
	dir := winetest.TempDir(t)
	marker := filepath.Join(dir, "marker")
	for name, mod := range map[string]func(*Request){
		"request appcontainer": func(r *Request) { r.MinSandbox = policy.LevelIsolated },
		"policy full":          func(r *Request) { r.Policy.MinSandbox = policy.LevelFull },
		"full-fs-no-net":       func(r *Request) { r.Policy.Profile, r.Policy.NoFallback = policy.ProfileFullFSNoNet, true },
	} {
		req := helper(t, "marker", marker)
		mod(&req)
		out, err := Run(context.Background(), req)
		var re *RefusedError
		if !errors.As(err, &re) || !errors.Is(err, ErrRefused) || re.Have != "job-object" {
			t.Errorf("%s: err %v, want a RefusedError from job-object", name, err)
			continue
		}
		if out.Sandbox != "none" {
			t.Errorf("%s: Sandbox %q for a refused run", name, out.Sandbox)
		}
		if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: the command ran", name)
		}
	}
	req := helper(t, "marker", marker)
	req.MinSandbox = policy.LevelContained
	if out := mustRun(t, req); out.ExitCode != 0 {
		t.Errorf("min contained: exit %d", out.ExitCode)
	}
}

func TestWindowsNotFound(t *testing.T) {
	req := helper(t, "exit")
	req.Argv = []string{"no-such-command-here"}
	if _, err := Run(context.Background(), req); !errors.Is(err, errNotFound) {
		t.Errorf("err %v, want errNotFound", err)
	}
}

// TestWindowsOutputOfALeftoverEnds: with no job (METNOS_SANDBOX=off), a
// grandchild that outlives the command keeps writing to its stdout; Run
// returns all the same, its output cut off after the grace (Run once
// hung for good there).
func TestWindowsOutputOfALeftoverEnds(t *testing.T) {
	req := helper(t, "gcspew")
	req.Options.Disabled = "disabled by METNOS_SANDBOX=off"
	req.Limits.Timeout = 5 * time.Second
	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), req)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return while a leftover process kept writing its output")
	}
}

// TestWindowsBatchFilesRefused: cmd.exe would parse the arguments of a
// batch file in ways no quoting makes safe (an argument
// `x" & echo INJECTED & rem "` would run echo).
func TestWindowsBatchFilesRefused(t *testing.T) {
	dir := winetest.TempDir(t)
	bat := filepath.Join(dir, "t.cmd")
	if err := os.WriteFile(bat, []byte("@echo %1\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	req := helper(t, "exit")
	req.Argv = []string{bat, `x" & echo INJECTED & rem "`}
	out, err := Run(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "batch file") || strings.Contains(string(out.Stdout), "INJECTED") {
		t.Fatalf("a batch file ran: %v %q", err, out.Stdout)
	}
	// Named relative to Request.Dir, as on the other systems.
	req.Dir = dir
	req.Argv = []string{`.\t.cmd`}
	if _, err := Run(context.Background(), req); err == nil || !strings.Contains(err.Error(), "batch file") {
		t.Fatalf("a relative name was not looked up in Request.Dir: %v", err)
	}
}

func TestWindowsMemoryLimit(t *testing.T) {
	req := helper(t, "alloc", "256")
	req.Limits.MemoryBytes = 64 << 20
	out := mustRun(t, req)
	if winetest.UnderWine() {
		t.Skipf("Wine accepts but does not enforce the job's memory limit (the child's 256 MiB commit exited %d)", out.ExitCode)
	}
	if out.ExitCode != 5 {
		t.Errorf("a 256 MiB commit under a 64 MiB limit exited %d, want 5 (refused)", out.ExitCode)
	}
}

func TestWindowsProcessLimit(t *testing.T) {
	req := helper(t, "spawn", "12")
	req.Limits.Timeout = 10 * time.Second
	out := mustRun(t, req)
	if winetest.UnderWine() {
		t.Skipf("Wine accepts but does not enforce the job's active-process limit (%s of 12 children started)", out.Stdout)
	}
	if n, _ := strconv.Atoi(string(out.Stdout)); n != jobProcessLimit-1 {
		t.Errorf("%q children started under a limit of %d processes, want %d", out.Stdout, jobProcessLimit, jobProcessLimit-1)
	}
}

func TestWindowsAccountingLayout(t *testing.T) {
	if unsafe.Sizeof(jobAccounting{}) != 48 {
		t.Errorf("jobAccounting is %d bytes, JOBOBJECT_BASIC_ACCOUNTING_INFORMATION is 48", unsafe.Sizeof(jobAccounting{}))
	}
}

// TestWindowsEgressNotEnforced: a run whose network is narrowed to named
// hosts gets the proxy variables and a proxy that allows what is named
// and refuses the rest, and its reason says that a job object cannot
// hold a program that ignores them; StrictEgress refuses it instead.
func TestWindowsEgressNotEnforced(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	port, _ := strconv.Atoi(srv.URL[strings.LastIndexByte(srv.URL, ':')+1:])
	egress := &policy.Egress{Allow: []policy.Dest{{Host: "127.0.0.1", Port: uint16(port)}}, Deny: policy.DefaultDeny()}
	req := helper(t, "proxyget", srv.URL+"/a", "http://127.0.0.1:9/b")
	req.Policy.Egress = egress
	out := mustRun(t, req)
	if got := strings.TrimSpace(string(out.Stdout)); got != "200 403" {
		t.Errorf("the named host and another through the proxy gave %q (stderr %q), want \"200 403\"", got, out.Stderr)
	}
	if hits.Load() != 1 {
		t.Errorf("the server saw %d requests, want 1", hits.Load())
	}
	if n := out.Network; n == nil || n.Enforced || n.Refused != 1 || n.FirstRefused != "127.0.0.1:9" {
		t.Errorf("Output.Network %+v: want it not enforced, one refusal of 127.0.0.1:9", n)
	}
	if !strings.Contains(out.Reason, "the network narrowed to the hosts the manifest names (the proxy binds only programs that use the proxy variables") {
		t.Errorf("reason %q does not say the narrowing is not enforced", out.Reason)
	}

	dir := winetest.TempDir(t)
	marker := filepath.Join(dir, "marker")
	req = helper(t, "marker", marker)
	req.Policy.Egress = egress
	req.Options.StrictEgress = true
	_, err := Run(context.Background(), req)
	var re *RefusedError
	if !errors.As(err, &re) || !strings.Contains(re.Why, "network strict") {
		t.Errorf("StrictEgress: err %v, want a refusal", err)
	}
	if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Error("StrictEgress: the command ran")
	}
}
