package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Meaning is what a capability means on this device: one of
// MeaningGrant, MeaningNothing and MeaningRefused.
type Meaning string

// The meanings a capability can have on the device.
const (
	// MeaningGrant: the capability derives something the run gets
	// (grants, the network, the host's process list, programs on PATH).
	MeaningGrant Meaning = "grant"
	// MeaningNothing: the capability needs nothing on the device; the
	// run goes ahead without anything added for it.
	MeaningNothing Meaning = "nothing"
	// MeaningRefused: an executor whose capability is in force is not
	// run on a device, for the reason the row gives.
	MeaningRefused Meaning = "refused"
)

// CapabilityRule is one row of the capability table ([CapabilityTable]):
// what one capability, or one of its hints, means on this device.
type CapabilityRule struct {
	// Capability is the name as the manifests spell it ("system:read").
	Capability string `json:"capability"`
	// Hint is the one hint value this row is about; "" when the row is
	// about every hint of the forms Forms describes.
	Hint string `json:"hint,omitempty"`
	// Forms says, for humans, which hint forms the row understands.
	Forms string `json:"forms,omitempty"`
	// Meaning is what the row does.
	Meaning Meaning `json:"meaning"`
	// Detail is the grant derived, why nothing is needed, or the reason
	// of the refusal.
	Detail string `json:"detail"`
}

// ErrCapabilityRefused is wrapped by every refusal [Derive] makes
// because of a capability: one the table refuses on a device, and one
// (or a hint, or a when clause) the table does not know.
var ErrCapabilityRefused = errors.New("capability refused on this device")

// CapabilityError is a refusal because of one capability of the
// manifest. Its message names the capability, its hints and the reason;
// the caller adds the executor's name.
type CapabilityError struct {
	// Capability is the capability's name.
	Capability string
	// Hints are the capability's hints, as declared.
	Hints []string
	// Hint is the hint the refusal is about, if it is about one.
	Hint string
	// Reason says why, in words the user can act on.
	Reason string
}

// Error returns "capability NAME hint [..]: refused on this device: REASON".
func (e *CapabilityError) Error() string {
	var hs []string
	for _, h := range e.Hints {
		hs = append(hs, strconv.Quote(h))
	}
	s := "capability " + e.Capability + " hint [" + strings.Join(hs, ",") + "]"
	if e.Hint != "" {
		s += " (hint " + strconv.Quote(e.Hint) + ")"
	}
	return s + ": refused on this device: " + e.Reason
}

// Unwrap returns [ErrCapabilityRefused].
func (e *CapabilityError) Unwrap() error { return ErrCapabilityRefused }

// rule is a row of the table with what it does.
type rule struct {
	CapabilityRule
	// accept reports whether a hint is of the row's forms (rows with
	// Hint ""); nil accepts every hint.
	accept func(hint string) bool
	// apply derives the row's grant for one hint ("" when the
	// capability has none); only for MeaningGrant rows.
	apply func(d *derivation, c capability, hint string)
	// here says what the row finds on a given device, for
	// [CapabilityTable]; nil when that does not vary.
	here func(h Host) string
}

// derivation is what Derive builds while it reads the capabilities.
type derivation struct {
	h      Host
	home   string
	masks  []Mask
	p      *Policy
	grants []Grant
	// hasFS and maxAccess: an fs capability is in force, and the
	// strongest access among them (argument paths are granted at it).
	hasFS     bool
	maxAccess Access
}

// fsHint reports whether an fs hint is of a form the table knows: an
// anchored glob ("/…", "~", "~/…"), "$HOME/…", a relative glob or
// "arg:NAME" (both stand for the arguments' paths, granted anyway).
// Other "$VAR/…" forms are not known: their path cannot be told.
func fsHint(h string) bool {
	h = strings.TrimSpace(h)
	if h == "" {
		return false
	}
	if strings.HasPrefix(h, "$") {
		return h == "$HOME" || strings.HasPrefix(h, "$HOME/")
	}
	if filepath.Separator == '/' && isWindowsAnchored(h) {
		return false
	}
	return true
}

// applyFS grants a hint's root at the capability's access.
func applyFS(access Access) func(d *derivation, c capability, hint string) {
	return func(d *derivation, c capability, hint string) {
		d.hasFS = true
		if access > d.maxAccess {
			d.maxAccess = access
		}
		if hint == "" {
			return
		}
		h := hint
		if h == "$HOME" || strings.HasPrefix(h, "$HOME/") {
			h = "~" + strings.TrimPrefix(h, "$HOME")
		}
		root, ok := hintRoot(h)
		if !ok {
			return
		}
		named := filepath.Clean(expandTilde(root, d.home))
		if g, ok := derivedGrant(named, access, c.Name+" hint "+hint, d.masks); ok {
			d.grants = append(d.grants, g)
		}
	}
}

// applyNetwork narrows the run's network to what each hint names
// ([ParseHint]); a hint that names no destination is kept in
// Egress.Ignored and allows nothing.
func applyNetwork(d *derivation, c capability, hint string) {
	if d.p.Egress == nil {
		d.p.Egress = &Egress{}
	}
	if hint != "" {
		d.p.Egress.AddHint(c.Name, hint)
	}
}

// finishEgress adds the owner's lists and the default deny list to a
// narrowed network, e.
func finishEgress(e *Egress, h Host) {
	e.Allow = append(e.Allow, h.NetAllow...)
	e.Deny = append(append(e.Deny, DefaultDeny()...), h.NetDeny...)
}

// defaultPackageDBs are the package databases system:read
// installed_software / package_database grants read-only, those that
// exist: dpkg's, apt's state (its lists and settings, for
// `apt-get download --print-uris` and `apt-cache`), rpm's and pacman's.
var defaultPackageDBs = []string{
	"/var/lib/dpkg", "/var/lib/apt", "/var/cache/apt", "/etc/apt",
	"/var/lib/rpm", "/usr/lib/sysimage/rpm", "/var/lib/pacman",
}

func applyPackageDBs(d *derivation, c capability, hint string) {
	dbs := d.h.PackageDBs
	if len(dbs) == 0 {
		dbs = defaultPackageDBs
	}
	for _, db := range dbs {
		if underAny(db, d.p.System) {
			continue // /etc/apt, /usr/lib/sysimage/rpm: readable already
		}
		if g, ok := derivedGrant(filepath.Clean(db), Read, c.Name+" hint "+hint, d.masks); ok {
			d.grants = append(d.grants, g)
		}
	}
}

func applyHostPIDs(d *derivation, _ capability, _ string) { d.p.HostPIDs = true }

// applyHostNetView gives the run the host's network interfaces to read
// (system:read network_interfaces): Policy.HostNetView.
func applyHostNetView(d *derivation, _ capability, _ string) { d.p.HostNetView = true }

// defaultProgramDirs are where code:exec programs are looked up when
// Host.ProgramDirs is empty: the usual system PATH, wider than the
// executor's own /usr/bin:/bin (ip lives in /usr/sbin).
var defaultProgramDirs = map[string][]string{
	"linux":   {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"},
	"darwin":  {"/opt/homebrew/bin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"},
	"freebsd": {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"},
}

// programName matches a code:exec hint that names a program; anything
// else ("WMI/CIM", "subprocess Python google_api.py contacts list") is
// prose.
var programName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`) })

// applyProgram finds the program a code:exec hint names in the
// system's program folders, puts its folder on the executor's PATH and
// makes it readable (and so runnable) in the sandbox. A hint that is
// prose, or a program this device does not have, adds nothing and is
// noted: the executor finds out for itself (find_packages tries
// dpkg-query, rpm and pacman in turn).
func applyProgram(d *derivation, c capability, hint string) {
	if hint == "" {
		return
	}
	if !programName().MatchString(hint) {
		d.p.Notes = append(d.p.Notes, fmt.Sprintf("%s hint %q is not a program name: ignored, nothing added for it", c.Name, hint))
		return
	}
	dirs := d.h.ProgramDirs
	if len(dirs) == 0 {
		dirs = defaultProgramDirs[runtime.GOOS]
	}
	for _, dir := range dirs {
		for _, name := range programFiles(hint) {
			file := filepath.Join(dir, name)
			fi, err := os.Stat(file)
			if err != nil || !fi.Mode().IsRegular() || (runtime.GOOS != "windows" && fi.Mode()&0o111 == 0) {
				continue
			}
			if !slices.Contains(d.p.ExecPath, dir) {
				d.p.ExecPath = append(d.p.ExecPath, dir)
			}
			// The program (through its links) must be readable in the
			// sandbox; what the system paths hold already is.
			if real, err := filepath.EvalSymlinks(file); err == nil && !underAny(real, d.p.System) {
				if g, ok := derivedGrant(filepath.Dir(real), Read, c.Name+" hint "+hint, d.masks); ok {
					d.grants = append(d.grants, g)
				}
			}
			if !underAny(dir, d.p.System) {
				if g, ok := derivedGrant(filepath.Clean(dir), Read, c.Name+" hint "+hint, d.masks); ok {
					d.grants = append(d.grants, g)
				}
			}
			return
		}
	}
	d.p.Notes = append(d.p.Notes, fmt.Sprintf("%s hint %q: no such program on this device (looked in %s); the executor finds out for itself", c.Name, hint, strings.Join(dirs, string(os.PathListSeparator))))
}

// programFiles are the file names a program may have on this system.
func programFiles(name string) []string {
	if runtime.GOOS != "windows" {
		return []string{name}
	}
	if filepath.Ext(name) != "" {
		return []string{name}
	}
	return []string{name + ".exe", name + ".com", name + ".cmd", name + ".bat"}
}

// underAny reports whether p lies at or beneath one of dirs.
func underAny(p string, dirs []string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return pathWithin(p, d) })
}

// The reasons the table gives for its refusals.
const (
	whyProvider    = "the run would need the server's provider credentials (Google Workspace, GitHub...), which never leave the server: run it on the server"
	whyAdmin       = "this device does not give administrative rights to executors"
	whyServerData  = "the run would need data only the Metnos server holds: run it on the server"
	whyDialog      = "a run on a device cannot ask the user anything while it runs"
	whyMail        = "mail accounts and their passwords are the server's: run it on the server"
	whyLLM         = "this device gives executors no language model"
	whyCredentials = "Metnos credentials stay on the server"
)

// rules is the capability table: every capability of the Metnos
// vocabulary, and for system:read each hint, with its meaning here.
var rules = []rule{
	{CapabilityRule: CapabilityRule{Capability: "fs:read", Forms: `anchored globs ("/…", "~/…"), "$HOME/…", relative globs and "arg:NAME" (the arguments' paths)`, Meaning: MeaningGrant,
		Detail: "each hint's root (cut before its first glob segment) read-only, and each anchored path in the arguments its deepest existing folder; missing paths are skipped, the nucleus is never opened"},
		accept: fsHint, apply: applyFS(Read)},
	{CapabilityRule: CapabilityRule{Capability: "fs:write", Forms: `as fs:read`, Meaning: MeaningGrant,
		Detail: "as fs:read, writable (system paths and shared roots stay read-only)"},
		accept: fsHint, apply: applyFS(Write)},
	{CapabilityRule: CapabilityRule{Capability: "network:http", Forms: `destinations: a host ("api.github.com"), host:port ("127.0.0.1:8080"), "*.domain", "*", "http://*", "https://*", URLs (scheme and path dropped); prose ("Google People API HTTPS") names none and is ignored and noted`, Meaning: MeaningGrant,
		Detail: "the network through the run's egress proxy only, to the destinations named (and the owner's [network] allow, limits.toml or METNOS_NET_ALLOW): a wildcard reaches public addresses only, a loopback, private, link-local or tailnet address only when a hint names it literally (127.0.0.1, localhost); mail and IRC ports and personal cloud storage are denied whatever is named (and the owner's [network] deny)"}, apply: applyNetwork},
	{CapabilityRule: CapabilityRule{Capability: "network:sites", Forms: "as network:http", Meaning: MeaningGrant,
		Detail: "as network:http"}, apply: applyNetwork},
	{CapabilityRule: CapabilityRule{Capability: "code:exec", Forms: `program names ("ps", "dpkg-query"); prose ("WMI/CIM", "subprocess Python google_api.py …") is ignored and noted`, Meaning: MeaningGrant,
		Detail: "each program found in the system's program folders: its folder on the executor's PATH, readable and runnable in the sandbox; a program this device lacks adds nothing (the executor finds out)"},
		apply: applyProgram, here: programDirsHere},
	{CapabilityRule: CapabilityRule{Capability: "system:read", Hint: "installed_software", Meaning: MeaningGrant,
		Detail: "the package databases that exist read-only: /var/lib/dpkg, apt's state (/var/lib/apt, /var/cache/apt, /etc/apt), /var/lib/rpm, /usr/lib/sysimage/rpm, /var/lib/pacman"},
		apply: applyPackageDBs, here: packageDBsHere},
	{CapabilityRule: CapabilityRule{Capability: "system:read", Hint: "package_database", Meaning: MeaningGrant,
		Detail: "as installed_software"}, apply: applyPackageDBs, here: packageDBsHere},
	{CapabilityRule: CapabilityRule{Capability: "system:read", Hint: "processes", Meaning: MeaningGrant,
		Detail: "the host's process list: the run shares the host's PID namespace; it sees every process's command line and status, never their environment, memory or descriptors, and cannot signal them (refused where the kernel cannot keep that)"},
		apply: applyHostPIDs},
	{CapabilityRule: CapabilityRule{Capability: "system:read", Hint: "health", Meaning: MeaningGrant,
		Detail: "as processes (load, memory, uptime and mounts come from the host's /proc); /sys is not shown, so sensors, GPUs, USB and block devices come back empty"},
		apply: applyHostPIDs},
	{CapabilityRule: CapabilityRule{Capability: "system:read", Hint: "network_interfaces", Meaning: MeaningGrant,
		Detail: "the run shares the host's network namespace read-only: it lists interfaces, addresses and routes through route netlink, can open no internet or packet socket and so sends no traffic; an executor that reads interfaces through a UDP socket gets a permission error (refused where the kernel cannot keep that)"},
		apply: applyHostNetView},
	{CapabilityRule: CapabilityRule{Capability: "system:read", Hint: "service_status", Meaning: MeaningNothing,
		Detail: "no system bus in the sandbox (it is an IPC the session masks close; as root it would also start and stop units): systemctl answers nothing and unit states come back unknown"}},
	{CapabilityRule: CapabilityRule{Capability: "system:admin", Forms: "any", Meaning: MeaningRefused, Detail: whyAdmin}},
	{CapabilityRule: CapabilityRule{Capability: "system:undo", Forms: "any", Meaning: MeaningRefused, Detail: "undoing a whole turn is the server's; the device undoes its own runs (metnos-agent history)"}},
	{CapabilityRule: CapabilityRule{Capability: "compute:pure", Forms: "any", Meaning: MeaningNothing, Detail: "pure computation on the arguments"}},
	{CapabilityRule: CapabilityRule{Capability: "time:read", Forms: "any", Meaning: MeaningNothing, Detail: "the clock is readable in every sandbox"}},
	{CapabilityRule: CapabilityRule{Capability: "metnos:cache", Forms: `"NAME:local"`, Meaning: MeaningNothing,
		Detail: "the executor's own cache lives in its user data folder (METNOS_USER_DATA), which every run gets"},
		accept: localResource},
	{CapabilityRule: CapabilityRule{Capability: "metnos:cache", Forms: `"NAME:remote"`, Meaning: MeaningRefused, Detail: whyServerData}, accept: remoteResource},
	{CapabilityRule: CapabilityRule{Capability: "metnos:read", Forms: "any", Meaning: MeaningRefused, Detail: whyServerData}},
	{CapabilityRule: CapabilityRule{Capability: "metnos:write", Forms: "any", Meaning: MeaningRefused, Detail: whyServerData}},
	{CapabilityRule: CapabilityRule{Capability: "metnos:create", Forms: `"NAME:local"`, Meaning: MeaningNothing,
		Detail: "what it creates locally goes where the arguments say, which fs capabilities grant"},
		accept: localResource},
	{CapabilityRule: CapabilityRule{Capability: "metnos:create", Forms: `"NAME:remote"`, Meaning: MeaningRefused, Detail: whyServerData}, accept: remoteResource},
	{CapabilityRule: CapabilityRule{Capability: "metnos:credentials_metadata_only", Forms: "any", Meaning: MeaningRefused, Detail: whyCredentials}},
	{CapabilityRule: CapabilityRule{Capability: "provider:access", Forms: "any", Meaning: MeaningRefused, Detail: whyProvider}},
	{CapabilityRule: CapabilityRule{Capability: "drive:permissions", Forms: "any", Meaning: MeaningRefused, Detail: whyProvider}},
	{CapabilityRule: CapabilityRule{Capability: "auth.password_storage", Forms: "any", Meaning: MeaningRefused, Detail: whyCredentials}},
	{CapabilityRule: CapabilityRule{Capability: "channel:out", Forms: "any", Meaning: MeaningRefused, Detail: "the user's message channels (their bot tokens) are the server's: run it on the server"}},
	{CapabilityRule: CapabilityRule{Capability: "dialog.user_input", Forms: "any", Meaning: MeaningRefused, Detail: whyDialog}},
	{CapabilityRule: CapabilityRule{Capability: "index:read", Forms: "any", Meaning: MeaningRefused, Detail: "the Metnos indices (images, persons) are the server's: run it on the server"}},
	{CapabilityRule: CapabilityRule{Capability: "llm:local", Forms: "any", Meaning: MeaningRefused, Detail: whyLLM}},
	{CapabilityRule: CapabilityRule{Capability: "llm:online", Forms: "any", Meaning: MeaningRefused, Detail: whyLLM}},
	{CapabilityRule: CapabilityRule{Capability: "mail:read", Forms: "any", Meaning: MeaningRefused, Detail: whyMail}},
	{CapabilityRule: CapabilityRule{Capability: "mail:write", Forms: "any", Meaning: MeaningRefused, Detail: whyMail}},
	{CapabilityRule: CapabilityRule{Capability: "mail:send", Forms: "any", Meaning: MeaningRefused, Detail: whyMail}},
}

// localResource accepts a metnos resource hint that names something of
// the device ("file_hash_cache:local", "spreadsheet:local"); a
// ":remote" one would need the server.
func localResource(h string) bool { return strings.HasSuffix(h, ":local") }

// remoteResource accepts a metnos resource hint that names something of
// the server ("doc:remote").
func remoteResource(h string) bool { return strings.HasSuffix(h, ":remote") }

// CapabilityTable returns the capability table: every capability of
// the Metnos vocabulary this agent knows, and for system:read each
// hint, with what it means on the device h describes (which package
// databases it has, where it looks programs up). A capability, a hint
// or a when clause it does not know is refused by [Derive].
func CapabilityTable(h Host) []CapabilityRule {
	out := make([]CapabilityRule, len(rules))
	for i, r := range rules {
		out[i] = r.CapabilityRule
		if r.here != nil {
			out[i].Detail += "; on this device: " + r.here(h)
		}
	}
	return out
}

// packageDBsHere lists the package databases h has.
func packageDBsHere(h Host) string {
	dbs := h.PackageDBs
	if len(dbs) == 0 {
		dbs = defaultPackageDBs
	}
	var have []string
	for _, db := range dbs {
		if _, err := os.Stat(db); err == nil {
			have = append(have, db)
		}
	}
	if len(have) == 0 {
		return "none of them exists"
	}
	return strings.Join(have, ", ")
}

// programDirsHere lists where h looks programs up.
func programDirsHere(h Host) string {
	dirs := h.ProgramDirs
	if len(dirs) == 0 {
		dirs = defaultProgramDirs[runtime.GOOS]
	}
	if len(dirs) == 0 {
		return "no program folder is known (on Windows they come from PATH)"
	}
	return "programs are looked up in " + strings.Join(dirs, string(os.PathListSeparator))
}

// lookup finds the row for one hint of a capability ("" for a
// capability without hints). known reports whether the table has the
// capability at all.
func lookup(name, hint string) (r rule, found, known bool) {
	for _, r := range rules {
		if r.Capability != name {
			continue
		}
		known = true
		if r.Hint != "" {
			if r.Hint == hint {
				return r, true, true
			}
			continue
		}
		if hint == "" || r.accept == nil || r.accept(hint) {
			return r, true, true
		}
	}
	return rule{}, false, known
}

// apply reads one capability in force: its grants, or its refusal.
func (d *derivation) apply(c capability) error {
	if c.whenErr != nil {
		return &CapabilityError{Capability: c.Name, Hints: c.Hints, Reason: c.whenErr.Error() + "; this agent does not guess what a clause it cannot read means"}
	}
	hints := c.Hints
	if len(hints) == 0 {
		hints = []string{""}
	}
	type todo struct {
		r    rule
		hint string
	}
	var do []todo
	for _, h := range hints {
		r, ok, known := lookup(c.Name, h)
		switch {
		case !known:
			return &CapabilityError{Capability: c.Name, Hints: c.Hints,
				Reason: "this agent does not know the capability, so it cannot tell what the run needs; refused rather than ignored (`metnos-agent doctor --capabilities` lists those it knows)"}
		case !ok && h == "":
			return &CapabilityError{Capability: c.Name, Hints: c.Hints,
				Reason: "it declares no hint, and this agent cannot tell what it asks for without one (`metnos-agent doctor --capabilities` lists the hints it knows)"}
		case !ok:
			return &CapabilityError{Capability: c.Name, Hints: c.Hints, Hint: h,
				Reason: "this agent does not know the hint, so it cannot tell what the run needs; refused rather than ignored (`metnos-agent doctor --capabilities` lists the hints it knows)"}
		case r.Meaning == MeaningRefused:
			return &CapabilityError{Capability: c.Name, Hints: c.Hints, Hint: r.Hint, Reason: r.Detail}
		}
		do = append(do, todo{r, h})
	}
	for _, t := range do {
		if t.r.apply != nil {
			t.r.apply(d, c, t.hint)
		}
	}
	return nil
}
