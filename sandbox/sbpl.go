package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/text/unicode/norm"

	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/policy"
)

// This file generates the Seatbelt (SBPL) profile that the macOS backend
// hands to sandbox-exec. It has no build tag so that the profile is
// golden-tested on every system (testdata/sbpl).
//
// Every path reaches the profile as a parameter: the text says
// (subpath (param "GRANT_0")) and sandbox-exec gets -D GRANT_0=/the/path.
// No path, whatever bytes it holds (quotes, parentheses, newlines,
// ")(allow default)"), is ever part of the profile text, so none can
// change its meaning. The profile text depends only on the shape of the
// Policy (which lists exist, how long they are, which flags are set).
//
// What the base rules allow was learned from two peers' profiles:
// openai/codex codex-rs/sandboxing/src/seatbelt_base_policy.sbpl
// (deny default; process-fork and process-exec; signal and process-info
// only to the same sandbox; the sysctl-read list; the opendirectoryd
// libinfo lookup for getpwuid; ipc-posix-sem for Python's SemLock;
// file-write-data on /dev/null only) and
// anthropic-experimental/sandbox-runtime src/sandbox/macos-sandbox-utils.ts
// (AF_UNIX needs system-socket to be created and network-bind /
// network-outbound with a unix-socket filter to be used; the deny
// file-write-unlink rules on a protected path's ancestors, without which
// moving a parent directory carries the protected path out from under its
// rule; both /var and /private/var spellings). Where they allow more
// (cfprefs, pseudo-terminals, IOKit, distributed notifications, the whole
// of /System) this profile does not: a Python executor needs none of it.
//
// Rule order: the profile relies on "the last matching rule wins". That is
// what sandbox-runtime builds on ("In Seatbelt profiles, later rules take
// precedence": it emits (allow file-read*), then its denies, then
// re-allows) and what the Chromium and codex profiles assume when they
// follow a broad allow with narrower denies. So every mask is denied after
// every allow, the agent's own grants inside a mask are allowed again
// after that, and masks beneath those own grants are denied once more.
// This has not been checked on a Mac by this project (nothing here runs
// macOS); the hostile tests must confirm it there.

// seatbeltInput is what the profile is generated from.
type seatbeltInput struct {
	// Policy is the normalized Policy of the run.
	Policy policy.Policy
	// Scratch is the run's private temporary folder (TMPDIR), canonical;
	// empty for none.
	Scratch string
	// ProxyPort is the port of the run's egress proxy on the host's
	// loopback, for a Policy with Egress; 0 for none.
	ProxyPort int
}

// seatbeltParam is one -D NAME=value pair.
type seatbeltParam struct{ Name, Value string }

// seatbeltSystem are the macOS paths a Python interpreter needs to read
// beyond Policy.System, canonical (as the kernel reports them to the
// sandbox: /private/etc, not /etc):
//
//   - the system libraries and frameworks; the dyld shared cache lives in
//     /System/Volumes/Preboot/Cryptexes (reached as /System/Cryptexes) from
//     macOS 13 and in /private/var/db/dyld before. Not the whole of /System:
//     /System/Volumes/Data is every user's data under another name.
//   - /Library/Frameworks (python.org's Python.framework) and
//     /private/var/db/timezone (where /usr/share/zoneinfo points).
//   - /private/etc, where /etc points (hosts, resolv.conf, ssl certs,
//     localtime); its secrets are in the nucleus.
var seatbeltSystem = []string{
	// The Command Line Tools' Python, which /usr/bin/python3 (a small
	// launcher) starts, and the link that says where they are.
	"/Library/Developer/CommandLineTools",
	"/Library/Frameworks",
	"/System/Cryptexes",
	"/System/Library",
	"/System/Volumes/Preboot/Cryptexes",
	"/private/etc",
	"/private/var/db/dyld",
	"/private/var/db/timezone",
	"/private/var/db/xcode_select_link",
}

// seatbeltDevRead are the device files every run may read.
var seatbeltDevRead = []string{"/dev/null", "/dev/random", "/dev/urandom", "/dev/zero"}

// seatbeltMDNS is the socket through which macOS resolves host names; a run
// with the network may connect to it even without UnixSockets.
const seatbeltMDNS = "/private/var/run/mDNSResponder"

// seatbeltDataVolume is where the firmlinked user data (/Users,
// /Applications, /Library, /private/var...) is also reachable.
const seatbeltDataVolume = "/System/Volumes/Data"

// seatbeltSysctls are the sysctls a Python interpreter reads (uname(3),
// os.cpu_count, platform, numpy's CPU feature checks), a subset of codex's
// list.
var seatbeltSysctls = []string{
	"hw.activecpu", "hw.byteorder", "hw.cputype", "hw.cpufamily",
	"hw.logicalcpu", "hw.logicalcpu_max", "hw.machine", "hw.memsize",
	"hw.model", "hw.ncpu", "hw.pagesize", "hw.physicalcpu",
	"hw.physicalcpu_max", "kern.argmax", "kern.hostname",
	"kern.maxfilesperproc", "kern.osproductversion", "kern.osrelease",
	"kern.ostype", "kern.osversion", "kern.secure_kernel",
	"kern.usrstack64", "kern.version", "machdep.cpu.brand_string",
	"sysctl.proc_cputype", "vm.loadavg",
}

// seatbeltSysctlPrefixes are sysctl name prefixes read the same way.
var seatbeltSysctlPrefixes = []string{"hw.optional.", "hw.perflevel"}

// seatbeltProfile returns the SBPL profile for in and its parameters, in
// the order sandbox-exec takes them ("-D", "NAME=value", ...).
func seatbeltProfile(in seatbeltInput) (profile string, args []string, err error) {
	text, params, err := seatbeltRules(in)
	if err != nil {
		return "", nil, err
	}
	for _, p := range params {
		args = append(args, "-D", p.Name+"="+p.Value)
	}
	return text, args, nil
}

// seatbeltRules builds the profile text and its parameters.
func seatbeltRules(in seatbeltInput) (string, []seatbeltParam, error) {
	p := in.Policy
	if err := checkSeatbeltPaths(in); err != nil {
		return "", nil, err
	}
	g := &sbplGen{}
	g.line("(version 1)")
	g.line("(deny default)")
	g.line("")
	g.line("; Processes: the command and what it starts; signals and process")
	g.line("; information only within this sandbox.")
	g.line("(allow process-fork)")
	g.line("(allow signal (target same-sandbox))")
	g.line("(allow process-info* (target same-sandbox))")
	g.line("(allow sysctl-read")
	for _, s := range seatbeltSysctls {
		g.line("  (sysctl-name " + strconv.Quote(s) + ")")
	}
	for _, s := range seatbeltSysctlPrefixes {
		g.line("  (sysctl-name-prefix " + strconv.Quote(s) + ")")
	}
	g.line(")")
	g.line("; getpwuid(3) (Python's expanduser, getpass) and SemLock (multiprocessing).")
	g.line(`(allow mach-lookup (global-name "com.apple.system.opendirectoryd.libinfo"))`)
	g.line("(allow ipc-posix-sem)")
	g.line("")

	// What the command may read (and execute).
	g.line("; Reads: the system paths, the devices, the grants.")
	var readable []string
	if p.RootReadable || p.RootWritable {
		readable = append(readable, "/")
	} else {
		for _, s := range p.System {
			readable = append(readable, seatbeltForms(s, false)...)
		}
		readable = append(readable, seatbeltSystem...)
	}
	readable = sbplDedupe(readable)
	sys := g.params("SYSTEM", readable)
	g.rule("allow", "file-read* process-exec", "subpath", sys)
	g.rule("allow", "file-read*", "literal", g.params("DEV", seatbeltDevRead))
	dnull := g.param("DEV_NULL", "/dev/null")
	g.line("(allow file-write-data file-ioctl (literal (param " + strconv.Quote(dnull) + ")))")

	var reads, writes, own []string
	for _, gr := range p.Grants {
		for _, f := range seatbeltForms(gr.Path, false) {
			if gr.Access == policy.Write {
				writes = append(writes, f)
			} else {
				reads = append(reads, f)
			}
			if gr.Own {
				own = append(own, f)
			}
		}
	}
	readNames := g.params("READ", reads)
	writeNames := g.params("WRITE", writes)
	g.rule("allow", "file-read* process-exec", "subpath", readNames)
	g.rule("allow", "file-read* file-write* process-exec", "subpath", writeNames)

	// Everything the command may reach by path needs its ancestors'
	// metadata (realpath, getcwd, Python's path set-up), not their
	// contents.
	var anc []string
	for _, r := range append(append(append([]string(nil), readable...), reads...), writes...) {
		anc = append(anc, sbplAncestors(r)...)
	}
	if in.Scratch != "" {
		anc = append(anc, sbplAncestors(in.Scratch)...)
	}
	g.line("")
	g.line("; Metadata (not contents) of the directories above what is readable.")
	g.rule("allow", "file-read-metadata", "literal", g.params("ANCESTOR", sbplDedupe(anc)))

	if p.RootWritable {
		g.line("")
		g.line("; The whole root is writable.")
		g.rule("allow", "file-write*", "subpath", []string{g.param("ROOT", "/")})
	}
	if in.Scratch != "" {
		g.line("")
		g.line("; The run's private TMPDIR, removed afterwards.")
		g.rule("allow", "file-read* file-write* process-exec", "subpath", []string{g.param("TMPDIR", in.Scratch)})
	}

	// Network.
	g.line("")
	g.line("; Network. socket(AF_UNIX) alone is allowed (socketpair); binding and")
	g.line("; connecting by path only as below.")
	g.line("(allow system-socket (socket-domain AF_UNIX))")
	if p.Network {
		g.line("(allow network-outbound (remote ip \"*:*\"))")
		g.line("(allow network-inbound (local ip \"*:*\"))")
		g.line("(allow network-bind (local ip \"*:*\"))")
		g.line("; Host name resolution goes through mDNSResponder's socket.")
		mdns := g.param("MDNS", seatbeltMDNS)
		g.line("(allow network-outbound (remote unix-socket (path-literal (param " + strconv.Quote(mdns) + "))))")
	} else if in.ProxyPort > 0 && in.ProxyPort < 65536 {
		g.line("; The network narrowed to named hosts: only the run's egress proxy, on")
		g.line("; the loopback, which resolves names and connects for the command.")
		g.line(fmt.Sprintf("(allow network-outbound (remote tcp \"localhost:%d\"))", in.ProxyPort))
	} else {
		g.line("; No network: deny default refuses every IP socket operation.")
	}
	if p.UnixSockets {
		g.line(`(allow network-outbound (remote unix-socket (path-regex #"^/")))`)
		g.line(`(allow network-bind (local unix-socket (path-regex #"^/")))`)
	}

	// The nucleus, after every allow: the last matching rule wins.
	var masks, inner []string
	for _, m := range p.Masks {
		forms := seatbeltForms(m.Path, true)
		masks = append(masks, forms...)
		if slices.ContainsFunc(own, func(o string) bool { return m.Path != o && fspath.Within(m.Path, o) }) {
			inner = append(inner, forms...)
		}
	}
	masks = sbplDedupe(masks)
	maskNames := g.params("MASK", masks)
	if len(maskNames) > 0 {
		g.line("")
		g.line("; The device nucleus and the session IPC: denied even inside grants.")
		g.rule("deny", "file-read* file-write* process-exec", "subpath", maskNames)
		if p.UnixSockets {
			g.line("(deny network-outbound")
			for _, n := range maskNames {
				g.line("  (remote unix-socket (subpath (param " + strconv.Quote(n) + ")))")
			}
			g.line(")")
		}
		// Renaming a directory above a mask would carry the mask's
		// contents out from under its rule.
		var above []string
		for _, m := range masks {
			for _, a := range sbplAncestors(m) {
				if seatbeltWritable(p, writes, in.Scratch, a) {
					above = append(above, a)
				}
			}
		}
		if len(above) > 0 {
			g.line("; No directory above a mask may be moved away.")
		}
		g.rule("deny", "file-write-unlink", "literal", g.params("MASK_PARENT", sbplDedupe(above)))
	}

	// The agent's own folders inside its masked directories open through
	// the mask, and only they.
	var through []string
	for _, gr := range p.Grants {
		if !gr.Own {
			continue
		}
		if _, ok := policy.CoveredByMask(gr.Path, p.Masks); ok {
			through = append(through, seatbeltForms(gr.Path, false)...)
		}
	}
	if len(through) > 0 {
		g.line("")
		g.line("; The agent's own folders, opened through its masked directories.")
		var ro, rw, anc []string
		for _, gr := range p.Grants {
			if _, ok := policy.CoveredByMask(gr.Path, p.Masks); !ok || !gr.Own {
				continue
			}
			forms := seatbeltForms(gr.Path, false)
			if gr.Access == policy.Write {
				rw = append(rw, forms...)
			} else {
				ro = append(ro, forms...)
			}
			for _, f := range forms {
				anc = append(anc, sbplAncestors(f)...)
			}
		}
		g.rule("allow", "file-read* process-exec", "subpath", g.params("OWN_READ", ro))
		g.rule("allow", "file-read* file-write* process-exec", "subpath", g.params("OWN_WRITE", rw))
		g.rule("allow", "file-read-metadata", "literal", g.params("OWN_ANCESTOR", sbplDedupe(anc)))
		if len(inner) > 0 {
			g.rule("deny", "file-read* file-write* process-exec", "subpath", g.params("OWN_MASK", sbplDedupe(inner)))
		}
		// The allows just above would let an own folder's subfolder
		// that holds a mask be moved away again: deny that last.
		var ownAbove []string
		for _, m := range inner {
			for _, a := range sbplAncestors(m) {
				if slices.ContainsFunc(rw, func(o string) bool { return fspath.Within(a, o) }) {
					ownAbove = append(ownAbove, a)
				}
			}
		}
		ownAbove = sbplDedupe(ownAbove)
		g.rule("deny", "file-write-unlink", "literal", g.params("OWN_MASK_PARENT", ownAbove))
	}
	return g.b.String(), g.out, nil
}

// sbplGen accumulates profile text and its parameters.
type sbplGen struct {
	b   strings.Builder
	out []seatbeltParam
}

func (g *sbplGen) line(s string) { g.b.WriteString(s + "\n") }

// param adds one parameter and returns its name.
func (g *sbplGen) param(name, value string) string {
	g.out = append(g.out, seatbeltParam{name, value})
	return name
}

// params adds PREFIX_0, PREFIX_1, ... for values and returns the names.
func (g *sbplGen) params(prefix string, values []string) []string {
	var names []string
	for i, v := range values {
		names = append(names, g.param(prefix+"_"+strconv.Itoa(i), v))
	}
	return names
}

// rule writes (action ops (filter (param NAME)) ...) for names; nothing
// when names is empty (an (allow op) with no filter would allow it all).
func (g *sbplGen) rule(action, ops, filter string, names []string) {
	if len(names) == 0 {
		return
	}
	g.line("(" + action + " " + ops)
	for _, n := range names {
		g.line("  (" + filter + " (param " + strconv.Quote(n) + "))")
	}
	g.line(")")
}

// checkSeatbeltPaths refuses what no parameter can carry: sandbox-exec
// splits -D at the first '=' (so a name never holds one; values may) and
// takes C strings (so no value may hold a NUL). Paths must be absolute.
func checkSeatbeltPaths(in seatbeltInput) error {
	p := in.Policy
	check := func(what, s string) error {
		switch {
		case strings.IndexByte(s, 0) >= 0:
			return fmt.Errorf("sandbox: seatbelt: %s %q holds a NUL byte", what, s)
		case !strings.HasPrefix(s, "/"):
			return fmt.Errorf("sandbox: seatbelt: %s %q is not absolute", what, s)
		}
		return nil
	}
	var errs []error
	for _, s := range p.System {
		errs = append(errs, check("system path", s))
	}
	for _, gr := range p.Grants {
		errs = append(errs, check("grant", gr.Path))
	}
	for _, m := range p.Masks {
		errs = append(errs, check("mask", m.Path))
	}
	if in.Scratch != "" {
		errs = append(errs, check("TMPDIR", in.Scratch))
	}
	return errors.Join(errs...)
}

// seatbeltForms returns the spellings under which the sandbox may see the
// absolute path p: p itself; /private/p for /etc, /tmp and /var (links to
// /private/...; Seatbelt matches the resolved path). For a mask
// (hostile) also its NFC and NFD forms (APFS finds a name in either form
// while keeping the one it was created with) and each of those under
// /System/Volumes/Data, where the firmlinked data volume shows the same
// files again.
func seatbeltForms(p string, hostile bool) []string {
	p = filepath.Clean(p)
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	add(p)
	for _, l := range []string{"/etc", "/tmp", "/var"} {
		if p == l || strings.HasPrefix(p, l+"/") {
			add("/private" + p)
		}
	}
	if !hostile {
		return out
	}
	for _, s := range slices.Clone(out) {
		add(norm.NFC.String(s))
		add(norm.NFD.String(s))
	}
	for _, s := range slices.Clone(out) {
		if s != "/" && !fspath.Within(s, "/System") {
			add(seatbeltDataVolume + s)
		}
	}
	return out
}

// sbplAncestors returns the directories strictly above the absolute path p,
// "/" included, nearest last.
func sbplAncestors(p string) []string {
	var out []string
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		out = append([]string{d}, out...)
		if d == "/" || d == "." {
			break
		}
	}
	if p == "/" {
		return nil
	}
	return out
}

// seatbeltWritable reports whether the directory dir may be renamed or
// removed by the command: it lies strictly inside a writable region.
func seatbeltWritable(p policy.Policy, writes []string, scratch, dir string) bool {
	if p.RootWritable {
		return dir != "/"
	}
	for _, w := range writes {
		if dir != w && fspath.Within(dir, w) {
			return true
		}
	}
	return scratch != "" && dir != scratch && fspath.Within(dir, scratch)
}

// sbplDedupe returns s without repeated strings, in first-seen order.
func sbplDedupe(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
