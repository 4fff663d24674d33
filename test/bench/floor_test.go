package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/testkit/testbin"
)

// The floor variants show what issue 16's start-up targets are measured
// against: the part of agent-exec no change to metnos-agent's own code
// can remove while every layer stays on.
//
//   - bwrap-policy: bubblewrap with exactly the arguments the agent gave
//     it for the workload (the namespaces, mounts and masks of the
//     supervised profile), running the workload directly: no shim, so
//     no Landlock, no seccomp and no cgroup;
//   - go-minimal: minimalGo, built as the agent is (CGO_ENABLED=0,
//     -trimpath, -s -w): about the least a Go program costs to start and
//     end here. agent-exec starts two: the agent and the shim.

// policyBwrapArgv runs w once through sandbox.Run with a bubblewrap that
// records its arguments, and returns bubblewrap's command line as the
// agent built it, up to and including "--", without the descriptors
// only a live run has. The workload goes after it.
func policyBwrapArgv(t *testing.T, bwrap string, p policy.Policy, w []string) []string {
	t.Helper()
	dir := t.TempDir()
	rec := filepath.Join(dir, "argv")
	wrapper := filepath.Join(dir, "bwrap")
	script := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\0' \"$@\" >%s\nexec %s \"$@\"\n", shellQuote(rec), shellQuote(bwrap))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := testbin.SandboxOptions()
	opts.Bwrap = wrapper
	out, err := sandbox.Run(context.Background(), sandbox.Request{Argv: w, Policy: p, Options: opts})
	if err != nil {
		t.Fatalf("sandbox.Run of %q through the recording bwrap: %v", strings.Join(w, " "), err)
	}
	if out.ExitCode != 0 || out.Signal != "" {
		t.Fatalf("sandbox.Run of %q through the recording bwrap: exit %d %s: %s", strings.Join(w, " "), out.ExitCode, out.Signal, bytes.TrimSpace(out.Stderr))
	}
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatalf("the recording bwrap wrote nothing: %v", err)
	}
	args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	dd := slices.Index(args, "--")
	if dd < 0 {
		t.Fatalf("bubblewrap's arguments have no \"--\": %q", args)
	}
	argv := []string{bwrap}
	for i := 0; i < dd; i++ {
		switch args[i] {
		case "--info-fd":
			// The agent reads the child's pid there; nothing here does.
			i++
			continue
		case "--args", "--file", "--bind-data", "--ro-bind-data", "--seccomp", "--add-seccomp-fd",
			"--block-fd", "--userns-block-fd", "--sync-fd", "--json-status-fd", "--userns", "--userns2", "--pidns":
			t.Fatalf("bubblewrap's arguments use %s, a descriptor of the live run this bench cannot replay: teach policyBwrapArgv about it", args[i])
		}
		argv = append(argv, args[i])
	}
	return append(argv, "--")
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// floorReport says what agent-exec cannot go below with its layers:
// bwrap-policy plus the start of two Go programs, against the target.
func floorReport(med map[string]time.Duration, target float64) string {
	base, bp, gm := med["bwrap-minimal"], med["bwrap-policy"], med["go-minimal"]
	if base == 0 || bp == 0 || gm == 0 {
		return ""
	}
	floor := bp + 2*gm
	return fmt.Sprintf("\nfloor with every layer on: bwrap-policy + 2 × go-minimal (the agent and the shim) = %s = %.2f× bwrap-minimal; the target allows %s",
		ms(floor), ratio(floor, base), ms(time.Duration(target*float64(base))))
}
