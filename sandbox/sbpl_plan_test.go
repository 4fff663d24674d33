package sandbox

import (
	"strings"
	"testing"

	"github.com/metnos/agent/policy"
)

func TestSeatbeltPlan(t *testing.T) {
	masked := []policy.Mask{{Path: "/Users/a/.ssh", Kind: policy.MaskDir}}
	for _, c := range []struct {
		name     string
		have     bool
		disabled string
		p        policy.Policy
		min      policy.Level
		sandbox  string
		refused  string // a substring; "" when it runs
	}{
		{"manifest", true, "", policy.Policy{Profile: policy.ProfileManifest, Masks: masked}, policy.LevelNone, "seatbelt", ""},
		{"isolated minimum", true, "", policy.Policy{MinSandbox: policy.LevelIsolated}, policy.LevelNone, "seatbelt", ""},
		{"agent minimum isolated", true, "", policy.Policy{}, policy.LevelIsolated, "seatbelt", ""},
		{"full minimum", true, "", policy.Policy{MinSandbox: policy.LevelFull}, policy.LevelNone, "seatbelt", `minimum sandbox "full"`},
		{"agent full minimum", true, "", policy.Policy{Network: true}, policy.LevelFull, "seatbelt", `minimum sandbox "full"`},
		{"full-fs-no-net", true, "", policy.Policy{Profile: policy.ProfileFullFSNoNet, NoFallback: true, MinSandbox: policy.LevelFull}, policy.LevelNone, "seatbelt", "will not fall back"},
		{"host pids", true, "", policy.Policy{Network: true, HostPIDs: true}, policy.LevelNone, "seatbelt", "cannot show other processes' command lines without their environment"},
		{"host pids, disabled", true, "disabled by METNOS_SANDBOX=off", policy.Policy{Network: true, HostPIDs: true}, policy.LevelNone, "none", "system:read processes"},
		{"no sandbox-exec", false, "", policy.Policy{Network: true, RootWritable: true}, policy.LevelNone, "none", "/usr/bin/sandbox-exec is missing"},
		{"no sandbox-exec, manifest", false, "", policy.Policy{Masks: masked}, policy.LevelNone, "none", "/usr/bin/sandbox-exec is missing"},
		{"disabled, network", true, "disabled by METNOS_SANDBOX=off", policy.Policy{Network: true, Masks: masked}, policy.LevelNone, "none", ""},
		{"disabled, cut", true, "disabled by METNOS_SANDBOX=off", policy.Policy{}, policy.LevelNone, "none", "cuts the network"},
		{"disabled, unix", true, "disabled by METNOS_SANDBOX=off", policy.Policy{Network: true, UnixSockets: true, Masks: masked}, policy.LevelNone, "none", "unix sockets"},
		{"disabled, minimum", true, "disabled by METNOS_SANDBOX=off", policy.Policy{Network: true}, policy.LevelContained, "none", `minimum sandbox "contained"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, best, reason, refused := seatbeltPlan(c.have, c.disabled, c.p, c.min)
			if s != c.sandbox {
				t.Errorf("sandbox = %q, want %q", s, c.sandbox)
			}
			if want := map[bool]string{true: "seatbelt", false: "none"}[c.have]; best != want {
				t.Errorf("best = %q, want %q", best, want)
			}
			if reason == "" {
				t.Error("no reason: seatbelt is always weaker than the Linux layers")
			}
			if c.refused == "" && refused != "" || c.refused != "" && !strings.Contains(refused, c.refused) {
				t.Errorf("refused = %q, want %q", refused, c.refused)
			}
		})
	}
}
