package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Access is what a [Grant] lets the sandboxed command do beneath a path.
type Access uint8

const (
	// Read allows reading files, listing directories and executing files.
	Read Access = iota + 1
	// Write allows everything Read does, plus creating, changing,
	// renaming and removing entries.
	Write
)

// String returns "read" or "write".
func (a Access) String() string {
	switch a {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return fmt.Sprintf("access(%d)", uint8(a))
}

// MarshalText encodes the access as "read" or "write".
func (a Access) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText decodes "read" or "write".
func (a *Access) UnmarshalText(b []byte) error {
	switch string(b) {
	case "read":
		*a = Read
	case "write":
		*a = Write
	default:
		return fmt.Errorf("sandbox: unknown access %q (want read or write)", b)
	}
	return nil
}

// Grant opens one absolute, existing, symlink-free path to the command.
type Grant struct {
	// Path is absolute and canonical (symlinks resolved).
	Path string `json:"path"`
	// Access is Read or Write.
	Access Access `json:"access"`
	// Via is the path as it was named, when it differed from Path
	// (a symlink); the backend recreates it as a link where it can.
	Via string `json:"via,omitempty"`
	// Why says where the grant came from, for humans and logs:
	// "fs:read hint ~/notes/**", "arg /home/u/x", "--write", "system".
	Why string `json:"why,omitempty"`
	// Own marks the agent's own folders for this run (the executor's
	// code, the shim, the interpreter, the executor's user data
	// folder). They may lie inside a masked agent directory: the mask
	// stays, and the grant is opened through it, and only it. Only the
	// agent sets Own; nothing from a manifest or its arguments can.
	Own bool `json:"own,omitempty"`
	// Removable marks a writable directory that an argument named
	// itself: the command may remove it (delete_dirs, the undo of a
	// move). Where it is safe (see the package doc), the run mounts its
	// parent instead of it, so it is not a mount point (which cannot be
	// removed), and lets the parent do nothing but have empty
	// directories removed.
	Removable bool `json:"removable,omitempty"`
}

// MaskKind says how a masked path is hidden.
type MaskKind uint8

const (
	// MaskDir hides a directory behind an empty read-only directory.
	MaskDir MaskKind = iota + 1
	// MaskFile hides a file or socket behind an empty read-only file.
	MaskFile
)

// String returns "dir" or "file".
func (k MaskKind) String() string {
	if k == MaskFile {
		return "file"
	}
	return "dir"
}

// MarshalText encodes the kind as "dir" or "file".
func (k MaskKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText decodes "dir" or "file".
func (k *MaskKind) UnmarshalText(b []byte) error {
	switch string(b) {
	case "dir":
		*k = MaskDir
	case "file":
		*k = MaskFile
	default:
		return fmt.Errorf("sandbox: unknown mask kind %q (want dir or file)", b)
	}
	return nil
}

// Mask is a path of the device nucleus (or a session IPC endpoint) that
// no grant can open. Masks apply whether or not the path exists: an
// absent one must not be creatable either.
type Mask struct {
	// Path is absolute. When the named path is a symlink, Derive adds
	// a second Mask for its target.
	Path string `json:"path"`
	// Kind is what the path is, or would be when absent.
	Kind MaskKind `json:"kind"`
	// Why names the nucleus entry ("~/.ssh", "session-ipc $XDG_RUNTIME_DIR").
	Why string `json:"why,omitempty"`
}

// Profile names the shape of a Policy.
type Profile string

// The profiles. ProfileManifest is what [Derive] builds from an
// executor's manifest; the others are fixed shapes (docs/protocol.md §12)
// to which explicit grants may still be added.
const (
	// ProfileManifest: system paths read-only plus the manifest's and
	// the arguments' grants; network only if a capability asks for it.
	ProfileManifest Profile = "manifest"
	// ProfileReadonly: the whole root readable, nothing writable but a
	// private /tmp; every grant is forced read-only.
	ProfileReadonly Profile = "readonly"
	// ProfileSupervised: the default for the CLI: system paths read-only
	// and only the explicit grants.
	ProfileSupervised Profile = "supervised"
	// ProfileFull: the whole root writable (as far as the user's own
	// permissions go), the network open.
	ProfileFull Profile = "full"
	// ProfileFullFSNoNet: the real root writable, the real /dev, host
	// PIDs visible, the network cut and the session IPC masked (the
	// session bus, X11, terminals, ssh-agent; /tmp is private, as the
	// user's tmux and editor sockets live there); refused rather than
	// weakened when the cut cannot be enforced.
	ProfileFullFSNoNet Profile = "full-fs-no-net"
)

// Profiles returns every profile name in a stable order, in a fresh
// slice.
func Profiles() []Profile {
	return []Profile{ProfileManifest, ProfileReadonly, ProfileSupervised, ProfileFull, ProfileFullFSNoNet}
}

// Level orders sandbox strength for minimums (manifest min_sandbox and
// the agent-wide minimum). Words from the Metnos manifests map onto it:
// "job-object" is LevelContained, "appcontainer" LevelIsolated.
type Level int

const (
	// LevelNone: no requirement.
	LevelNone Level = iota
	// LevelContained: the process tree is killed as a whole and limits
	// hold, but files and network are not confined.
	LevelContained
	// LevelIsolated: files and network are confined by the kernel
	// (Landlock + seccomp, AppContainer, Seatbelt).
	LevelIsolated
	// LevelFull: namespaces, Landlock and seccomp together.
	LevelFull
)

var levelNames = map[string]Level{
	"none": LevelNone, "": LevelNone,
	"contained": LevelContained, "job-object": LevelContained,
	"isolated": LevelIsolated, "appcontainer": LevelIsolated, "landlock+seccomp": LevelIsolated, "seatbelt": LevelIsolated,
	"full": LevelFull, "bwrap+landlock+seccomp": LevelFull,
}

// ParseLevel reads a minimum-sandbox word: none, contained (job-object),
// isolated (appcontainer, landlock+seccomp, seatbelt) or full
// (bwrap+landlock+seccomp).
func ParseLevel(s string) (Level, error) {
	if l, ok := levelNames[strings.ToLower(strings.TrimSpace(s))]; ok {
		return l, nil
	}
	return LevelNone, fmt.Errorf("sandbox: unknown minimum sandbox %q (want none, contained/job-object, isolated/appcontainer or full)", s)
}

// String returns the level's canonical word.
func (l Level) String() string {
	switch l {
	case LevelContained:
		return "contained"
	case LevelIsolated:
		return "isolated"
	case LevelFull:
		return "full"
	}
	return "none"
}

// MarshalText encodes the level's canonical word.
func (l Level) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText decodes any word ParseLevel accepts.
func (l *Level) UnmarshalText(b []byte) error {
	v, err := ParseLevel(string(b))
	*l = v
	return err
}

// Policy is what a sandboxed command may touch. It is plain data: every
// path is absolute and canonical, and backends only translate it.
// Build one with [Derive] or [ForProfile]; the zero Policy allows nothing
// but the system paths.
type Policy struct {
	// Profile is the shape this Policy was built from.
	Profile Profile `json:"profile"`
	// System lists existing system directories mounted read-only
	// (/usr, /bin, /lib, /etc, ...).
	System []string `json:"system,omitempty"`
	// RootReadable makes the whole root readable (readonly profile).
	RootReadable bool `json:"root_readable,omitempty"`
	// RootWritable makes the whole root writable (full profiles).
	RootWritable bool `json:"root_writable,omitempty"`
	// RealDev exposes the host's /dev instead of a minimal one.
	RealDev bool `json:"real_dev,omitempty"`
	// SharePID keeps the host PID namespace (full-fs-no-net).
	SharePID bool `json:"share_pid,omitempty"`
	// HostPIDs: the run shares the host's PID namespace (system:read processes/health): it sees every process, and may read their command lines and status, but never their environment, memory or descriptors, nor signal them.
	HostPIDs bool `json:"host_pids,omitempty"`
	// HostNetView: a run with the network cut (Network false) stays in
	// the host's network namespace to read its interfaces and addresses
	// (system:read network_interfaces), and sends nothing: its sockets
	// are AF_UNIX (when UnixSockets) and AF_NETLINK NETLINK_ROUTE only,
	// and TCP bind/connect are denied. Ignored when Network is true.
	HostNetView bool `json:"host_net_view,omitempty"`
	// ExecPath are the folders of the programs the manifest's code:exec
	// names, found on this device: the caller puts them on the
	// executor's PATH. They are readable in the sandbox (system paths,
	// or grants).
	ExecPath []string `json:"exec_path,omitempty"`
	// Grants open paths beyond System, sorted by path.
	Grants []Grant `json:"grants,omitempty"`
	// Masks hide the nucleus and the session IPC, sorted by path.
	Masks []Mask `json:"masks,omitempty"`
	// Network lets the command use the host network. When false the
	// network is cut by the kernel or the run is refused.
	Network bool `json:"network"`
	// UnixSockets lets the command create AF_UNIX sockets (to reach
	// host services); socketpair(2) is always allowed.
	UnixSockets bool `json:"unix_sockets,omitempty"`
	// MinSandbox is the weakest sandbox this Policy accepts.
	MinSandbox Level `json:"min_sandbox,omitempty"`
	// Notes say, for humans and logs, what Derive read and did not act
	// on: a code:exec hint that is prose, a program this device lacks.
	Notes []string `json:"notes,omitempty"`
	// Egress, when set and Network is false, gives the run the network
	// through the agent's per-run proxy only, to the destinations it
	// lists (network:* capabilities).
	Egress *Egress `json:"egress,omitempty"`
	// NoFallback refuses any run that would not apply the full set of
	// layers the profile is defined with (full-fs-no-net).
	NoFallback bool `json:"no_fallback,omitempty"`
}

// Normalize sorts and de-duplicates the Policy's lists in place so that
// equal policies have equal encodings. A Write and a Read grant of the
// same path fold into Write; a grant of "/" becomes RootReadable or
// RootWritable.
func (p *Policy) Normalize() {
	// A grant of "/" is a root profile: as a bind it would cover the
	// private /proc, /dev and /tmp.
	var kept []Grant
	for _, g := range p.Grants {
		switch {
		case g.Path == "/" && g.Access == Write:
			p.RootWritable = true
		case g.Path == "/":
			p.RootReadable = true
		default:
			kept = append(kept, g)
		}
	}
	p.Grants = kept
	if p.RootWritable {
		p.RootReadable = false
	}
	sort.Strings(p.System)
	p.System = compactStrings(p.System)
	byPath := map[string]int{}
	var gs []Grant
	for _, g := range p.Grants {
		if i, ok := byPath[g.Path]; ok {
			if g.Access > gs[i].Access {
				gs[i].Access = g.Access
				gs[i].Why = g.Why
			}
			if gs[i].Via == "" {
				gs[i].Via = g.Via
			}
			gs[i].Own = gs[i].Own || g.Own
			gs[i].Removable = gs[i].Removable || g.Removable
			continue
		}
		byPath[g.Path] = len(gs)
		gs = append(gs, g)
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].Path < gs[j].Path })
	p.Grants = gs
	seen := map[string]bool{}
	var ms []Mask
	for _, m := range p.Masks {
		if seen[m.Path] {
			continue
		}
		seen[m.Path] = true
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Path < ms[j].Path })
	p.Masks = ms
}

func compactStrings(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i > 0 && v == s[i-1] {
			continue
		}
		out = append(out, v)
	}
	return out
}

// Fingerprint is a stable hash of the Policy's canonical form: the
// JSON encoding of the normalized Policy without the human-only Why
// fields. Results and logs carry it so that two runs can be compared.
// It looks like "pol1:<16 hex>".
func (p Policy) Fingerprint() string {
	q := p
	q.System = append([]string(nil), p.System...)
	q.Grants = append([]Grant(nil), p.Grants...)
	q.Masks = append([]Mask(nil), p.Masks...)
	q.Normalize()
	for i := range q.Grants {
		q.Grants[i].Why = ""
	}
	for i := range q.Masks {
		q.Masks[i].Why = ""
	}
	q.Notes = nil
	b, err := json.Marshal(q)
	if err != nil {
		panic("sandbox: policy does not encode: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return "pol1:" + hex.EncodeToString(sum[:8])
}
