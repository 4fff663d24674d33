// Command metnos-shim is the lean sandbox shim that metnos-agent runs
// inside bubblewrap for every command: it links only what confinement
// needs, so that it starts in a fraction of a millisecond. See package
// github.com/metnos/agent/sandbox/shim.
package main

import (
	"fmt"
	"os"

	"github.com/metnos/agent/sandbox/shim"
)

func main() {
	shim.MainIfShim()
	fmt.Fprintf(os.Stderr, "metnos-shim: this program is run by metnos-agent, not by hand\n")
	os.Exit(2)
}
