package sandbox

import (
	"github.com/metnos/agent/sandbox/changes"
)

// DryRun is what a dry run ([Request].DryRun) would have changed: the
// changes its command made to the copy-on-write layer in front of the
// folders it could write, which were thrown away with the layer.
type DryRun struct {
	// Layer is how the writes were kept from the folders: "overlay"
	// (Linux's overlay file system, mounted in a mount namespace of the
	// run's own).
	Layer string `json:"layer"`
	// Applied is always false: nothing of Changes was made to the
	// folders. It is there so that a reader of the result cannot take
	// the command's own words ("ok", "created") for changes made.
	Applied bool `json:"applied"`
	// Layered are the folders whose changes are listed: every folder
	// the run could write (a writable file's folder for a file), but
	// the agent's own.
	Layered []string `json:"layered"`
	// Changes is what the command changed in them, as package changes
	// lists it: at most [MaxDryRunChanges], the rest counted in More.
	Changes []changes.Change `json:"changes"`
	More    int              `json:"more,omitempty"`
}

// MaxDryRunChanges is how many changes a DryRun lists.
const MaxDryRunChanges = 5000

// dryRunOS says why a dry run cannot be made on the system goos at all
// ("" on Linux, where it depends on the machine and the Policy).
func dryRunOS(goos string) string {
	switch goos {
	case "linux":
		return ""
	case "windows":
		return "a dry run puts the folders a run may write behind a copy-on-write layer, which this agent makes with Linux's overlay file system; Windows gives a sandboxed process nothing of the kind, so a dry run is refused here rather than run for real"
	case "darwin":
		return "a dry run puts the folders a run may write behind a copy-on-write layer, which this agent makes with Linux's overlay file system; macOS gives a sandboxed process nothing of the kind, so a dry run is refused here rather than run for real"
	}
	return "a dry run needs Linux's overlay file system, which " + goos + " does not have: refused rather than run for real"
}
