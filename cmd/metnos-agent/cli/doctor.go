package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/user"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/metnos/agent/agent"
	"github.com/metnos/agent/fetch"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

const doctorHelp = `
Doctor reports what this machine offers the sandbox (bubblewrap and its
user namespaces, Landlock, seccomp, cgroups) and, for each profile, the
sandbox a command would run in and why it is not stronger. It runs
bubblewrap once to probe its namespaces and changes nothing.

Profiles are built as "metnos-agent exec --profile NAME" would build them
with no --read or --write; only full has the network.

With --json it prints one JSON object: {"caps": ..., "profiles": {...}}.

With --capabilities it prints instead the capability table: what each
capability an executor's manifest may declare (and, for system:read,
each hint) means on this device: what it grants, that it needs nothing,
or why an executor declaring it is refused here. A capability or hint
not in the table is refused too. With --json, the table as a JSON list.
`

// doctorProfiles are the profiles doctor reports, the CLI's default
// first.
var doctorProfiles = []policy.Profile{
	policy.ProfileSupervised,
	policy.ProfileReadonly,
	policy.ProfileFull,
	policy.ProfileFullFSNoNet,
}

// landlockFeatures says what each Landlock ABI added, by ABI.
var landlockFeatures = map[int]string{
	2: "cross-directory rename and link (refer)",
	3: "truncate control",
	4: "TCP bind/connect rules",
	5: "device ioctl control",
	6: "abstract-socket and signal scoping",
	7: "audit logging control",
}

// doctorReport is what doctor --json prints.
type doctorReport struct {
	// Priority is the executors' priority in force and what this
	// machine gives of it.
	Priority priorityReport `json:"priority"`

	Version  string                   `json:"version"`
	Caps     sandbox.Caps             `json:"caps"`
	UID      int                      `json:"uid"`
	User     string                   `json:"user,omitempty"`
	Userns   usernsReport             `json:"userns"`
	Landlock landlockReport           `json:"landlock"`
	Profiles map[string]profileReport `json:"profiles"`
	Python   pythonReport             `json:"python"`
	Limits   limitsDoctor             `json:"limits"`
}

// limitsDoctor is the owner's limits file as doctor reports it.
type limitsDoctor struct {
	// File is the limits file ("" without a configuration folder).
	File string `json:"file"`
	// Present says it exists; InForce that its limits are in force (a
	// missing file's defaults are); Error why it is refused.
	Present bool   `json:"present"`
	InForce bool   `json:"in_force"`
	Error   string `json:"error,omitempty"`
	// Mode is the mode in force, Never how many never entries there are.
	Mode  string `json:"mode,omitempty"`
	Never int    `json:"never"`
}

// limitsLine is doctor's line for the owner's limits file.
func limitsLine(l limitsDoctor) string {
	switch {
	case l.File == "":
		return "none: no configuration folder (the home folder is not known); the defaults are in force"
	case l.Error != "":
		return l.File + ": REFUSED, not in force (run refuses to start): " + l.Error
	case !l.Present:
		return l.File + ": none, the defaults are in force"
	}
	return fmt.Sprintf("%s (in force: mode %s, %d never)", l.File, l.Mode, l.Never)
}

// pythonReport is the interpreter executors would run with.
type pythonReport struct {
	agent.Python
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
}

type usernsReport struct {
	// Probe is "ok" when bwrap created its namespaces, else why not.
	Probe string `json:"probe"`
	// MaxUserNamespaces is /proc/sys/user/max_user_namespaces.
	MaxUserNamespaces string `json:"max_user_namespaces,omitempty"`
	// AppArmorRestrict is
	// /proc/sys/kernel/apparmor_restrict_unprivileged_userns, if present.
	AppArmorRestrict string `json:"apparmor_restrict_unprivileged_userns,omitempty"`
}

type landlockReport struct {
	ABI    int `json:"abi"`
	Pinned int `json:"pinned"`
	// Missing lists what the kernel lacks below the pinned ABI, as
	// "<N feature".
	Missing []string `json:"missing,omitempty"`
}

// priorityReport is the priority runs get (the owner's, or the default)
// and what of it this machine applies.
type priorityReport struct {
	InForce string `json:"in_force"`
	sandbox.PriorityCaps
}

type profileReport struct {
	Sandbox string `json:"sandbox"`
	Best    string `json:"best"`
	Reason  string `json:"reason"`
	Refused string `json:"refused"`
	Network string `json:"network,omitempty"`
	Policy  string `json:"policy"`
	Error   string `json:"error,omitempty"`
}

func runDoctor(std stdio, args []string) int {
	fs := newFlagSet("doctor", std, doctorHelp)
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	caps := fs.Bool("capabilities", false, "print what each manifest capability means on this device")
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "doctor", "doctor takes no arguments")
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	if *caps {
		return printCapabilities(std, e, *asJSON)
	}
	// Access entries a Windows run cut short left for the AppContainer:
	// doctor, like run and uninstall, removes them (said on stderr).
	if n, err := sandbox.RecoverGrants(sandboxOptions(e), warnLogger(std)); err != nil {
		fmt.Fprintf(std.err, "metnos-agent: the access entries runs cut short left could not all be removed: %v\n", err)
	} else if n > 0 {
		fmt.Fprintf(std.err, "metnos-agent: removed the access entries %d run(s) cut short had left\n", n)
	}
	r := doctor(e)
	if *asJSON {
		enc := json.NewEncoder(std.out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(std.err, "metnos-agent: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	printDoctor(std.out, r, e.lay)
	fmt.Fprintln(std.out)
	printTailnet(std.out, e.lay)
	return exitOK
}

// printCapabilities prints the capability table for this device.
func printCapabilities(std stdio, e environment, asJSON bool) int {
	host, err := deviceHost(e, os.Getuid())
	if err != nil {
		return fail(std, err)
	}
	table := policy.CapabilityTable(host)
	if asJSON {
		enc := json.NewEncoder(std.out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(table); err != nil {
			fmt.Fprintf(std.err, "metnos-agent: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	fmt.Fprintf(std.out, "Capabilities on this device (%s/%s); any other capability or hint is refused:\n\n", runtime.GOOS, runtime.GOARCH)
	tw := tabwriter.NewWriter(std.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CAPABILITY\tHINT\tMEANING\tWHAT IT MEANS HERE")
	for _, r := range table {
		hint := r.Hint
		if hint == "" {
			hint = r.Forms
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Capability, hint, r.Meaning, r.Detail)
	}
	tw.Flush()
	return exitOK
}

// doctor probes the machine and plans every profile in e.
func doctor(e environment) doctorReport {
	opts := sandboxOptions(e)
	c := sandbox.Probe(opts)
	r := doctorReport{
		Version:  version(),
		Caps:     c,
		Priority: priorityReport{InForce: opts.Priority.String(), PriorityCaps: sandbox.ProbePriority(opts)},
		UID:      os.Getuid(),
		Profiles: map[string]profileReport{},
		Landlock: landlockReport{ABI: c.LandlockABI, Pinned: c.LandlockPinned},
	}
	if u, err := user.LookupId(strconv.Itoa(r.UID)); err == nil {
		r.User = u.Username
	}
	r.Limits = limitsDoctor{File: e.lay.Limits(), Present: e.lim.Present, InForce: e.limErr == nil}
	if e.limErr != nil {
		r.Limits.Error = e.limErr.Error()
		_, err := os.Stat(r.Limits.File)
		r.Limits.Present = err == nil
	} else {
		r.Limits.Mode, r.Limits.Never = string(e.lim.InForce()), len(e.lim.Never)
	}
	switch {
	case c.BwrapUsable:
		r.Userns.Probe = "ok"
	case c.Bwrap == "":
		r.Userns.Probe = "not probed: no bwrap"
	default:
		r.Userns.Probe = c.BwrapError
	}
	r.Userns.MaxUserNamespaces = readSysctl("/proc/sys/user/max_user_namespaces")
	r.Userns.AppArmorRestrict = readSysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
	if c.LandlockABI > 0 {
		for abi := c.LandlockABI + 1; abi <= c.LandlockPinned; abi++ {
			if f, ok := landlockFeatures[abi]; ok {
				r.Landlock.Missing = append(r.Landlock.Missing, fmt.Sprintf("<%d %s", abi, f))
			}
		}
	}

	if py, err := findPython(e); err != nil {
		r.Python.Python = py // what was skipped, and why
		r.Python.Error = err.Error()
	} else {
		r.Python.Python = py
		if r.Python.Version, err = py.Version(); err != nil {
			r.Python.Error = err.Error()
		}
	}

	host, herr := deviceHost(e, r.UID)
	for _, prof := range doctorRows() {
		var pr profileReport
		if herr != nil {
			pr.Error = herr.Error()
			r.Profiles[prof] = pr
			continue
		}
		pol, err := policy.ForProfile(doctorInput(prof, host))
		if err != nil {
			pr.Error = err.Error()
			r.Profiles[prof] = pr
			continue
		}
		pl := sandbox.PlanFor(opts, pol, policy.LevelNone)
		pr = profileReport{
			Sandbox: pl.Sandbox,
			Best:    pl.Best,
			Reason:  pl.Reason,
			Refused: pl.Refused,
			Network: pl.Network,
			Policy:  pol.Fingerprint(),
		}
		r.Profiles[prof] = pr
	}
	return r
}

// allowNetRow is the row doctor reports for a run whose network is
// narrowed to named hosts: exec's supervised profile with --allow-net,
// as an executor with a network capability runs.
const allowNetRow = "supervised --allow-net"

// doctorRows are the rows of doctor's profile tables, in order.
func doctorRows() []string {
	var rows []string
	for _, p := range doctorProfiles {
		rows = append(rows, string(p))
	}
	return append(rows, allowNetRow)
}

// doctorInput is the policy input of a row doctor reports: as exec
// builds it with no --read or --write; only full has the network, and
// allowNetRow the network narrowed to a host.
func doctorInput(row string, host policy.Host) policy.ProfileInput {
	if row == allowNetRow {
		return policy.ProfileInput{Profile: policy.ProfileSupervised, AllowNet: []policy.Dest{{Host: "example.org", Why: "doctor"}}, Host: host}
	}
	prof := policy.Profile(row)
	return policy.ProfileInput{Profile: prof, Network: prof == policy.ProfileFull, Host: host}
}

// readSysctl returns the trimmed contents of a /proc/sys file, or ""
// when it cannot be read.
func readSysctl(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// printDoctor writes the report as two aligned tables: the machine,
// then the profiles.
// windowsRows prints the rungs of the Windows sandbox this machine
// gives, and why not the others.
func windowsRows(row func(k, v string), c sandbox.Caps) {
	rung := func(ok bool, note string) string {
		if ok {
			return "yes"
		}
		return "no: " + note
	}
	row("appcontainer", rung(c.AppContainer, c.AppContainerNote))
	row("low-integrity", rung(c.LowIntegrity, c.LowIntegrityNote))
	row("job-object", yesNo(c.Disabled == ""))
}

// linuxRows prints the layers of the Linux sandbox this machine gives.
func linuxRows(row func(k, v string), r doctorReport) {
	c := r.Caps
	switch {
	case c.Bwrap == "":
		row("bwrap", "missing: "+c.BwrapError)
	default:
		v := c.Bwrap
		if c.BwrapVersion != "" {
			v += " (" + c.BwrapVersion + ")"
		}
		if c.BwrapUsable {
			v += ", usable"
		} else {
			v += ", not usable"
		}
		row("bwrap", v)
	}
	var ns []string
	if r.Userns.Probe == "ok" {
		ns = append(ns, "ok (bwrap created its namespaces)")
	} else {
		ns = append(ns, r.Userns.Probe)
	}
	if r.Userns.MaxUserNamespaces != "" {
		ns = append(ns, "user.max_user_namespaces="+r.Userns.MaxUserNamespaces)
	}
	if r.Userns.AppArmorRestrict != "" {
		ns = append(ns, "kernel.apparmor_restrict_unprivileged_userns="+r.Userns.AppArmorRestrict)
	}
	row("userns", strings.Join(ns, "; "))
	row("landlock", landlockLine(r.Landlock))
	row("seccomp", yesNo(c.Seccomp))
	cg := c.Cgroup
	if cg == "" {
		cg = "none"
	}
	if c.CgroupNote != "" {
		cg += ": " + c.CgroupNote
	}
	row("cgroup", cg)
}

func printDoctor(w io.Writer, r doctorReport, lay layout.Layout) {
	c := r.Caps
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }

	row("agent", fmt.Sprintf("metnos-agent %s %s/%s", r.Version, runtime.GOOS, runtime.GOARCH))
	if lay.Data != "" {
		row("data", lay.Data)
	}
	row("limits", term.SanitizeLines(limitsLine(r.Limits)))
	switch py := r.Python; {
	case py.Path == "":
		row("python", "none: "+py.Error)
	default:
		v := fmt.Sprintf("%s %s (%s)", py.Path, py.Version, py.Source)
		if py.Note != "" {
			v += "; " + py.Note
		}
		if py.Error != "" {
			v += "; does not run: " + py.Error
		}
		row("python", v)
	}
	// An interpreter passed over is a warning: it is often the one the
	// user expected (first on PATH), and executors would fail with it.
	for _, s := range r.Python.Skipped {
		row("warning", "python skipped, the sandbox could not run it: "+s)
	}
	for _, d := range fetch.Downloading(lay) {
		row("download", fmt.Sprintf("%s: %d of %d bytes (resumes on the next runtime install)", d.URL, d.Done, d.Total))
	}
	if c.Disabled != "" {
		row("disabled", c.Disabled)
	}
	if c.OS == "windows" {
		windowsRows(row, c)
	} else {
		linuxRows(row, r)
	}
	priorityRows(row, r.Priority)
	uid := strconv.Itoa(r.UID)
	if r.User != "" {
		uid += " (" + r.User + ")"
	}
	row("uid", uid)
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "PROFILE\tSANDBOX\tPOLICY\tNOTE\n")
	for _, prof := range doctorRows() {
		pr := r.Profiles[prof]
		switch {
		case pr.Error != "":
			fmt.Fprintf(tw, "%s\t-\t-\terror: %s\n", prof, pr.Error)
		case pr.Refused != "":
			fmt.Fprintf(tw, "%s\trefused\t%s\t%s\n", prof, pr.Policy, pr.Refused)
		default:
			note := pr.Reason
			if note == "" {
				note = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", prof, pr.Sandbox, pr.Policy, note)
		}
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "PROFILE\tNETWORK\n")
	for _, prof := range doctorRows() {
		if pr := r.Profiles[prof]; pr.Network != "" {
			fmt.Fprintf(tw, "%s\t%s\n", prof, pr.Network)
		}
	}
	tw.Flush()
}

// priorityRows prints the executors' priority and what this machine
// gives of it, one mechanism a row.
func priorityRows(row func(k, v string), p priorityReport) {
	if p.InForce == "" {
		return
	}
	row("priority", p.InForce)
	for _, r := range []struct{ k, v string }{
		{"  nice", p.Nice},
		{"  io class", p.IOClass},
		{"  autogroup", p.Autogroup},
		{"  cgroup cpu", p.CgroupCPU},
		{"  cgroup io", p.CgroupIO},
		{"  cpu time", p.CPUTime},
	} {
		if r.v != "" {
			row(r.k, r.v)
		}
	}
}

func landlockLine(l landlockReport) string {
	switch {
	case l.ABI == 0 && l.Pinned == 0:
		return "none"
	case l.ABI == 0:
		return fmt.Sprintf("none (pinned ABI %d): the kernel has no Landlock", l.Pinned)
	case l.ABI < l.Pinned:
		return fmt.Sprintf("ABI %d, pinned %d; missing %s", l.ABI, l.Pinned, strings.Join(l.Missing, ", "))
	case l.ABI > l.Pinned:
		return fmt.Sprintf("ABI %d, pinned %d (newer features unused)", l.ABI, l.Pinned)
	}
	return fmt.Sprintf("ABI %d, pinned %d", l.ABI, l.Pinned)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
