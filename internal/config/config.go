// Package config reads the agent's environment once, into a typed
// [Config], so that no other package of the agent calls os.Getenv.
//
// [FromEnv] reads every variable the agent acts on: its own METNOS_*
// settings, the folders of the user's platform (XDG_*, %LOCALAPPDATA%)
// and the session facts the sandbox hides from executors
// (DBUS_SESSION_BUS_ADDRESS, SSH_AUTH_SOCK, XDG_RUNTIME_DIR), and
// JOURNAL_STREAM, which systemd sets when it connects the agent's output
// to the journal. Each variable has one parsing rule and one default,
// written on its field.
//
// What it guarantees:
//
//   - A value the agent cannot use is an error naming the variable, the
//     value and what it accepts ([VarError]), all of them at once,
//     except where falling back is the safe side and refusing to start
//     could break a working setup: an unknown METNOS_LOG level (info is
//     used) and an unknown METNOS_SANDBOX value (the sandbox stays on)
//     are [Config.Warnings] instead.
//   - Zero means unset where the default is not one value for every
//     device (the memory limit, the history quota): the package that
//     applies the setting applies its own default. Elsewhere the field
//     holds the default when the variable is unset or empty.
//   - The tailnet auth key is a [Secret], which fmt, encoding/json and
//     log/slog print as "[redacted]".
//
// [LoadLimits] reads the device owner's limits file (limits.toml, in the
// configuration folder package layout names) together with the
// environment, whose METNOS_NET_ALLOW and METNOS_NET_DENY override its
// [network] lists: see [Limits].
//
// What it does not: look at the disk beyond that file (a METNOS_PYTHON
// or METNOS_BWRAP that does not exist is found out where it is used), compute paths
// (package layout does, from [Paths]), or read the variables only the
// tests read (METNOS_REQUIRE_SANDBOX, METNOS_E2E_BIN,
// METNOS_TAILNET_NETNS, METNOS_BENCH_*), those the Go runtime and the
// embedded tailnet node read for themselves (GOMEMLIMIT's value, TMPDIR,
// TS_*), or the variables the agent sets for executors.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Config is the agent's environment, read once.
type Config struct {
	// Paths are the variables the agent's folders are computed from.
	Paths Paths

	// LogLevel is METNOS_LOG: debug, info, warn or error (any case,
	// optionally with an offset, as log/slog reads a level: "info+2").
	// Default info.
	LogLevel slog.Level
	// LogLevelSet says METNOS_LOG named a level; the commands other
	// than run and demo then log at it to stderr, and at warn when not.
	LogLevelSet bool

	// Python is METNOS_PYTHON: the interpreter executors run with,
	// whatever else is installed. "" unset.
	Python string
	// PythonRuntime is the Python runtime archive to install from the
	// paired server before the first poll (…tar.gz):
	// METNOS_PYTHON_RUNTIME, or METNOS_PYTHON_RUNTIME_WIN on Windows
	// (what the Windows installer sets). "" unset.
	PythonRuntime string

	// ExecMemoryBytes is METNOS_EXEC_MEM_MB, a whole number of MiB, in
	// bytes: the memory limit of an executor run. 0 (unset or "0"): the
	// sandbox's default for the OS.
	ExecMemoryBytes int64
	// HistoryQuotaBytes is METNOS_HISTORY_QUOTA_MB, a whole number of
	// MiB, in bytes: how much the backup blobs may take.
	// [HistoryQuotaOff] for "off" (no quota); 0 (unset or "0"): the
	// history's default share of the free space.
	HistoryQuotaBytes int64
	// HistoryRetention is METNOS_HISTORY_RETENTION_DAYS, a whole number
	// of days: how long backup blobs are kept. Default
	// [DefaultHistoryRetention] (also for "0").
	HistoryRetention time.Duration
	// JournalRetention is METNOS_JOURNAL_RETENTION_DAYS, a whole number
	// of days: how long the history journal keeps a change. Default
	// [DefaultJournalRetention] (also for "0"); never shorter than
	// HistoryRetention (a shorter one is raised to it, with a warning).
	JournalRetention time.Duration
	// AuditRetention is METNOS_AUDIT_RETENTION_DAYS, a whole number of
	// days: how long the audit log keeps a day's file. Default
	// [DefaultAuditRetention] (also for "0").
	AuditRetention time.Duration
	// SpoolRetention is METNOS_SPOOL_RETENTION_DAYS, a whole number of
	// days: how long an undelivered result stays in the spool. Default
	// [DefaultSpoolRetention] (also for "0").
	SpoolRetention time.Duration

	// Bwrap is METNOS_BWRAP: the bubblewrap binary to use on Linux,
	// wherever it is. "" unset: a root-owned bwrap on PATH.
	Bwrap string
	// SandboxDisabled says why METNOS_SANDBOX turns every sandbox layer
	// off ("disabled by METNOS_SANDBOX=off") when it is 0, off, no or
	// false (any case, spaces ignored); "" when it does not (unset, 1,
	// on, yes, true, or an unknown value, which is also a warning).
	SandboxDisabled string
	// AppContainerOff says why METNOS_SANDBOX_APPCONTAINER keeps Windows
	// runs out of the AppContainer ("turned off by
	// METNOS_SANDBOX_APPCONTAINER=0", the Rust client's opt-out) when it
	// is 0, off, no or false; "" when it does not (unset, 1, on, yes,
	// true, or an unknown value, which is also a warning). Other systems
	// ignore it.
	AppContainerOff string
	// Shim is METNOS_SHIM: the sandbox shim binary on Linux. "" unset:
	// metnos-shim beside the agent's binary, else the agent's binary.
	Shim string
	// TailnetAuthKey is METNOS_TAILNET_AUTHKEY: the auth key of the
	// embedded tailnet node's first login, when no flag gives one. ""
	// unset.
	TailnetAuthKey Secret

	// NetAllow is METNOS_NET_ALLOW, split at commas, spaces trimmed:
	// the device owner's destinations every run with a network
	// capability may reach besides its manifest's (a host, host:port,
	// *.domain, an address or a CIDR prefix such as 192.168.1.0/24).
	// NetDeny is METNOS_NET_DENY, the same forms (and *:PORT): refused
	// whatever a manifest or NetAllow says, on top of the default deny
	// list. Package policy checks the entries (ParseOwnerDest).
	NetAllow, NetDeny []string
	// NetStrict is METNOS_NET_STRICT (1, on, yes, true): refuse a run
	// whose network is narrowed to named hosts where the sandbox cannot
	// keep the command from going around the proxy (Windows), instead
	// of running it with the narrowing binding only the programs that
	// use the proxy variables. Default false.
	NetStrict bool
	// Concurrency is METNOS_CONCURRENCY, a whole number from 1 to
	// [MaxConcurrency]: how many invocations may run at once, which
	// overrides the limits file's [priority] concurrency. 0 unset.
	Concurrency int
	// EgressDNS is METNOS_EGRESS_DNS, a host:port: the DNS server the
	// egress proxy resolves names with instead of the system's. ""
	// unset.
	EgressDNS string
	// DryRunScratch is METNOS_DRY_RUN_SCRATCH, an absolute path: the
	// folder a dry run keeps its layers in while it runs (Linux). ""
	// unset: the temporary folder, else /var/tmp, whichever lies outside
	// the folders the run may write.
	DryRunScratch string

	// UpdateOff is METNOS_UPDATE=off (0, off, no, false): the agent
	// does not update itself from the server (`metnos-agent update` by
	// hand still does). Default on.
	UpdateOff bool
	// UpdateProbation is METNOS_UPDATE_PROBATION_S, in seconds: how long
	// a new build may run without a successful poll before it exits 1,
	// which counts as a failed start ([DefaultUpdateProbation] when unset
	// or 0).
	UpdateProbation time.Duration

	// StopTimeout is METNOS_STOP_TIMEOUT_S, in seconds: how long the
	// service manager lets the agent stop before it kills it (the
	// systemd unit sets it to its TimeoutStopSec). Once asked to stop,
	// the agent cuts a run still going at half of it, delivers that
	// run's result, and exits before it ends. 0 (unset or "0"): none, a
	// run under way finishes however long it takes.
	StopTimeout time.Duration

	// BytecodeOff is METNOS_BYTECODE=off (0, off, no, false): the agent
	// keeps no compiled bytecode of the executors and the shim, so every
	// run compiles them from source. Default on.
	BytecodeOff bool

	// DBusSessionBus is DBUS_SESSION_BUS_ADDRESS, whose sockets the
	// sandbox hides. "" unset.
	DBusSessionBus string
	// SSHAuthSock is SSH_AUTH_SOCK, the ssh-agent's socket, which the
	// sandbox hides. "" unset.
	SSHAuthSock string
	// Path is PATH as it is: where the agent looks for bwrap and Python,
	// and the start of an executor's PATH. "" unset (each user of it has
	// its fallback: /usr/bin:/bin for executors, /usr/local/bin:/usr/bin:/bin
	// for exec).
	Path string
	// Lang is LANG, passed to executors and exec commands. Default
	// [DefaultLang].
	Lang string
	// Term and TZ are TERM and TZ, passed to exec commands when set.
	Term, TZ string
	// Editor is the editor `limits edit` opens: VISUAL, else EDITOR, as
	// they are (a program, and maybe its arguments, such as
	// "code --wait"). "" unset.
	Editor string
	// GoMemLimit is GOMEMLIMIT as it is; the Go runtime reads it. While
	// it is unset the agent sets a soft memory limit of its own when it
	// joins a tailnet.
	GoMemLimit string
	// User is the user's name when the user database gives none: USER,
	// or USERDOMAIN\USERNAME on Windows. "" unset.
	User string
	// JournalStream is JOURNAL_STREAM as it is: "DEV:INODE", in decimal,
	// of the stream systemd connected stdout or stderr to the journal
	// with (systemd.exec(5)). `run` writes its stderr for the journal
	// (priority prefixes, no time) only when fd 2 is that very stream, so
	// a variable inherited by a process whose stderr went elsewhere
	// changes nothing. "" unset. It is kept when FromEnv fails, as
	// Paths are, for what `run` logs before it gives up.
	JournalStream string

	// Warnings are the values FromEnv did not understand and replaced
	// by their default, for the caller to log.
	Warnings []string
}

// Paths are the variables the agent's folders are computed from. Pass
// [Paths.Getenv] to layout.For.
type Paths struct {
	// DataDir and CacheDir are METNOS_DATA_DIR and METNOS_CACHE_DIR, as
	// they are: they move the agent's data and cache folders.
	DataDir, CacheDir string
	// XDGDataHome, XDGCacheHome, XDGConfigHome and XDGRuntimeDir are the
	// XDG base directories, as they are (layout ignores one that is not
	// absolute).
	XDGDataHome, XDGCacheHome, XDGConfigHome, XDGRuntimeDir string
	// LocalAppData and AppData are %LOCALAPPDATA% and %APPDATA% (Windows).
	LocalAppData, AppData string
	// Home is HOME, or USERPROFILE on Windows, as it is.
	Home string
}

// pathVars maps each variable of Paths to its field.
var pathVars = map[string]func(*Paths) *string{
	"METNOS_DATA_DIR":  func(p *Paths) *string { return &p.DataDir },
	"METNOS_CACHE_DIR": func(p *Paths) *string { return &p.CacheDir },
	"XDG_DATA_HOME":    func(p *Paths) *string { return &p.XDGDataHome },
	"XDG_CACHE_HOME":   func(p *Paths) *string { return &p.XDGCacheHome },
	"XDG_CONFIG_HOME":  func(p *Paths) *string { return &p.XDGConfigHome },
	"XDG_RUNTIME_DIR":  func(p *Paths) *string { return &p.XDGRuntimeDir },
	"LOCALAPPDATA":     func(p *Paths) *string { return &p.LocalAppData },
	"APPDATA":          func(p *Paths) *string { return &p.AppData },
}

// Getenv returns the value of the variable name as FromEnv read it: one
// of the variables of Paths (HOME and USERPROFILE both give Home, the
// one of the two FromEnv's operating system reads), else "".
func (p Paths) Getenv(name string) string {
	if name == "HOME" || name == "USERPROFILE" {
		return p.Home
	}
	if f, ok := pathVars[name]; ok {
		return *f(&p)
	}
	return ""
}

// Defaults of the variables whose default is one value everywhere.
const (
	DefaultHistoryRetention = 30 * 24 * time.Hour
	DefaultJournalRetention = 365 * 24 * time.Hour
	DefaultAuditRetention   = 365 * 24 * time.Hour
	DefaultSpoolRetention   = 14 * 24 * time.Hour
	DefaultLang             = "C.UTF-8"
	// DefaultUpdateProbation is how long a new build may run without a
	// successful poll before it counts as a failed start.
	DefaultUpdateProbation = 10 * time.Minute
)

// HistoryQuotaOff is the HistoryQuotaBytes of METNOS_HISTORY_QUOTA_MB=off:
// no quota.
const HistoryQuotaOff = -1

// maxStopTimeout is the longest METNOS_STOP_TIMEOUT_S, in seconds: a
// day.
const maxStopTimeout = 24 * 3600

// maxMiB is the largest number of MiB whose bytes fit in an int64;
// maxDays the largest number of days that fits in a time.Duration.
const (
	maxMiB  = math.MaxInt64 >> 20
	maxDays = int64(math.MaxInt64 / (24 * time.Hour))
)

// A VarError is an environment variable whose value the agent cannot
// use.
type VarError struct {
	// Name is the variable, Value its value.
	Name, Value string
	// Accepts says what the variable accepts.
	Accepts string
}

func (e *VarError) Error() string {
	return fmt.Sprintf("config: %s=%q is not valid: it takes %s", e.Name, e.Value, e.Accepts)
}

// FromEnv reads the agent's configuration on goos from the environment
// getenv (os.Getenv, or a test's). The error joins a [*VarError] for
// every variable that is not valid; with it, the Config holds only its
// [Paths] and JournalStream.
func FromEnv(goos string, getenv func(string) string) (Config, error) {
	r := reader{getenv: getenv}
	c := Config{
		Python:         getenv("METNOS_PYTHON"),
		Bwrap:          getenv("METNOS_BWRAP"),
		Shim:           getenv("METNOS_SHIM"),
		TailnetAuthKey: Secret(getenv("METNOS_TAILNET_AUTHKEY")),
		DBusSessionBus: getenv("DBUS_SESSION_BUS_ADDRESS"),
		SSHAuthSock:    getenv("SSH_AUTH_SOCK"),
		Path:           getenv("PATH"),
		Lang:           getenv("LANG"),
		Term:           getenv("TERM"),
		TZ:             getenv("TZ"),
		GoMemLimit:     getenv("GOMEMLIMIT"),
		JournalStream:  getenv("JOURNAL_STREAM"),
		Editor:         getenv("VISUAL"),
	}
	if c.Editor == "" {
		c.Editor = getenv("EDITOR")
	}
	for name, f := range pathVars {
		*f(&c.Paths) = getenv(name)
	}
	c.Paths.Home = getenv("HOME")
	c.User = getenv("USER")
	runtimeVar, otherVar := "METNOS_PYTHON_RUNTIME", "METNOS_PYTHON_RUNTIME_WIN"
	if goos == "windows" {
		c.Paths.Home = getenv("USERPROFILE")
		c.User = ""
		if n := getenv("USERNAME"); n != "" {
			c.User = n
			if d := getenv("USERDOMAIN"); d != "" {
				c.User = d + `\` + n
			}
		}
		runtimeVar, otherVar = otherVar, runtimeVar
	}
	c.PythonRuntime = getenv(runtimeVar)
	if v := getenv(otherVar); v != "" && c.PythonRuntime == "" {
		r.warn("%s is not read on %s: set %s", otherVar, goos, runtimeVar)
	}
	if c.Lang == "" {
		c.Lang = DefaultLang
	}

	if v := strings.TrimSpace(getenv("METNOS_LOG")); v != "" {
		c.LogLevelSet = true
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			c.LogLevel, c.LogLevelSet = slog.LevelInfo, false
			r.warn("METNOS_LOG=%q is not a level (debug, info, warn or error): info is used", v)
		}
	}
	c.SandboxDisabled = r.sandbox("METNOS_SANDBOX")
	c.AppContainerOff = r.appContainer("METNOS_SANDBOX_APPCONTAINER")
	c.NetAllow = list(getenv("METNOS_NET_ALLOW"))
	c.NetDeny = list(getenv("METNOS_NET_DENY"))
	c.NetStrict = r.flag("METNOS_NET_STRICT")
	if v := getenv("METNOS_CONCURRENCY"); strings.TrimSpace(v) != "" {
		if n, ok := whole(v, MaxConcurrency); ok && n >= 1 {
			c.Concurrency = int(n)
		} else {
			r.fail("METNOS_CONCURRENCY", v, fmt.Sprintf("a whole number of invocations from 1 (one at a time) to %d", MaxConcurrency))
		}
	}
	if v := strings.TrimSpace(getenv("METNOS_EGRESS_DNS")); v != "" {
		if h, p, err := net.SplitHostPort(v); err != nil || h == "" || p == "" {
			r.fail("METNOS_EGRESS_DNS", v, "a DNS server as host:port, such as 127.0.0.1:53")
		} else {
			c.EgressDNS = v
		}
	}
	if v := strings.TrimSpace(getenv("METNOS_DRY_RUN_SCRATCH")); v != "" {
		if !filepath.IsAbs(v) {
			r.fail("METNOS_DRY_RUN_SCRATCH", v, "an absolute path of a folder outside the folders executors may write, such as /var/tmp")
		} else {
			c.DryRunScratch = filepath.Clean(v)
		}
	}
	switch v := getenv("METNOS_UPDATE"); strings.ToLower(strings.TrimSpace(v)) {
	case "0", "off", "no", "false":
		c.UpdateOff = true
	case "", "1", "on", "yes", "true":
	default:
		r.fail("METNOS_UPDATE", v, "1, on, yes, true or 0, off, no, false")
	}
	switch v := getenv("METNOS_BYTECODE"); strings.ToLower(strings.TrimSpace(v)) {
	case "0", "off", "no", "false":
		c.BytecodeOff = true
	case "", "1", "on", "yes", "true":
	default:
		r.fail("METNOS_BYTECODE", v, "1, on, yes, true or 0, off, no, false")
	}
	c.UpdateProbation = DefaultUpdateProbation
	if v := getenv("METNOS_UPDATE_PROBATION_S"); strings.TrimSpace(v) != "" {
		n, ok := whole(v, 7*24*3600)
		switch {
		case !ok:
			r.fail("METNOS_UPDATE_PROBATION_S", v, fmt.Sprintf("a whole number of seconds up to a week (0 or unset: %d)", int64(DefaultUpdateProbation/time.Second)))
		case n > 0:
			c.UpdateProbation = time.Duration(n) * time.Second
		}
	}
	if v := getenv("METNOS_STOP_TIMEOUT_S"); strings.TrimSpace(v) != "" {
		if n, ok := whole(v, maxStopTimeout); ok {
			c.StopTimeout = time.Duration(n) * time.Second
		} else {
			r.fail("METNOS_STOP_TIMEOUT_S", v, fmt.Sprintf("a whole number of seconds up to a day (%d; 0 or unset: none)", maxStopTimeout))
		}
	}
	c.ExecMemoryBytes = r.mib("METNOS_EXEC_MEM_MB", false)
	c.HistoryQuotaBytes = r.mib("METNOS_HISTORY_QUOTA_MB", true)
	c.HistoryRetention = r.days("METNOS_HISTORY_RETENTION_DAYS", DefaultHistoryRetention)
	c.JournalRetention = r.days("METNOS_JOURNAL_RETENTION_DAYS", DefaultJournalRetention)
	if c.JournalRetention < c.HistoryRetention {
		// The journal is what a local undo, and `history`, know of a
		// change whose blobs are still kept.
		r.warn("METNOS_JOURNAL_RETENTION_DAYS=%d is shorter than METNOS_HISTORY_RETENTION_DAYS=%d: the history journal keeps changes %d days, as long as their backup blobs",
			c.JournalRetention/(24*time.Hour), c.HistoryRetention/(24*time.Hour), c.HistoryRetention/(24*time.Hour))
		c.JournalRetention = c.HistoryRetention
	}
	c.AuditRetention = r.days("METNOS_AUDIT_RETENTION_DAYS", DefaultAuditRetention)
	c.SpoolRetention = r.days("METNOS_SPOOL_RETENTION_DAYS", DefaultSpoolRetention)
	c.Warnings = r.warnings
	if len(r.errs) > 0 {
		// The folders still count: run's early update boot finds the
		// build on probation by them, so that a build that refuses the
		// environment is still rolled back; and what it logs meanwhile
		// still goes to the journal as the journal reads it.
		return Config{Paths: c.Paths, JournalStream: c.JournalStream}, errors.Join(r.errs...)
	}
	return c, nil
}

// FromProcess reads the agent's configuration from this process's
// environment: [FromEnv] of os.Getenv on this operating system. It is
// the one place the agent reads its environment; the command line calls
// it once, at its start.
func FromProcess() (Config, error) { return FromEnv(runtime.GOOS, os.Getenv) }

// reader gathers the errors and warnings of one FromEnv.
type reader struct {
	getenv   func(string) string
	errs     []error
	warnings []string
}

func (r *reader) warn(format string, args ...any) {
	r.warnings = append(r.warnings, fmt.Sprintf(format, args...))
}

func (r *reader) fail(name, value, accepts string) {
	r.errs = append(r.errs, &VarError{Name: name, Value: value, Accepts: accepts})
}

// whole reads a whole number from 0 to max, spaces around it ignored;
// ok is false when v is not one.
func whole(v string, max int64) (n int64, ok bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return n, err == nil && n >= 0 && n <= max
}

// mib reads a number of MiB and returns it in bytes, 0 when unset; with
// off, "off" (any case) is [HistoryQuotaOff].
func (r *reader) mib(name string, off bool) int64 {
	v := r.getenv(name)
	if strings.TrimSpace(v) == "" {
		return 0
	}
	if off && strings.EqualFold(strings.TrimSpace(v), "off") {
		return HistoryQuotaOff
	}
	n, ok := whole(v, maxMiB)
	if !ok {
		accepts := fmt.Sprintf("a whole number of MiB from 1 to %d (0 or unset: the default)", int64(maxMiB))
		if off {
			accepts += `, or "off" for none`
		}
		r.fail(name, v, accepts)
		return 0
	}
	return n << 20
}

// days reads a number of days, def when it is unset or 0.
func (r *reader) days(name string, def time.Duration) time.Duration {
	v := r.getenv(name)
	if strings.TrimSpace(v) == "" {
		return def
	}
	n, ok := whole(v, maxDays)
	if !ok {
		r.fail(name, v, fmt.Sprintf("a whole number of days from 1 to %d (0 or unset: %d)", maxDays, def/(24*time.Hour)))
		return def
	}
	if n == 0 {
		return def
	}
	return time.Duration(n) * 24 * time.Hour
}

// sandbox reads the sandbox switch: the reason it is off, or "".
func (r *reader) sandbox(name string) string {
	return r.turnedOff(name, "disabled by ", "(sandbox off)", "the sandbox stays on")
}

// appContainer reads the owner's AppContainer switch: like sandbox, an
// unknown value keeps the stronger setting, with a warning.
func (r *reader) appContainer(name string) string {
	return r.turnedOff(name, "turned off by ", "(no AppContainer)", "Windows runs stay in the AppContainer")
}

// turnedOff reads a switch of a protection that is on unless turned
// off: "" when it stays on (unset, 1, on, yes, true), else says why,
// starting with by. An unknown value keeps it on, with a warning that
// says what off means (offIs) and that it stays on (stays).
func (r *reader) turnedOff(name, by, offIs, stays string) string {
	v := r.getenv(name)
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "0", "off", "no", "false":
		return by + name + "=" + v
	case "", "1", "on", "yes", "true":
		return ""
	}
	r.warn("%s=%q is not 0, off, no, false %s or 1, on, yes, true: %s", name, v, offIs, stays)
	return ""
}

// list splits a comma-separated list, dropping empty entries.
func list(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// flag reads a yes/no switch whose default is no.
func (r *reader) flag(name string) bool {
	v := r.getenv(name)
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "on", "yes", "true":
		return true
	case "", "0", "off", "no", "false":
		return false
	}
	r.fail(name, v, "1, on, yes, true or 0, off, no, false")
	return false
}

// Secret is a value that must not be written anywhere: fmt, encoding/json
// and log/slog show "[redacted]" for it (and "" when it is empty);
// string(s) is the value.
type Secret string

const redacted = "[redacted]"

// String returns "[redacted]", or "" for the empty Secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString is String, for %#v.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// MarshalText is String, for encoding/json and log/slog.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
