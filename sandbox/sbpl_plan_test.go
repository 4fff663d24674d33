package sandbox

import (
	"strings"
	"testing"
)

func TestSeatbeltPlan(t *testing.T) {
	masked := []Mask{{Path: "/Users/a/.ssh", Kind: MaskDir}}
	for _, c := range []struct {
		name     string
		have     bool
		disabled string
		p        Policy
		min      Level
		sandbox  string
		refused  string // a substring; "" when it runs
	}{
		{"manifest", true, "", Policy{Profile: ProfileManifest, Masks: masked}, LevelNone, "seatbelt", ""},
		{"isolated minimum", true, "", Policy{MinSandbox: LevelIsolated}, LevelNone, "seatbelt", ""},
		{"agent minimum isolated", true, "", Policy{}, LevelIsolated, "seatbelt", ""},
		{"full minimum", true, "", Policy{MinSandbox: LevelFull}, LevelNone, "seatbelt", `minimum sandbox "full"`},
		{"agent full minimum", true, "", Policy{Network: true}, LevelFull, "seatbelt", `minimum sandbox "full"`},
		{"full-fs-no-net", true, "", Policy{Profile: ProfileFullFSNoNet, NoFallback: true, MinSandbox: LevelFull}, LevelNone, "seatbelt", "will not fall back"},
		{"no sandbox-exec", false, "", Policy{Network: true, RootWritable: true}, LevelNone, "none", "/usr/bin/sandbox-exec is missing"},
		{"no sandbox-exec, manifest", false, "", Policy{Masks: masked}, LevelNone, "none", "/usr/bin/sandbox-exec is missing"},
		{"disabled, network", true, "disabled by METNOS_SANDBOX=off", Policy{Network: true, Masks: masked}, LevelNone, "none", ""},
		{"disabled, cut", true, "disabled by METNOS_SANDBOX=off", Policy{}, LevelNone, "none", "cuts the network"},
		{"disabled, unix", true, "disabled by METNOS_SANDBOX=off", Policy{Network: true, UnixSockets: true, Masks: masked}, LevelNone, "none", "unix sockets"},
		{"disabled, minimum", true, "disabled by METNOS_SANDBOX=off", Policy{Network: true}, LevelContained, "none", `minimum sandbox "contained"`},
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
