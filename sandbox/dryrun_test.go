package sandbox

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/metnos/agent/policy"
)

// TestDryRunOS: a dry run is refused off Linux, saying why, and tried on
// Linux.
func TestDryRunOS(t *testing.T) {
	for _, tc := range []struct {
		goos, want string
	}{
		{"linux", ""},
		{"windows", "Windows gives a sandboxed process nothing of the kind"},
		{"darwin", "macOS gives a sandboxed process nothing of the kind"},
		{"freebsd", "freebsd does not have"},
	} {
		got := dryRunOS(tc.goos)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("dryRunOS(%q) = %q, want it to say %q", tc.goos, got, tc.want)
		}
	}
}

// TestWindowsDryRunRefused: off Linux (Windows under Wine in .ci/wine,
// macOS), Run refuses a dry run before anything starts, with a
// RefusedError whose DryRun is set.
func TestWindowsDryRunRefused(t *testing.T) {
	if runtime.GOOS == "linux" {
		t.Skip("Linux makes dry runs (dryrun_linux_test.go)")
	}
	_, err := Run(context.Background(), Request{Argv: []string{"true"}, DryRun: true,
		Policy: policy.Policy{Profile: policy.ProfileSupervised}})
	var re *RefusedError
	if !errors.As(err, &re) || !re.DryRun || re.Why != dryRunOS(runtime.GOOS) {
		t.Fatalf("got %v, want the dry run refused on %s", err, runtime.GOOS)
	}
}
