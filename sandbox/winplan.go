package sandbox

import (
	"fmt"
	"sort"
	"strings"

	"github.com/metnos/agent/policy"
)

// The Windows backend's plan, kept apart from its system calls so that
// every system tests it: which rung a run gets from what the machine
// offers, the access-control entries an AppContainer run adds, and the
// capabilities it holds. run_windows.go follows it.

// The Windows backend's sandbox words, strongest first.
const (
	// wordAppContainer: the command runs in this device's AppContainer,
	// inside its job object: it reaches only the folders its Policy
	// grants (by ACLs for the container) and the network only when the
	// Policy opens it. The word is the Rust client's.
	wordAppContainer = "appcontainer"
	// wordLowIntegrity: the command runs in its job object with a
	// restricted token at low integrity: it cannot write what this
	// user's programs write (files of medium integrity), but it can read
	// what this user can read.
	wordLowIntegrity = "job-object+low-integrity"
	// wordJobObject: the process tree is contained and limited; files
	// and network are not isolated.
	wordJobObject = "job-object"
)

// WordAppContainer is the sandbox word of a run in this device's
// AppContainer (Windows): the one container every run of the device
// shares, whose file grants are ACL entries for it.
const WordAppContainer = wordAppContainer

// winRung is one rung of the Windows backend.
type winRung int

const (
	rungNone winRung = iota
	rungJob
	rungLowIntegrity
	rungAppContainer
)

func (r winRung) word() string {
	switch r {
	case rungAppContainer:
		return wordAppContainer
	case rungLowIntegrity:
		return wordLowIntegrity
	case rungJob:
		return wordJobObject
	}
	return "none"
}

func (r winRung) level() policy.Level {
	switch r {
	case rungAppContainer:
		return policy.LevelIsolated
	case rungLowIntegrity, rungJob:
		return policy.LevelContained
	}
	return policy.LevelNone
}

// winBest is the strongest rung the machine c offers.
func winBest(c Caps) winRung {
	switch {
	case c.Disabled != "":
		return rungNone
	case c.AppContainer:
		return rungAppContainer
	case c.LowIntegrity:
		return rungLowIntegrity
	}
	return rungJob
}

// winPlanFor is the Windows planner: the strongest rung that c offers
// and that can hold p, the reason it is not more, and whether the run is
// refused (a minimum above the rung, a profile that will not fall back,
// a narrowed network this device wants strict).
func winPlanFor(c Caps, p policy.Policy, min policy.Level, strictEgress bool) Plan {
	best := winBest(c)
	r, why := best, ""
	switch {
	case best == rungNone:
	case p.RootWritable:
		// The full profiles open the whole file system: an AppContainer
		// would need an ACL on every folder, and a low integrity
		// token would take the writes the profile grants.
		r, why = rungJob, fmt.Sprintf("profile %s opens the whole file system, which an AppContainer or a low-integrity token would close", p.Profile)
	case p.RootReadable && best == rungAppContainer:
		// Read everything, write only the scratch folder: what a low
		// integrity token gives, not an AppContainer (an ACL on every
		// folder).
		r = rungLowIntegrity
		why = "the readonly profile reads the whole file system, which an AppContainer reaches only by an ACL on every folder"
		if !c.LowIntegrity {
			r = rungJob
			why += ", and a low-integrity token is not available here (" + c.LowIntegrityNote + ")"
		}
	}
	if r == rungLowIntegrity && writes(p) {
		// A low-integrity process cannot write what this user's
		// programs write: the grants would not hold.
		r, why = rungJob, "a low-integrity token would keep the command from writing the folders it is granted"
	}
	pl := Plan{Sandbox: r.word(), Best: best.word(), win: r}
	pl.Reason = winReason(c, p, r, best, why)
	need := max(p.MinSandbox, min)
	switch {
	case p.NoFallback:
		pl.Refused = fmt.Sprintf("profile %s needs a kernel network cut and a confined file view and will not fall back; Windows gives %s here: %s", p.Profile, pl.Sandbox, pl.Reason)
	case r.level() < need:
		pl.Refused = fmt.Sprintf("minimum sandbox %q not met: Windows gives %s here, which is %q (%s)", need, pl.Sandbox, r.level(), pl.Reason)
	case egressOf(p) != nil && strictEgress:
		pl.Refused = fmt.Sprintf("the run's network is narrowed to the hosts its manifest names, %s cannot hold a program to them, and this device refuses such runs (network strict)", pl.Sandbox)
	}
	return pl
}

// writes reports whether p grants a folder or file for writing.
func writes(p policy.Policy) bool {
	for _, g := range p.Grants {
		if g.Access == policy.Write {
			return true
		}
	}
	return false
}

// winHostPIDs is what a run of a Policy with HostPIDs (system:read
// processes) says: Windows has no PID namespace.
const winHostPIDs = "sees every process on the machine (system:read processes; Windows has no PID namespace)"

// winReason says what a run on rung r does not isolate, and why it is
// not on the best rung when it is not: the result's
// sandbox_downgrade_reason. It is always set on Windows.
func winReason(c Caps, p policy.Policy, r, best winRung, why string) string {
	var b strings.Builder
	switch r {
	case rungNone:
		return c.Disabled + ": no job object, only the direct child is killed at the deadline, and files and network are not isolated"
	case rungAppContainer:
		b.WriteString("appcontainer: the process tree runs in this device's AppContainer inside a job object; files are held to the grants by ACLs for the container, the nucleus under a grant is denied to it, system folders are readable as for every AppContainer")
	case rungLowIntegrity:
		b.WriteString("job-object+low-integrity: the process tree is contained and limited, and its low-integrity token keeps it from writing this user's files (but its scratch folder); it can still read what this user can read, the nucleus included, and the network is not isolated")
	case rungJob:
		b.WriteString("job-object only: the process tree is contained and limited, but file and network isolation are not applied, and a command running as this user can still start processes outside its job")
	}
	if r < best || why != "" {
		if why == "" {
			why = "no stronger rung here"
		}
		fmt.Fprintf(&b, "; not %s: %s", best.word(), why)
	} else if best < rungAppContainer && c.AppContainerNote != "" {
		fmt.Fprintf(&b, "; no AppContainer: %s", c.AppContainerNote)
		if best < rungLowIntegrity && c.LowIntegrityNote != "" {
			fmt.Fprintf(&b, "; no low-integrity token: %s", c.LowIntegrityNote)
		}
	}
	var not []string
	switch {
	case r == rungAppContainer && egressOf(p) != nil:
		not = append(not, "the network narrowed to the hosts the manifest names (an AppContainer cannot reach the run's egress proxy on loopback: the run gets the internet, internetClient)")
	case r == rungAppContainer:
	case egressOf(p) != nil:
		not = append(not, "the network narrowed to the hosts the manifest names (the proxy binds only programs that use the proxy variables; any other reaches every host)")
	case !p.Network:
		not = append(not, "the network cut")
	}
	if r < rungAppContainer && (len(p.Grants) > 0 || len(p.Masks) > 0) && !p.RootWritable {
		if r == rungLowIntegrity {
			not = append(not, "the grants and masks for reading")
		} else {
			not = append(not, "the file grants and masks")
		}
	}
	if len(not) > 0 {
		b.WriteString("; not enforced: " + strings.Join(not, ", "))
	}
	if p.HostPIDs {
		b.WriteString("; " + winHostPIDs)
		if r == rungJob {
			b.WriteString(", and, running as this user, is not kept from reading or ending this user's other processes")
		}
	}
	return b.String()
}

// winNetwork says how a run of p on rung r holds its network, and the
// capabilities its AppContainer gets.
func winNetwork(p policy.Policy, r winRung) (note string, caps []string) {
	switch {
	case r == rungAppContainer && p.Network:
		return "open: the internet (internetClient); an AppContainer reaches neither loopback nor the local network", []string{capInternetClient}
	case r == rungAppContainer && egressOf(p) != nil:
		return "the internet (internetClient), not only the hosts the manifest names: an AppContainer cannot reach the run's egress proxy on loopback", []string{capInternetClient}
	case r == rungAppContainer:
		return "cut: the AppContainer holds no network capability", nil
	case p.Network:
		return "open: the host's network", nil
	case egressOf(p) != nil:
		return "narrowed only for programs that use the proxy variables: " + r.word() + " cannot keep any other from the network (METNOS_NET_STRICT=1 refuses such runs)", nil
	}
	return "not cut: " + r.word() + " cannot cut the network", nil
}

// capInternetClient is the AppContainer capability of outbound
// connections to the internet.
const capInternetClient = "internetClient"

// aceRights is what an access-control entry of a run gives the
// container, or denies it.
type aceRights string

const (
	// aceRead: read and execute (FILE_GENERIC_READ|FILE_GENERIC_EXECUTE).
	aceRead aceRights = "read"
	// aceModify: read, execute, write and delete (Modify), not the
	// right to change permissions or take ownership.
	aceModify aceRights = "modify"
	// aceDeny: every access denied (an ACCESS_DENIED entry for
	// FILE_ALL_ACCESS), which wins over what a grant above allows.
	aceDeny aceRights = "deny"
)

// ace is one access-control entry a run adds for its container: on
// Path, for the container's SID, with Rights; Inherit for a folder
// (object and container inherit: everything below gets it too).
type ace struct {
	Path    string    `json:"path"`
	Rights  aceRights `json:"rights"`
	Inherit bool      `json:"inherit,omitempty"`
	// Why says which grant or mask it stands for.
	Why string `json:"why,omitempty"`
}

// pathKind is what a path is on the disk: absent, a file or a folder.
type pathKind int

const (
	kindAbsent pathKind = iota
	kindFile
	kindDir
)

// aclPlan is what an AppContainer run does to the file system: the
// entries it adds, and the nucleus paths under a write grant that do not
// exist, which no entry can deny (the command could create them).
type aclPlan struct {
	ACEs   []ace    `json:"aces"`
	Absent []string `json:"absent,omitempty"`
	// Skipped are grants of paths that do not exist: no entry can be put
	// on them, so the command cannot reach them.
	Skipped []string `json:"skipped,omitempty"`
}

// planACLs derives the entries of an AppContainer run of p whose
// scratch folder is scratch, with kind telling what each path is. Every
// grant gets an entry on its own path: read and execute, or modify;
// the agent's own folders (the executor's code, the shim, the
// interpreter, the executor's data) included, and the scratch folder
// modify. System folders get none: Windows lets every AppContainer read
// them (ALL APPLICATION PACKAGES). Every nucleus path that a grant (not
// the agent's own) covers gets a deny entry, which wins over the allow
// inherited from the grant; an own grant inside a masked folder keeps
// its access, its own allow coming before the inherited deny. Paths are
// Windows paths, compared without regard to case.
func planACLs(p policy.Policy, scratch string, kind func(string) pathKind) aclPlan {
	var pl aclPlan
	add := func(path string, r aceRights, why string) {
		k := kind(path)
		if k == kindAbsent {
			if r != aceDeny {
				pl.Skipped = append(pl.Skipped, path)
			}
			return
		}
		pl.ACEs = append(pl.ACEs, ace{Path: path, Rights: r, Inherit: k == kindDir, Why: why})
	}
	for _, g := range p.Grants {
		r := aceRead
		if g.Access == policy.Write {
			r = aceModify
		}
		add(g.Path, r, g.Why)
	}
	if scratch != "" {
		add(scratch, aceModify, "scratch")
	}
	for _, m := range p.Masks {
		write, covered := false, false
		for _, g := range p.Grants {
			if g.Own || !winWithin(g.Path, m.Path) {
				continue
			}
			covered = true
			write = write || g.Access == policy.Write
		}
		if !covered {
			continue // no grant reaches it: the container has no access there
		}
		if kind(m.Path) == kindAbsent {
			if write {
				pl.Absent = append(pl.Absent, m.Path)
			}
			continue
		}
		add(m.Path, aceDeny, "nucleus "+m.Why)
	}
	sort.SliceStable(pl.ACEs, func(i, j int) bool { return winKey(pl.ACEs[i].Path) < winKey(pl.ACEs[j].Path) })
	return pl
}

// winKey is a Windows path folded for comparison: lower case, forward
// slashes as backslashes, no trailing separator.
func winKey(p string) string {
	p = strings.ToLower(strings.ReplaceAll(p, "/", `\`))
	if len(p) > 3 {
		p = strings.TrimRight(p, `\`)
	}
	return p
}

// winWithin reports whether the Windows path p is parent or below it,
// by whole components and without regard to case.
func winWithin(parent, p string) bool {
	a, b := winKey(parent), winKey(p)
	if a == b {
		return true
	}
	if !strings.HasSuffix(a, `\`) {
		a += `\`
	}
	return strings.HasPrefix(b, a)
}
