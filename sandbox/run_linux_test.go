package sandbox

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
)

// TestFallbackLogsToCallersLogger: when bwrap turns out to be broken and
// Run falls back to a weaker sandbox, it says so to the logger the
// caller gave, and to no other (slog.Default is not the agent's log).
func TestFallbackLogsToCallersLogger(t *testing.T) {
	var dflt bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&dflt, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	var logs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := Run(ctx, Request{
		Argv:   []string{"/bin/true"},
		Policy: policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/bin", "/lib", "/lib64", "/etc"}, Network: true},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		// Present, and fails every run.
		Options: Options{Bwrap: "/bin/false"},
	})
	t.Logf("sandbox %q, err %v", out.Sandbox, err)
	const want = "bubblewrap is not usable here; falling back"
	if !strings.Contains(logs.String(), want) {
		t.Errorf("the caller's logger did not get %q:\n%s", want, logs.String())
	}
	if strings.Contains(dflt.String(), want) {
		t.Errorf("slog.Default got the sandbox's message:\n%s", dflt.String())
	}
}
