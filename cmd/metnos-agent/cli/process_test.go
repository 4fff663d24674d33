package cli

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// mainArgsVar carries the arguments of the command line that
// TestMainProcess runs, separated by argSep.
const (
	mainArgsVar = "METNOS_TEST_MAIN_ARGS"
	argSep      = "\x1f"
)

// TestMainProcess is not a test of its own: it is the command line in
// the child processes of cliCommand.
func TestMainProcess(t *testing.T) {
	args, ok := os.LookupEnv(mainArgsVar)
	if !ok {
		t.Skip("the command line of cliCommand's child processes")
	}
	os.Exit(Main(strings.Split(args, argSep)))
}

// cliCommand returns the command that runs metnos-agent args as a
// process of its own (this test binary, in TestMainProcess), with only
// PATH, HOME (home) and the NAME=VALUE pairs of env in its environment.
func cliCommand(t *testing.T, home string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMainProcess$", "-test.count=1")
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + home, mainArgsVar + "=" + strings.Join(args, argSep)}, env...)
	return cmd
}
