//go:build linux

package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/sandbox"
)

// needExecSandbox skips the test (or fails it, with
// METNOS_REQUIRE_SANDBOX=1) when this machine cannot run exec's
// sandbox: Landlock and seccomp at least (bwrap is optional for exec).
// It returns the agent binary testscript put on PATH.
func needExecSandbox(t *testing.T) string {
	t.Helper()
	e, err := readEnvironment(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	c := sandbox.Probe(sandboxOptions(e))
	var missing []string
	if c.LandlockABI == 0 {
		missing = append(missing, "the kernel has no Landlock")
	}
	if !c.Seccomp {
		missing = append(missing, "the kernel has no seccomp filters")
	}
	if c.Disabled != "" {
		missing = append(missing, c.Disabled)
	}
	if len(missing) > 0 {
		msg := "exec's sandbox cannot run here: " + strings.Join(missing, "; ")
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatal(msg + " (METNOS_REQUIRE_SANDBOX=1 makes this a failure)")
		}
		t.Skip(msg + " (set METNOS_REQUIRE_SANDBOX=1 to fail instead)")
	}
	agent, err := exec.LookPath("metnos-agent")
	if err != nil {
		t.Fatalf("testscript.Main put no metnos-agent on PATH: %v", err)
	}
	return agent
}

// withoutDowngrade is exec's stderr without the line that names a
// weaker sandbox than the best ("metnos-agent: sandbox landlock+seccomp:
// bwrap not found …"), which a machine without bubblewrap adds to every
// run.
func withoutDowngrade(stderr string) string {
	var keep []string
	for _, l := range strings.SplitAfter(stderr, "\n") {
		if !strings.HasPrefix(l, "metnos-agent: sandbox ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "")
}

// agentCmd is `metnos-agent args...` with a private HOME, as a user
// would run it.
func agentCmd(t *testing.T, agent string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(agent, args...)
	cmd.Env = append(os.Environ(), "HOME="+home, "METNOS_LOG=warn")
	cmd.Dir = home
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

// waitFor waits up to d for cmd to end and returns its exit status, or
// -1 (after killing it) when it did not end in time.
func waitFor(cmd *exec.Cmd, d time.Duration) int {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			return -2
		}
		return 0
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return -1
	}
}

// rssMiB is the resident memory of process pid, in MiB, or -1 once it
// is gone.
func rssMiB(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb >> 10
		}
	}
	return -1
}

// TestExecStreamsEndlessStdin: `yes | metnos-agent exec -- head -1`
// prints one line and ends, and the agent's memory stays small: stdin
// goes to the command as it reads it (the agent used to read all of it
// first, and reached 1.8 GB).
func TestExecStreamsEndlessStdin(t *testing.T) {
	agent := needExecSandbox(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	yes := exec.Command("yes")
	yes.Stdout = w
	if err := yes.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { _ = yes.Process.Kill(); _ = yes.Wait() })

	cmd, stdout, stderr := agentCmd(t, agent, "exec", "--", "head", "-1")
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	const limitMiB = 200
	peak := 0
	done := make(chan int, 1)
	go func() { done <- waitFor(cmd, 30*time.Second) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var code int
wait:
	for {
		select {
		case code = <-done:
			break wait
		case <-tick.C:
			if m := rssMiB(cmd.Process.Pid); m > peak {
				peak = m
			}
			if peak > limitMiB {
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("the agent's memory reached %d MiB reading an endless stdin (want under %d MiB)", peak, limitMiB)
			}
		}
	}
	if code != 0 || stdout.String() != "y\n" {
		t.Fatalf("exit %d, stdout %q, want 0 and %q; stderr:\n%s", code, stdout, "y\n", stderr)
	}
	t.Logf("peak resident memory of the agent: %d MiB", peak)
}

// TestExecDoesNotWaitForStdin: with a stdin that stays open and silent
// (`sleep 20 | metnos-agent exec -- ...`), the command starts at once,
// and SIGTERM stops the agent at once (it used to wait for the end of
// stdin before starting anything, deaf to SIGTERM).
func TestExecDoesNotWaitForStdin(t *testing.T) {
	agent := needExecSandbox(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // the writer stays open, silent, for the whole test
	defer r.Close()

	cmd, stdout, stderr := agentCmd(t, agent, "exec", "--", "echo", "hi")
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if code := waitFor(cmd, 15*time.Second); code != 0 || stdout.String() != "hi\n" {
		t.Fatalf("exit %d (-1: still running after 15 s), stdout %q, want 0 and %q; stderr:\n%s", code, stdout, "hi\n", stderr)
	}

	cmd, _, stderr = agentCmd(t, agent, "exec", "--", "sleep", "30")
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := waitFor(cmd, 10*time.Second)
	if code == -1 {
		t.Fatalf("the agent ignored SIGTERM for 10 s; stderr:\n%s", stderr)
	}
	t.Logf("ended %v after SIGTERM, exit %d, stderr %q", time.Since(start).Round(time.Millisecond), code, stderr)
	if !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("stderr %q does not say the command was interrupted", stderr)
	}
}

// memoryByCgroup skips the test unless a cgroup holds exec's memory
// limit here (root, with a memory cgroup to make): only then does the
// kernel's OOM killer end a command that goes past it.
func memoryByCgroup(t *testing.T, agent string) {
	t.Helper()
	cmd, stdout, stderr := agentCmd(t, agent, "exec", "--json", "--", "true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("exec --json -- true: %v\n%s", err, stderr)
	}
	var out sandbox.Output
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("exec --json: %v\n%s", err, stdout)
	}
	if out.LimitsBy != "cgroup" && out.LimitsBy != "cgroup(memory)+rlimit" {
		t.Skipf("the memory limit is an rlimit here (limits by %s: not root, or no memory cgroup), so no OOM kill happens", out.LimitsBy)
	}
}

// TestExecMemoryLimitMessage: a command the memory limit kills is said
// to be killed by the memory limit, naming it (it used to say "exit
// status 137", or "0 MiB"); a child killed by it while the command
// goes on is not a memory failure of the command.
func TestExecMemoryLimitMessage(t *testing.T) {
	agent := needExecSandbox(t)
	memoryByCgroup(t, agent)
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string // "": nothing about memory
	}{
		{
			name:   "nothing fits in 1 byte",
			args:   []string{"--memory", "1", "--", "echo", "hi"},
			code:   137,
			stderr: "metnos-agent: the command was killed by the memory limit of 1 byte (raise it with --memory)\n",
		},
		{
			name:   "the command allocates past 32M",
			args:   []string{"--memory", "32M", "--", "/usr/bin/python3", "-c", "print('row', flush=True); b = b'x' * (200 << 20)"},
			code:   137,
			stdout: "row\n",
			stderr: "metnos-agent: the command was killed by the memory limit of 32 MiB (raise it with --memory)\n",
		},
		{
			name:   "a child allocates past 64M",
			args:   []string{"--memory", "64M", "--", "/usr/bin/python3", "-c", "import subprocess, sys; r = subprocess.run([sys.executable, '-c', 'b = b\"x\" * (1 << 30)']); print('child', r.returncode)"},
			code:   0,
			stdout: "child -9\n",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd, stdout, stderr := agentCmd(t, agent, append([]string{"exec"}, tt.args...)...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			code := waitFor(cmd, 60*time.Second)
			if code != tt.code || stdout.String() != tt.stdout || withoutDowngrade(stderr.String()) != tt.stderr {
				t.Errorf("exit %d, stdout %q, stderr %q\nwant exit %d, stdout %q, stderr %q", code, stdout, stderr, tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}

// TestExecMissingInterpreter: a script whose #! interpreter is missing
// is said to be so, naming it (it used to be "no such file or
// directory", about a script that is there).
func TestExecMissingInterpreter(t *testing.T) {
	agent := needExecSandbox(t)
	dir, err := os.MkdirTemp("/var/tmp", "metnos-exec-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ line, shown string }{
		{"#!/nonexistent/bin/interp -x", "/nonexistent/bin/interp"},
		// Control characters are not sent raw to the terminal.
		{"#!/nonexistent/\x1b[31mred", `"/nonexistent/\x1b[31mred"`},
	} {
		script := filepath.Join(dir, "hello.sh")
		if err := os.WriteFile(script, []byte(tt.line+"\necho hello\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd, stdout, stderr := agentCmd(t, agent, "exec", "--read", dir, "--", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		code := waitFor(cmd, 30*time.Second)
		want := "metnos-agent: could not start " + script + ": the script's interpreter " + tt.shown + " named on its #! line does not exist (inside the sandbox)\n"
		if code != exitAgent || stdout.Len() != 0 || stderr.String() != want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q\nwant exit %d, stderr %q", tt.line, code, stdout, stderr, exitAgent, want)
		}
	}
}

// TestExecStdinOpenForWriting: `metnos-agent exec -- sh -c 'echo x >&0'
// <>FILE` hands the command a file open for reading and writing as its
// stdin. The command reads it, but cannot write through it: its policy
// grants no write there. The same command outside the sandbox does.
func TestExecStdinOpenForWriting(t *testing.T) {
	agent := needExecSandbox(t)
	file := filepath.Join(t.TempDir(), "notes.txt")
	const text = "the user's own words\n"
	run := func(argv ...string) (string, string) {
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(file, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd, stdout, _ := agentCmd(t, agent)
		cmd.Path, cmd.Args = argv[0], argv
		if argv[0] == "metnos-agent" {
			cmd.Path, cmd.Args = agent, append([]string{agent}, argv[1:]...)
		}
		cmd.Stdin = f
		cmd.Run()
		b, _ := os.ReadFile(file)
		return stdout.String(), string(b)
	}
	const script = `head -c 8; echo PWNED >&0`
	if out, after := run("/bin/sh", "-c", script); !strings.Contains(after, "PWNED") {
		t.Fatalf("outside the sandbox the write through stdin failed (output %q, file %q): the test proves nothing", out, after)
	}
	out, after := run("metnos-agent", "exec", "--", "/bin/sh", "-c", script)
	if after != text {
		t.Errorf("inside the sandbox the command wrote through its stdin: the file is now %q", after)
	}
	if out != text[:8] {
		t.Errorf("inside the sandbox the command read %q from its stdin, want %q", out, text[:8])
	}
}

// agentBinary is the agent binary testscript put on PATH, for the
// tests whose exec fails before any sandbox is set up.
func agentBinary(t *testing.T) string {
	t.Helper()
	agent, err := exec.LookPath("metnos-agent")
	if err != nil {
		t.Fatalf("testscript.Main put no metnos-agent on PATH: %v", err)
	}
	return agent
}

// runAgent runs the agent with args, a private HOME and no stdin, and
// returns its exit status, stdout and stderr.
func runAgent(t *testing.T, agent string, args ...string) (int, string, string) {
	t.Helper()
	cmd, stdout, stderr := agentCmd(t, agent, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	code := waitFor(cmd, 60*time.Second)
	return code, stdout.String(), stderr.String()
}

// TestExecUsageErrors: a bad --timeout or --max-procs is a usage error
// that names the flag that is wrong, and says a duration needs a unit.
func TestExecUsageErrors(t *testing.T) {
	agent := agentBinary(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--timeout", "-1s"}, "metnos-agent: --timeout -1s: give a positive duration, e.g. 30s"},
		{[]string{"--timeout", "0"}, "metnos-agent: --timeout 0s: give a positive duration, e.g. 30s"},
		{[]string{"--timeout", "5"}, `metnos-agent: invalid value "5" for flag --timeout: a duration needs a unit: give e.g. 5s`},
		{[]string{"--max-procs", "0"}, "metnos-agent: --max-procs 0: give a positive number of processes"},
		{[]string{"--max-output", "0"}, `metnos-agent: invalid value "0" for flag --max-output: "0" is not a size`},
		{[]string{"--allow-net", "example.org", "--net"}, "metnos-agent: --allow-net narrows the network to the hosts named; it contradicts --net"},
		{[]string{"--allow-net", "example.org", "--profile", "full"}, "metnos-agent: --allow-net narrows the network to the hosts named; it contradicts --net and the profiles full"},
		{[]string{"--allow-net", "not a host"}, `metnos-agent: --allow-net: `},
	} {
		code, stdout, stderr := runAgent(t, agent, append(append([]string{"exec"}, tc.args...), "--", "true")...)
		if code != exitUsage || stdout != "" || !strings.HasPrefix(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stderr %q\nwant exit %d and one line starting %q", tc.args, code, stderr, exitUsage, tc.want)
		}
		if tc.args[0] == "--timeout" && strings.Contains(stderr, "max-procs") || tc.args[0] == "--max-procs" && strings.Contains(stderr, "timeout") {
			t.Errorf("%q: %q names the other flag", tc.args, stderr)
		}
	}
}

// TestExecRefusalsBeforeTheSandbox: the paths exec refuses are shown
// with their control characters escaped, a missing --cwd is said not
// to exist, and a file without an execute bit is named once with what
// to do.
func TestExecRefusalsBeforeTheSandbox(t *testing.T) {
	agent := agentBinary(t)
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec.sh")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--write", "/tmp/\x1b]0;pwn\ax", "--", "true"}, `--write /tmp/\x1b]0;pwn\x07x: no such file or directory`},
		{[]string{"--read", "/tmp/\x1b[31mx", "--", "true"}, `--read /tmp/\x1b[31mx: no such file or directory`},
		{[]string{"--", "/tmp/\x1b[31mnope"}, `/tmp/\x1b[31mnope: no such file or directory`},
		{[]string{"--cwd", "/tmp/\x1b[31mnope", "--", "true"}, `--cwd /tmp/\x1b[31mnope: does not exist`},
		{[]string{"--cwd", "/nonexistent", "--", "true"}, `--cwd /nonexistent: does not exist`},
		{[]string{"--cwd", "relative/dir", "--", "true"}, `--cwd relative/dir: does not exist`},
		{[]string{"--read", dir, "--", noexec}, noexec + ": is not executable (chmod +x it, or run it with its interpreter)"},
	} {
		code, stdout, stderr := runAgent(t, agent, append([]string{"exec"}, tc.args...)...)
		if want := "metnos-agent: " + tc.want + "\n"; code != exitAgent || stdout != "" || stderr != want {
			t.Errorf("%q: exit %d, stderr %q\nwant exit %d, stderr %q", tc.args, code, stderr, exitAgent, want)
		}
	}
}

// TestExecNotAProgram: a file with the execute bit that is neither a
// program nor a script with a #! line is said to be so, named once.
func TestExecNotAProgram(t *testing.T) {
	agent := needExecSandbox(t)
	dir, err := os.MkdirTemp("/var/tmp", "metnos-exec-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "n.sh")
	if err := os.WriteFile(script, []byte("echo no shebang\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runAgent(t, agent, "exec", "--read", dir, "--", script)
	want := "metnos-agent: could not start " + script + ": it is neither a program nor a script with a #! line (add one, e.g. #!/bin/sh, or run it with its interpreter)\n"
	if code != exitAgent || stdout != "" || stderr != want {
		t.Errorf("exit %d, stdout %q, stderr %q\nwant exit %d, stderr %q", code, stdout, stderr, exitAgent, want)
	}
}

// TestExecOutputLimit: output past --max-output (8 MiB by default) is
// no success: exec exits 1 and says how to raise the limit; with the
// limit raised, every byte arrives and exec exits 0.
func TestExecOutputLimit(t *testing.T) {
	agent := needExecSandbox(t)
	const n = 9_000_000
	prog := "head -c " + strconv.Itoa(n) + " /dev/zero"
	code, stdout, stderr := runAgent(t, agent, "exec", "--", "sh", "-c", prog)
	if code != exitFailure || len(stdout) != 8<<20 || !strings.Contains(stderr, "more than --max-output 8 MiB to stdout; the rest was dropped: run it again with a larger --max-output") {
		t.Errorf("default limit: exit %d, %d bytes, stderr %q; want exit 1, 8 MiB and the limit named", code, len(stdout), stderr)
	}
	code, stdout, stderr = runAgent(t, agent, "exec", "--max-output", "16M", "--", "sh", "-c", prog)
	if code != exitOK || len(stdout) != n || withoutDowngrade(stderr) != "" {
		t.Errorf("--max-output 16M: exit %d, %d bytes, stderr %q; want exit 0 and %d bytes", code, len(stdout), stderr, n)
	}
}

// TestExecSIGTERMExitStatus: SIGTERM ends exec with 143 (128+15), as
// it would a command killed by it; SIGINT with 130.
func TestExecSIGTERMExitStatus(t *testing.T) {
	agent := needExecSandbox(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd, _, stderr := agentCmd(t, agent, "exec", "--", "sleep", "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		cmd.Process.Signal(sig)
		want := map[syscall.Signal]string{syscall.SIGTERM: "interrupted by SIGTERM", syscall.SIGINT: "interrupted"}[sig]
		if code := waitFor(cmd, 20*time.Second); code != 128+int(sig) || !strings.Contains(stderr.String(), want) {
			t.Errorf("%v: exit %d, stderr %q; want %d, saying %q", sig, code, stderr, 128+int(sig), want)
		}
	}
}

// TestLookPathReadsNoEnvironment: exec finds a command on the PATH the
// configuration read, not on the process's own (which exec.LookPath
// would read): a command only the process's PATH holds is not found.
func TestLookPathReadsNoEnvironment(t *testing.T) {
	cfgDir, procDir := t.TempDir(), t.TempDir()
	for _, d := range []string{cfgDir, procDir} {
		if err := os.WriteFile(filepath.Join(d, "tool-"+filepath.Base(d)), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(cfgDir, "not-executable"), nil, 0o644)
	t.Setenv("PATH", procDir)
	path := "relative:" + cfgDir
	if got := lookPath("tool-"+filepath.Base(cfgDir), path); got != filepath.Join(cfgDir, "tool-"+filepath.Base(cfgDir)) {
		t.Errorf("the configuration's PATH: found %q", got)
	}
	if got := lookPath("tool-"+filepath.Base(procDir), path); got != "" {
		t.Errorf("found %q on the process's PATH", got)
	}
	if got := lookPath("not-executable", path); got != "" {
		t.Errorf("found %q, which is not executable", got)
	}
}
