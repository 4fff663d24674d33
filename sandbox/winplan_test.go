package sandbox

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/testkit/golden"
)

// The machines the Windows planner chooses for.
var (
	winAppContainer = Caps{OS: "windows", AppContainer: true, LowIntegrity: true}
	winLowOnly      = Caps{OS: "windows", LowIntegrity: true, AppContainerNote: "CreateAppContainerProfile: not implemented (Wine)"}
	winJobOnly      = Caps{OS: "windows", AppContainerNote: "CreateAppContainerProfile: not implemented (Wine)", LowIntegrityNote: "a low-integrity process could not be started: access denied"}
	winOwnerOff     = Caps{OS: "windows", LowIntegrity: true, AppContainerNote: "turned off by the owner (METNOS_SANDBOX_APPCONTAINER=0)"}
	winDisabled     = Caps{OS: "windows", Disabled: "disabled by METNOS_SANDBOX=off"}
)

// TestWinPlanFor: the rung each machine gives each shape of Policy, the
// word, what the reason says is not enforced, and what is refused.
func TestWinPlanFor(t *testing.T) {
	home := `C:\Users\u`
	grants := []policy.Grant{{Path: home, Access: policy.Read}}
	masks := []policy.Mask{{Path: home + `\.ssh`, Kind: policy.MaskDir}}
	egress := &policy.Egress{}
	for _, tc := range []struct {
		name    string
		c       Caps
		p       policy.Policy
		min     policy.Level
		strict  bool
		word    string
		reason  []string // substrings of the reason
		not     []string // what the reason must not say
		refused string
	}{
		{"manifest", winAppContainer, policy.Policy{Grants: grants, Masks: masks}, policy.LevelNone, false, "appcontainer",
			[]string{"appcontainer:", "ACLs for the container", "nucleus under a grant is denied"}, []string{"not enforced", "not appcontainer"}, ""},
		{"min isolated", winAppContainer, policy.Policy{MinSandbox: policy.LevelIsolated}, policy.LevelNone, false, "appcontainer", nil, nil, ""},
		{"agent full", winAppContainer, policy.Policy{}, policy.LevelFull, false, "appcontainer", nil, nil, `minimum sandbox "full" not met`},
		{"network", winAppContainer, policy.Policy{Network: true}, policy.LevelNone, false, "appcontainer", nil, []string{"not enforced"}, ""},
		{"egress", winAppContainer, policy.Policy{Egress: egress}, policy.LevelNone, false, "appcontainer",
			[]string{"not enforced: the network narrowed to the hosts", "cannot reach the run's egress proxy on loopback"}, nil, ""},
		{"egress strict", winAppContainer, policy.Policy{Egress: egress}, policy.LevelNone, true, "appcontainer", nil, nil, "network strict"},
		{"readonly", winAppContainer, policy.Policy{Profile: policy.ProfileReadonly, RootReadable: true, Masks: masks}, policy.LevelNone, false, "job-object+low-integrity",
			[]string{"not appcontainer: the readonly profile reads the whole file system", "can still read what this user can read, the nucleus included", "not enforced: the network cut, the grants and masks for reading"}, nil, ""},
		{"readonly min isolated", winAppContainer, policy.Policy{Profile: policy.ProfileReadonly, RootReadable: true, MinSandbox: policy.LevelIsolated}, policy.LevelNone, false, "job-object+low-integrity", nil, nil, `minimum sandbox "isolated" not met`},
		{"full", winAppContainer, policy.Policy{Profile: policy.ProfileFull, RootWritable: true, Network: true}, policy.LevelNone, false, "job-object",
			[]string{"not appcontainer: profile full opens the whole file system"}, []string{"not enforced"}, ""},
		{"full-fs-no-net", winAppContainer, policy.Policy{Profile: policy.ProfileFullFSNoNet, RootWritable: true, NoFallback: true}, policy.LevelNone, false, "job-object", nil, nil, "will not fall back"},
		{"host pids", winAppContainer, policy.Policy{HostPIDs: true}, policy.LevelNone, false, "appcontainer", []string{"sees every process on the machine"}, []string{"not kept from reading or ending"}, ""},
		{"low only writes", winLowOnly, policy.Policy{Grants: []policy.Grant{{Path: home, Access: policy.Write}}}, policy.LevelNone, false, "job-object",
			[]string{"not job-object+low-integrity: a low-integrity token would keep the command from writing the folders it is granted", "not enforced: the network cut, the file grants and masks"}, nil, ""},
		{"low only", winLowOnly, policy.Policy{Grants: grants, Masks: masks}, policy.LevelNone, false, "job-object+low-integrity",
			[]string{"no AppContainer: CreateAppContainerProfile: not implemented (Wine)", "not enforced: the network cut, the grants and masks for reading"}, nil, ""},
		{"low only min isolated", winLowOnly, policy.Policy{MinSandbox: policy.LevelIsolated}, policy.LevelNone, false, "job-object+low-integrity", nil, nil, `minimum sandbox "isolated" not met: Windows gives job-object+low-integrity here, which is "contained"`},
		{"owner off", winOwnerOff, policy.Policy{}, policy.LevelNone, false, "job-object+low-integrity", []string{"no AppContainer: turned off by the owner (METNOS_SANDBOX_APPCONTAINER=0)"}, nil, ""},
		{"job only", winJobOnly, policy.Policy{Grants: grants, Masks: masks}, policy.LevelNone, false, "job-object",
			[]string{"job-object only", "no AppContainer: CreateAppContainerProfile", "no low-integrity token: a low-integrity process could not be started", "not enforced: the network cut, the file grants and masks"}, nil, ""},
		{"job only egress strict", winJobOnly, policy.Policy{Egress: egress}, policy.LevelNone, true, "job-object", nil, nil, "job-object cannot hold a program to them"},
		{"job host pids", winJobOnly, policy.Policy{HostPIDs: true, Network: true}, policy.LevelNone, false, "job-object", []string{"not kept from reading or ending this user's other processes"}, nil, ""},
		{"disabled", winDisabled, policy.Policy{}, policy.LevelNone, false, "none", []string{"disabled by METNOS_SANDBOX=off"}, nil, ""},
		{"disabled contained", winDisabled, policy.Policy{}, policy.LevelContained, false, "none", nil, nil, `minimum sandbox "contained" not met`},
	} {
		pl := winPlanFor(tc.c, tc.p, tc.min, tc.strict)
		if pl.Sandbox != tc.word {
			t.Errorf("%s: word %q, want %q", tc.name, pl.Sandbox, tc.word)
		}
		if pl.Reason == "" {
			t.Errorf("%s: no reason", tc.name)
		}
		for _, w := range tc.reason {
			if !strings.Contains(pl.Reason, w) {
				t.Errorf("%s: reason %q lacks %q", tc.name, pl.Reason, w)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(pl.Reason, w) {
				t.Errorf("%s: reason %q says %q", tc.name, pl.Reason, w)
			}
		}
		if (tc.refused == "") != (pl.Refused == "") || !strings.Contains(pl.Refused, tc.refused) {
			t.Errorf("%s: refused %q, want %q", tc.name, pl.Refused, tc.refused)
		}
	}
}

// TestWinNetwork: an AppContainer gets internetClient only when the
// Policy opens the network (or narrows it, which it cannot hold), and no
// capability, so no network at all, otherwise.
func TestWinNetwork(t *testing.T) {
	for _, tc := range []struct {
		p    policy.Policy
		r    winRung
		caps int
		note string
	}{
		{policy.Policy{}, rungAppContainer, 0, "cut: the AppContainer holds no network capability"},
		{policy.Policy{Network: true}, rungAppContainer, 1, "open: the internet (internetClient)"},
		{policy.Policy{Egress: &policy.Egress{}}, rungAppContainer, 1, "not only the hosts the manifest names"},
		{policy.Policy{}, rungJob, 0, "not cut: job-object cannot cut the network"},
		{policy.Policy{}, rungLowIntegrity, 0, "not cut: job-object+low-integrity cannot"},
	} {
		note, caps := winNetwork(tc.p, tc.r)
		if len(caps) != tc.caps || (tc.caps == 1 && caps[0] != "internetClient") || !strings.Contains(note, tc.note) {
			t.Errorf("%+v on %s: %q %v, want %d capability, %q", tc.p, tc.r.word(), note, caps, tc.caps, tc.note)
		}
	}
}

// winHome and the paths below are a Windows user's, as the agent's
// layout and Derive give them there.
const (
	winHome    = `C:\Users\u`
	winData    = `C:\Users\u\AppData\Local\metnos`
	winRoaming = `C:\Users\u\AppData\Roaming\metnos`
	winScratch = `C:\Users\u\AppData\Local\Temp\metnos-exec-42-0123`
)

// winOwn are the agent's own grants of an executor run on Windows: its
// code, the shim, its data folder and the interpreter, in the agent's
// cache and data folders.
var winOwn = []policy.Grant{
	{Path: winData + `\cache\executors\list_dirs-ab12`, Access: policy.Read, Own: true, Why: "executor list_dirs"},
	{Path: winData + `\cache\shim\cd34`, Access: policy.Read, Own: true, Why: "shim"},
	{Path: winData + `\shimdata\list_dirs`, Access: policy.Write, Own: true, Why: "METNOS_USER_DATA"},
	{Path: winData + `\cache\runtime\versions\cpython-3.12`, Access: policy.Read, Own: true, Why: "python runtime"},
}

// winNucleus is part of the nucleus of that user: keys, a browser
// profile, the DPAPI master keys, the agent's own folders (the Rust
// client's too: the same ones).
var winNucleus = []policy.Mask{
	{Path: winHome + `\.ssh`, Kind: policy.MaskDir, Why: "~/.ssh"},
	{Path: winHome + `\.aws`, Kind: policy.MaskDir, Why: "~/.aws"},
	{Path: winHome + `\.netrc`, Kind: policy.MaskFile, Why: "~/.netrc"},
	{Path: winHome + `\AppData\Local\Google\Chrome\User Data`, Kind: policy.MaskDir, Why: "~/AppData/Local/Google/Chrome/User Data"},
	{Path: winHome + `\AppData\Roaming\Microsoft\Protect`, Kind: policy.MaskDir, Why: "~/AppData/Roaming/Microsoft/Protect"},
	{Path: winData, Kind: policy.MaskDir, Why: "agent data " + winData},
	{Path: winRoaming, Kind: policy.MaskDir, Why: "agent data " + winRoaming},
}

// winDisk is what exists on that machine: every folder and file the
// plans below name, but ~/.aws and ~/.netrc, and the Documents\new
// folder a write_files run would create.
func winDisk(p string) pathKind {
	switch k := winKey(p); {
	case k == winKey(winHome+`\.aws`), k == winKey(winHome+`\.netrc`), k == winKey(winHome+`\Documents\new`):
		return kindAbsent
	case strings.HasSuffix(k, ".txt"):
		return kindFile
	}
	return kindDir
}

func withOwn(gs ...policy.Grant) []policy.Grant {
	return append(append([]policy.Grant(nil), winOwn...), gs...)
}

// TestPlanACLsGolden: the plan of every example profile and of the
// upstream executors' capability blocks, on a Windows user's machine
// with an AppContainer: the word, the reason, the network and its
// capabilities, and every access-control entry (path, rights,
// inheritance), golden-tested.
func TestPlanACLsGolden(t *testing.T) {
	for _, c := range []struct {
		name string
		p    policy.Policy
	}{
		// The profiles (policy.Profiles), as exec builds them.
		{"profile_supervised_write", policy.Policy{Profile: policy.ProfileSupervised, Grants: []policy.Grant{{Path: winHome + `\scratch`, Access: policy.Write, Why: "--write"}}, Masks: winNucleus}},
		{"profile_readonly", policy.Policy{Profile: policy.ProfileReadonly, RootReadable: true, Masks: winNucleus}},
		{"profile_full", policy.Policy{Profile: policy.ProfileFull, RootWritable: true, Network: true, Masks: winNucleus}},
		{"profile_full_fs_no_net", policy.Policy{Profile: policy.ProfileFullFSNoNet, RootWritable: true, NoFallback: true, Masks: winNucleus}},
		// The upstream executors' capability blocks (executors/*/manifest.toml).
		// list_dirs, find_files: fs:read "~/**".
		{"fs_read_home", policy.Policy{Profile: policy.ProfileManifest, Grants: withOwn(policy.Grant{Path: winHome, Access: policy.Read, Why: "fs:read hint ~/**"}), Masks: winNucleus}},
		// write_files into a new folder: fs:write arg:path.
		{"fs_write_args", policy.Policy{Profile: policy.ProfileManifest, Grants: withOwn(
			policy.Grant{Path: winHome + `\Documents\new`, Access: policy.Write, Why: "arg path"},
			policy.Grant{Path: winHome + `\Documents\notes.txt`, Access: policy.Write, Why: "arg path"}), Masks: winNucleus}},
		// move_files over the whole home: fs:write "~/**".
		{"fs_write_home", policy.Policy{Profile: policy.ProfileManifest, Grants: withOwn(policy.Grant{Path: winHome, Access: policy.Write, Why: "fs:write hint ~/**"}), Masks: winNucleus}},
		// network:http api.github.com: narrowed to named hosts.
		{"network_http", policy.Policy{Profile: policy.ProfileManifest, Grants: withOwn(), Masks: winNucleus, Egress: &policy.Egress{}}},
		// network:sites "*": the whole network.
		{"network_sites", policy.Policy{Profile: policy.ProfileManifest, Grants: withOwn(), Masks: winNucleus, Network: true}},
		// system:read processes, health.
		{"system_read_processes", policy.Policy{Profile: policy.ProfileManifest, Grants: withOwn(), Masks: winNucleus, HostPIDs: true}},
		// compute:pure: the agent's own folders only.
		{"compute_pure", policy.Policy{Profile: policy.ProfileManifest, Grants: withOwn(), Masks: winNucleus, MinSandbox: policy.LevelIsolated}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl := winPlanFor(winAppContainer, c.p, policy.LevelNone, false)
			note, caps := winNetwork(c.p, pl.win)
			out := struct {
				Sandbox      string   `json:"sandbox"`
				Refused      string   `json:"refused,omitempty"`
				Reason       string   `json:"reason"`
				Network      string   `json:"network"`
				Capabilities []string `json:"capabilities"`
				ACL          *aclPlan `json:"acl,omitempty"`
			}{Sandbox: pl.Sandbox, Refused: pl.Refused, Reason: pl.Reason, Network: note, Capabilities: caps}
			if pl.win == rungAppContainer && pl.Refused == "" {
				acl := planACLs(c.p, winScratch, winDisk)
				out.ACL = &acl
			}
			b, err := json.MarshalIndent(out, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden.Compare(t, filepath.Join("testdata", "winplan", c.name+".golden"), append(b, '\n'))
		})
	}
}

// TestPlanACLs: what the golden files show, asserted: a read grant gives
// read, a write grant modify, inherited on folders and not on files;
// the agent's own folders and the scratch folder get theirs; the
// nucleus under a user's grant is denied, existing paths only, and a
// missing one under a write grant is reported; nothing is denied that
// no grant reaches; system folders get no entry.
func TestPlanACLs(t *testing.T) {
	p := policy.Policy{
		System: []string{`C:\Windows`, `C:\Program Files\Git\cmd`},
		Grants: withOwn(
			policy.Grant{Path: winHome, Access: policy.Read, Why: "fs:read ~/**"},
			policy.Grant{Path: winHome + `\Documents`, Access: policy.Write, Why: "arg"},
			policy.Grant{Path: winHome + `\Documents\a.txt`, Access: policy.Write, Why: "arg"},
			policy.Grant{Path: winHome + `\Documents\new`, Access: policy.Write, Why: "arg"},
		),
		Masks: append(append([]policy.Mask(nil), winNucleus...),
			policy.Mask{Path: `D:\elsewhere\.ssh`, Kind: policy.MaskDir, Why: "not under a grant"},
			policy.Mask{Path: winHome + `\Documents\.git-credentials`, Kind: policy.MaskFile, Why: "~/Documents/.git-credentials"}),
	}
	kind := func(p string) pathKind {
		if winKey(p) == winKey(winHome+`\Documents\.git-credentials`) {
			return kindAbsent
		}
		return winDisk(p)
	}
	pl := planACLs(p, winScratch, kind)
	got := map[string]ace{}
	for _, e := range pl.ACEs {
		if _, dup := got[winKey(e.Path)]; dup {
			t.Errorf("two entries on %s", e.Path)
		}
		got[winKey(e.Path)] = e
	}
	for path, want := range map[string]ace{
		winHome:                      {Rights: aceRead, Inherit: true},
		winHome + `\Documents`:       {Rights: aceModify, Inherit: true},
		winHome + `\Documents\a.txt`: {Rights: aceModify},
		winScratch:                   {Rights: aceModify, Inherit: true},
		winData + `\cache\executors\list_dirs-ab12`:    {Rights: aceRead, Inherit: true},
		winData + `\shimdata\list_dirs`:                {Rights: aceModify, Inherit: true},
		winHome + `\.ssh`:                              {Rights: aceDeny, Inherit: true},
		winHome + `\AppData\Roaming\Microsoft\Protect`: {Rights: aceDeny, Inherit: true},
		winData: {Rights: aceDeny, Inherit: true},
	} {
		e, ok := got[winKey(path)]
		if !ok || e.Rights != want.Rights || e.Inherit != want.Inherit {
			t.Errorf("%s: %+v (%v), want %s inherit=%v", path, e, ok, want.Rights, want.Inherit)
		}
	}
	for _, path := range []string{`C:\Windows`, `C:\Program Files\Git\cmd`, `D:\elsewhere\.ssh`, winHome + `\.aws`, winHome + `\.netrc`, winHome + `\Documents\new`} {
		if e, ok := got[winKey(path)]; ok {
			t.Errorf("%s has an entry: %+v", path, e)
		}
	}
	if len(pl.Absent) != 1 || pl.Absent[0] != winHome+`\Documents\.git-credentials` {
		t.Errorf("absent nucleus paths under a write grant: %v, want only ~/Documents/.git-credentials", pl.Absent)
	}
	if len(pl.Skipped) != 1 || pl.Skipped[0] != winHome+`\Documents\new` {
		t.Errorf("skipped grants %v, want the folder that does not exist", pl.Skipped)
	}
}

// TestWinWithin: containment by whole components, without regard to
// case or to the separator.
func TestWinWithin(t *testing.T) {
	for _, tc := range []struct {
		parent, p string
		want      bool
	}{
		{`C:\Users\u`, `C:\Users\u`, true},
		{`C:\Users\u`, `c:\users\U\.ssh`, true},
		{`C:\Users\u\`, `C:\Users\u\x`, true},
		{`C:\Users\u`, `C:\Users\uu`, false},
		{`C:\`, `C:\Users`, true},
		{`C:\Users\u`, `C:/Users/u/Documents`, true},
		{`C:\Users\u\Documents`, `C:\Users\u`, false},
	} {
		if got := winWithin(tc.parent, tc.p); got != tc.want {
			t.Errorf("winWithin(%q, %q) = %v", tc.parent, tc.p, got)
		}
	}
}
