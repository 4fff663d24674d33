package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/sandbox/shim"
)

func TestMain(m *testing.M) {
	// The sandbox re-executes this binary as its shim (os.Executable:
	// the test binary, or its copy named metnos-agent on the scripts'
	// PATH), so the shim must get its turn before anything else.
	shim.MainIfShim()
	testscript.Main(m, map[string]func(){
		"metnos-agent": func() {
			shim.MainIfShim()
			os.Exit(Main(os.Args[1:]))
		},
	})
}

func TestScripts(t *testing.T) {
	// Work outside /tmp where possible: every profile but
	// full-fs-no-net hides the host's /tmp, which would make the
	// nucleus checks of the root-wide profiles pass for the wrong reason.
	var root string
	if d, err := os.MkdirTemp("/var/tmp", "metnos-cli-test-"); err == nil {
		root = d
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata",
		WorkdirRoot:         root,
		RequireExplicitExec: true,
		Setup: func(env *testscript.Env) error {
			home := filepath.Join(env.WorkDir, "home")
			env.Setenv("HOME", home)
			// The directory testscript puts its commands in, so that a
			// script can run them with a PATH that lacks bwrap.
			env.Setenv("SCRIPTBIN", filepath.SplitList(env.Getenv("PATH"))[0])
			return os.MkdirAll(home, 0o755)
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "fullsandbox":
				// Every layer: bwrap's namespaces, Landlock, seccomp.
				e, err := readEnvironment(os.Getenv)
				if err != nil {
					return false, err
				}
				c := sandbox.Probe(sandboxOptions(e))
				return c.BwrapUsable && c.LandlockABI > 0 && c.Seccomp && c.Disabled == "", nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"status":  cmdStatus,
			"jsonget": cmdJSONGet,
		},
	})
}

// cmdStatus runs a command and checks its exit status:
//
//	status N COMMAND [ARG...]
//
// Its stdout and stderr can be checked afterwards as with exec.
func cmdStatus(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! status")
	}
	if len(args) < 2 {
		ts.Fatalf("usage: status N COMMAND [ARG...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		got = ee.ExitCode()
	case err != nil:
		ts.Fatalf("%v", err)
	}
	if got != want {
		ts.Fatalf("exit status %d, want %d", got, want)
	}
}

// cmdJSONGet parses the last command's stdout as one JSON value and
// checks the value at a dotted path:
//
//	jsonget PATH [WANT]
//
// Without WANT the path must exist; with it, the value (a string as is,
// anything else in its JSON form) must equal WANT.
func cmdJSONGet(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: jsonget PATH [WANT]")
	}
	var v any
	if err := json.Unmarshal([]byte(ts.ReadFile("stdout")), &v); err != nil {
		ts.Fatalf("stdout is not JSON: %v", err)
	}
	for _, k := range strings.Split(args[0], ".") {
		m, ok := v.(map[string]any)
		if !ok {
			v = nil
			break
		}
		if v, ok = m[k]; !ok {
			break
		}
	}
	var got string
	var found bool
	switch x := v.(type) {
	case nil:
	case string:
		got, found = x, true
	default:
		b, _ := json.Marshal(x)
		got, found = string(b), true
	}
	ok := found && (len(args) == 1 || got == args[1])
	switch {
	case neg && ok:
		ts.Fatalf("%s is %q", args[0], got)
	case !neg && !found:
		ts.Fatalf("%s not found", args[0])
	case !neg && !ok:
		ts.Fatalf("%s is %q, want %q", args[0], got, args[1])
	}
}

func TestByteSize(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
	}{
		{"1", 1},
		{"4096", 4096},
		{"64K", 64 << 10},
		{"512M", 512 << 20},
		{"512m", 512 << 20},
		{"512MiB", 512 << 20},
		{"512MB", 512 << 20},
		{"1G", 1 << 30},
		{"2T", 2 << 40},
	} {
		var b byteSize
		if err := b.Set(tt.in); err != nil || int64(b) != tt.want {
			t.Errorf("Set(%q) = %d, %v; want %d", tt.in, b, err, tt.want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "M", "1.5G", "1X", "12Q", "99999999999T"} {
		var b byteSize
		if err := b.Set(bad); err == nil {
			t.Errorf("Set(%q) = %d, want an error", bad, b)
		}
	}
	b := byteSize(1 << 30)
	if got := b.String(); got != "1G" {
		t.Errorf("String() = %q, want 1G", got)
	}
}

func TestCommandEnv(t *testing.T) {
	t.Setenv("PATH", "/usr/bin:/nowhere/bin:relative:/bin:/usr/bin")
	t.Setenv("LANG", "")
	t.Setenv("TERM", "xterm")
	t.Setenv("TZ", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
	cfg := func() config.Config {
		e, err := readEnvironment(os.Getenv)
		if err != nil {
			t.Fatal(err)
		}
		return e.cfg
	}
	p := policy.Policy{System: []string{"/usr", "/bin"}}
	got := strings.Join(commandEnv(p, policy.Host{Home: "/home/u"}, cfg()), " ")
	want := "PATH=/usr/bin:/bin HOME=/home/u LANG=C.UTF-8 TERM=xterm"
	if got != want {
		t.Errorf("commandEnv = %q, want %q", got, want)
	}
	t.Setenv("PATH", "/nowhere")
	if got := commandEnv(p, policy.Host{Home: "/h"}, cfg())[0]; got != "PATH="+defaultPath {
		t.Errorf("with nothing visible: %q, want the default PATH", got)
	}
}
