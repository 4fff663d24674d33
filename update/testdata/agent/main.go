// Command agent is a stand-in metnos-agent for package update's tests,
// built by them with its version and behaviour stamped in:
//
//	go build -ldflags '-X main.version=2.0.0 -X main.mode=crash'
//
// `agent version` prints the version and exits 0, as any build that
// starts does. `agent run STATE` starts as `metnos-agent run` does:
// update.Boot on this executable (update.FilesFor(update.Executable()))
// with the update record STATE, exiting 0 when the outcome is
// RolledBack, for the supervisor to start the previous build. Then, by
// mode: "ok" reaches its first successful poll (Updater.Confirm) and
// exits 0; "crash" exits 2, as a build with a start-up bug would.
package main

import (
	"fmt"
	"os"

	"github.com/metnos/agent/update"
)

var (
	version = "dev"
	mode    = "ok"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Println("metnos-agent", version)
		return
	}
	if len(os.Args) != 3 || os.Args[1] != "run" {
		fmt.Fprintln(os.Stderr, "usage: agent version | agent run STATE")
		os.Exit(64)
	}
	exe, err := update.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	files := update.FilesFor(exe)
	out, _, err := update.Boot(os.Args[2], files, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "boot:", err)
	}
	if out == update.RolledBack {
		fmt.Println("rolled back", version)
		return
	}
	switch mode {
	case "crash":
		fmt.Fprintln(os.Stderr, "start-up bug in", version)
		os.Exit(2)
	default:
		update.New(update.Config{StatePath: os.Args[2], Files: files, Version: version, Probation: out == update.Probation}).Confirm()
		fmt.Println("running", version)
	}
}
