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

// floorSlack is issue 30's target: agent-exec at most this much above
// the floor, measured in the same run.
const floorSlack = 3 * time.Millisecond

// floorLine is one workload's agent-exec against the floor, from the
// medians of one run.
type floorLine struct {
	workload                string
	floor, exec, base, bare time.Duration
	// baseline is agent-exec-baseline's median (0: not measured).
	baseline time.Duration
	// start is agent-start's median beyond go-minimal's: the part of
	// the difference that is the agent's own start (0: not measured).
	start time.Duration
}

// floorOf is the floor line of workload w from the medians med by
// variant name; ok is false when a variant the floor needs is missing.
func floorOf(w string, med map[string]time.Duration) (floorLine, bool) {
	base, bp, gm, ae := med["bwrap-minimal"], med["bwrap-policy"], med["go-minimal"], med["agent-exec"]
	if base == 0 || bp == 0 || gm == 0 || ae == 0 {
		return floorLine{}, false
	}
	fl := floorLine{workload: w, floor: bp + 2*gm, exec: ae, base: base, bare: med["bare"], baseline: med["agent-exec-baseline"]}
	if as := med["agent-start"]; as != 0 {
		fl.start = as - gm
	}
	return fl, true
}

// withinSlack says whether d above the floor is within floorSlack.
func withinSlack(d time.Duration) string {
	if d <= floorSlack {
		return "met"
	}
	return "NOT met"
}

// floorReport says what agent-exec cannot go below with its layers:
// bwrap-policy plus the start of two Go programs; how far above it
// agent-exec is, against issue 30's target (floor + 3 ms); and issue
// 16's older target as a ratio to bwrap-minimal.
func floorReport(med map[string]time.Duration, target float64) string {
	fl, ok := floorOf("", med)
	if !ok {
		return ""
	}
	s := fmt.Sprintf("\nfloor with every layer on: bwrap-policy + 2 × go-minimal (the agent and the shim) = %s = %.2f× bwrap-minimal; issue 16's target allows %s",
		ms(fl.floor), ratio(fl.floor, fl.base), ms(time.Duration(target*float64(fl.base))))
	d := fl.exec - fl.floor
	s += fmt.Sprintf("\nagent-exec − floor = %s − %s = %s (%.2f× the floor); target agent-exec ≤ floor + %s: %s",
		ms(fl.exec), ms(fl.floor), ms(d), ratio(fl.exec, fl.floor), ms(floorSlack), withinSlack(d))
	if fl.start != 0 {
		s += fmt.Sprintf("\nof the difference, the agent's own start beyond go-minimal's (agent-start − go-minimal) is %s; the rest, %s, is exec's own work, the shim's beyond a Go start (Landlock, seccomp, the cgroups it joins) and the run's cgroups",
			ms(fl.start), ms(d-fl.start))
	}
	if fl.baseline != 0 {
		s += fmt.Sprintf("\nagent-exec-baseline − floor = %s (%.2f× the floor)", ms(fl.baseline-fl.floor), ratio(fl.baseline, fl.floor))
	}
	return s
}

// floorSummary is the floor lines of every workload of one run, side
// by side: floor, agent-exec, their difference and ratio, and the
// target.
func floorSummary(lines []floorLine) string {
	if len(lines) == 0 {
		return "no workload ran: no floor to compare with"
	}
	var b strings.Builder
	withBase := false
	for _, l := range lines {
		withBase = withBase || l.baseline != 0
	}
	b.WriteString("\nagent-exec against the floor (bwrap-policy + 2 × go-minimal), medians of this run; target: agent-exec ≤ floor + " + ms(floorSlack) +
		"; start: agent-start − go-minimal, the part of diff that is the agent's own start\n")
	fmt.Fprintf(&b, "%-26s %9s %10s %9s %8s %8s %8s %9s", "workload", "floor", "agent-exec", "diff", "/floor", "/bwrap", "target", "start")
	if withBase {
		fmt.Fprintf(&b, " %9s %9s", "baseline", "diff")
	}
	b.WriteString("\n")
	for _, l := range lines {
		d := l.exec - l.floor
		fmt.Fprintf(&b, "%-26s %9s %10s %9s %7.2f× %7.2f× %8s %9s", l.workload, ms(l.floor), ms(l.exec), ms(d), ratio(l.exec, l.floor), ratio(l.exec, l.base), withinSlack(d), ms(l.start))
		if withBase {
			if l.baseline != 0 {
				fmt.Fprintf(&b, " %9s %9s", ms(l.baseline), ms(l.baseline-l.floor))
			} else {
				fmt.Fprintf(&b, " %9s %9s", "-", "-")
			}
		}
		b.WriteString("\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}
