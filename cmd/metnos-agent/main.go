// Command metnos-agent is the Metnos device agent: it runs the server's
// signed executors on this machine inside the strongest sandbox the OS
// offers. Run "metnos-agent help" for its commands.
package main

import (
	"os"

	"github.com/metnos/agent/cmd/metnos-agent/cli"
	"github.com/metnos/agent/sandbox/shim"
)

func main() {
	shim.MainIfShim()
	os.Exit(cli.Main(os.Args[1:]))
}
