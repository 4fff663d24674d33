package config

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Mode is the owner's mode, limits.toml's mode: how far executors may go
// on this device.
type Mode string

// The modes of limits.toml.
const (
	// ModeFull is today's behaviour: every executor runs with what its
	// manifest and the rest of the limits give it. The default.
	ModeFull Mode = "full"
	// ModeSupervised runs what full runs; every run of an executor that
	// writes is logged at warn before it starts, and every audit line
	// says the mode it ran under.
	ModeSupervised Mode = "supervised"
	// ModeReadonly refuses, before it runs, every invocation of an
	// executor that writes (whose manifest declares fs:write).
	ModeReadonly Mode = "readonly"
	// ModePreview runs every invocation of an executor that writes as a
	// dry run, where the build has dry runs, and refuses it where it
	// has none: it never runs one for real.
	ModePreview Mode = "preview"
)

// modes are the modes in the order the messages list them.
var modes = []Mode{ModeFull, ModeSupervised, ModeReadonly, ModePreview}

// Priority is limits.toml's [priority]: how much of the machine an
// executor's run may take. The values are checked here; the sandbox
// applies them (sandbox.ParsePriority reads the same words). "" and 0
// are "not set": the sandbox's own default, cpu and io low.
type Priority struct {
	// CPU is cpu: "background", "low" or "normal" ("": low).
	CPU string
	// IO is io: "idle", "low" (also "best-effort-low") or "normal"
	// ("": low).
	IO string
	// CPUTimeS is cpu_time_s: the most CPU time a run may use, in
	// seconds (0: no limit but the run's deadline).
	CPUTimeS int64
	// Concurrency is concurrency: how many invocations may run at once
	// (0: [DefaultConcurrency]; 1: one at a time). METNOS_CONCURRENCY
	// overrides it.
	Concurrency int
}

// DefaultConcurrency is how many invocations run at once when neither
// the limits file nor METNOS_CONCURRENCY says; MaxConcurrency the most
// either may say.
const (
	DefaultConcurrency = 4
	MaxConcurrency     = 64
)

// Concurrency is how many invocations may run at once: [priority]
// concurrency (or METNOS_CONCURRENCY), [DefaultConcurrency] when
// neither says.
func (l Limits) Concurrency() int {
	if n := l.Priority.Concurrency; n > 0 {
		return n
	}
	return DefaultConcurrency
}

// priorityValues are the values [priority] cpu and io take.
var priorityValues = map[string][]string{
	"priority.cpu": {"background", "low", "normal"},
	"priority.io":  {"idle", "low", "best-effort-low", "normal"},
}

// maxCPUTimeS is the largest cpu_time_s: a week.
const maxCPUTimeS = 7 * 24 * 3600

// Lists are an allow list and a deny list, of limits.toml's [network]
// or [executors].
type Lists struct {
	Allow, Deny []string
}

// Source says where a setting in force came from.
type Source string

// The sources of a setting.
const (
	// FromDefault: neither the file nor the environment says it.
	FromDefault Source = "default"
	// FromFile: limits.toml says it.
	FromFile Source = "file"
	// FromEnvironment: an environment variable overrides the file.
	FromEnvironment Source = "environment"
)

// LimitKeys are the settings of limits.toml, as [Limits.Settings] and
// [DiffLimits] name them: the table, a dot, then the key.
var LimitKeys = []string{
	"mode", "never",
	"network.allow", "network.deny",
	"executors.allow", "executors.deny",
	"priority.cpu", "priority.io", "priority.cpu_time_s", "priority.concurrency",
}

// netVars are the variables that override [network]'s lists.
var netVars = map[string]string{"network.allow": "METNOS_NET_ALLOW", "network.deny": "METNOS_NET_DENY", "priority.concurrency": "METNOS_CONCURRENCY"}

// Limits are the device owner's limits: limits.toml in the agent's
// configuration folder, with the environment's overrides. No invocation
// can change them: the file's folder is one of the agent's folders,
// which every executor's sandbox masks. The zero value, like a missing
// file, is today's behaviour: mode full, nothing never, no list.
type Limits struct {
	// File is the limits file's path ("" when there is no configuration
	// folder); Present says it exists and was read.
	File    string
	Present bool
	// Data are the file's bytes as read, SHA256 their hash in hex (nil
	// and "" without a file).
	Data   []byte
	SHA256 string

	// Mode is mode (default full).
	Mode Mode
	// Never are the folders and files no executor may read or write
	// (never), absolute and clean, ~ expanded; NeverAsWritten are the
	// same as the file writes them.
	Never, NeverAsWritten []string
	// Network is [network]: the owner's destinations every run with a
	// network capability may reach besides its manifest's (Allow), and
	// those refused whatever else says so (Deny), in the forms
	// METNOS_NET_ALLOW and METNOS_NET_DENY take (package policy checks
	// them). Each variable, when set, overrides its list.
	Network Lists
	// Executors is [executors]: the executors that may run, by name
	// (Allow; empty: all), and those that may not (Deny), which wins.
	Executors Lists
	// Priority is [priority], for the sandbox.
	Priority Priority

	// from says where each setting came from, by key (absent: the
	// default); where is the file's row:col of each key it sets.
	from  map[string]Source
	where map[string]string
}

// Setting is one setting of [Limits] as `metnos-agent limits` shows it.
type Setting struct {
	// Key is the setting's key (one of [LimitKeys]), Value its value in
	// force, written as TOML writes it.
	Key   string `json:"key"`
	Value string `json:"value"`
	// Source is where the value came from; Var names the variable of
	// an environment override.
	Source Source `json:"source"`
	Var    string `json:"var,omitempty"`
	// At is where the file sets it ("path:row:col"), when it does.
	At string `json:"at,omitempty"`
}

// Settings are the limits in force, one per key of [LimitKeys], in
// that order.
func (l Limits) Settings() []Setting {
	var out []Setting
	for _, k := range LimitKeys {
		s := Setting{Key: k, Value: l.value(k), Source: l.Source(k), At: l.where[k]}
		if s.Source == FromEnvironment {
			s.Var = netVars[k]
		}
		out = append(out, s)
	}
	return out
}

// Source says where the setting key came from.
func (l Limits) Source(key string) Source {
	if s, ok := l.from[key]; ok {
		return s
	}
	return FromDefault
}

// Where is where the file sets key, "path:row:col", or the file's path
// when it does not.
func (l Limits) Where(key string) string {
	if w := l.where[key]; w != "" {
		return w
	}
	return l.File
}

// InForce is the mode in force: Mode, or full when it is unset.
func (l Limits) InForce() Mode {
	if l.Mode == "" {
		return ModeFull
	}
	return l.Mode
}

// value writes the value of key as TOML writes it.
func (l Limits) value(key string) string {
	switch key {
	case "mode":
		return strconv.Quote(string(l.InForce()))
	case "never":
		return tomlList(l.NeverAsWritten)
	case "network.allow":
		return tomlList(l.Network.Allow)
	case "network.deny":
		return tomlList(l.Network.Deny)
	case "executors.allow":
		return tomlList(l.Executors.Allow)
	case "executors.deny":
		return tomlList(l.Executors.Deny)
	case "priority.cpu":
		return strconv.Quote(cmp.Or(l.Priority.CPU, "low"))
	case "priority.io":
		return strconv.Quote(cmp.Or(l.Priority.IO, "low"))
	case "priority.cpu_time_s":
		return strconv.FormatInt(l.Priority.CPUTimeS, 10)
	case "priority.concurrency":
		return strconv.Itoa(l.Concurrency())
	}
	return ""
}

// tomlList writes a list of strings as TOML does: ["a", "b"].
func tomlList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// Change is a setting whose value changed: [DiffLimits] lists them.
type Change struct {
	// Key is the setting's key; Old and New its values, written as
	// TOML writes them.
	Key, Old, New string
}

// DiffLimits lists the settings whose values differ from old to new, in
// the order of [LimitKeys].
func DiffLimits(old, new Limits) []Change {
	var out []Change
	for _, k := range LimitKeys {
		if o, n := old.value(k), new.value(k); o != n {
			out = append(out, Change{Key: k, Old: o, New: n})
		}
	}
	return out
}

// RefuseExecutor says why [executors] refuses the executor name, "" when
// it lets it run: deny wins over allow, and an empty allow list allows
// every executor.
func (l Limits) RefuseExecutor(name string) string {
	if slices.Contains(l.Executors.Deny, name) {
		return fmt.Sprintf("[executors] deny lists %q", name)
	}
	if len(l.Executors.Allow) > 0 && !slices.Contains(l.Executors.Allow, name) {
		return fmt.Sprintf("[executors] allow does not list %q", name)
	}
	return ""
}

// RefusedError is an invocation the owner's limits refuse before it
// runs.
type RefusedError struct {
	// File is the limits file ("" without one); Rule says which of its
	// rules refused, in its own words.
	File, Rule string
}

func (e *RefusedError) Error() string {
	if e.File == "" {
		return "refused by the owner's limits: " + e.Rule
	}
	return fmt.Sprintf("refused by the owner's limits (%s): %s", e.File, e.Rule)
}

// Refused is the refusal of l's rule.
func (l Limits) Refused(rule string) *RefusedError { return &RefusedError{File: l.File, Rule: rule} }

// LimitsError is a limits file the agent refuses, and where: a key it
// does not know, a value of the wrong type or outside what the key
// takes, a file other users can write.
type LimitsError struct {
	// File is the limits file; Row and Col where in it (1-based; 0
	// when the whole file is refused).
	File     string
	Row, Col int
	// Msg says what is wrong.
	Msg string
}

func (e *LimitsError) Error() string {
	if e.Row == 0 {
		return fmt.Sprintf("config: %s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("config: %s:%d:%d: %s", e.File, e.Row, e.Col, e.Msg)
}

// maxLimitsBytes is the largest limits file read.
const maxLimitsBytes = 1 << 20

// LimitsTemplate is the limits file `metnos-agent limits edit` creates:
// every setting, commented out, at its default.
const LimitsTemplate = `# The owner's limits on what Metnos executors may do on this device.
# No invocation can change this file: executors never see its folder.
# A running agent notices a change within a poll (about 25 s) and writes
# it to its audit log; metnos-agent limits shows what is in force.
# See docs/limits.md.

# mode: full (every executor runs with what its manifest asks),
# supervised (the same, each run that writes logged), readonly (an
# executor that writes is refused before it runs) or preview (an
# executor that writes runs as a dry run, or not at all).
# mode = "full"

# Folders and files no executor may read or write, whatever it is
# granted (~ is your home folder).
# never = ["~/Private", "/srv/family"]

[network]
# Hosts every run with a network capability may reach besides its
# manifest's (host, host:port, *.domain, an address or a CIDR prefix),
# and hosts refused whatever else says so (also *:PORT).
# METNOS_NET_ALLOW and METNOS_NET_DENY, when set, override these.
# allow = ["nas.local", "192.168.1.0/24"]
# deny = ["*.example.com"]

[executors]
# Executors by name: allow (empty: all) and deny, which wins.
# allow = ["list_folder", "write_files"]
# deny = ["delete_files"]

[priority]
# How much of the machine a run may take.
# cpu = "background"          # or "normal"
# io = "idle"                 # or "best-effort-low", "normal"
# cpu_time_s = 600            # CPU seconds a run may use (0: no limit)
# concurrency = 4             # invocations run at once (1: one at a time)
`

// LoadLimits reads the owner's limits file at path, ~ in it expanded to
// home, with env's overrides (METNOS_NET_ALLOW and METNOS_NET_DENY, when
// set, replace [network]'s lists). Without a file (or a path) the limits
// are the defaults, today's behaviour.
//
// A file that another user can write is refused: one that is not this
// user's, or whose mode or folder's mode lets the group or others write
// (on Windows, which has no such modes, this check is not made). So is a
// file with a key it does not know, a value of the wrong type, or a
// value the key does not take: the error names the file and the row
// and column, and says what to do. The error is a [*LimitsError] (or
// several, joined).
func LoadLimits(path, home string, env Config) (Limits, error) {
	l := Limits{File: path}
	if path != "" {
		f, err := os.Open(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return Limits{File: path}, fmt.Errorf("config: reading the owner's limits file %s: %w", path, err)
		default:
			defer f.Close()
			if err := checkPrivate(path, f); err != nil {
				return Limits{File: path}, err
			}
			data, err := io.ReadAll(io.LimitReader(f, maxLimitsBytes+1))
			if err != nil {
				return Limits{File: path}, fmt.Errorf("config: reading the owner's limits file %s: %w", path, err)
			}
			if len(data) > maxLimitsBytes {
				return Limits{File: path}, &LimitsError{File: path, Msg: fmt.Sprintf("over %d bytes: is it the limits file?", maxLimitsBytes)}
			}
			if l, err = ParseLimits(data, path, home); err != nil {
				return Limits{File: path}, err
			}
		}
	}
	for key, v := range map[string][]string{"network.allow": env.NetAllow, "network.deny": env.NetDeny} {
		if len(v) == 0 {
			continue
		}
		if key == "network.allow" {
			l.Network.Allow = v
		} else {
			l.Network.Deny = v
		}
		l.setFrom(key, FromEnvironment, "")
	}
	if env.Concurrency > 0 {
		l.Priority.Concurrency = env.Concurrency
		l.setFrom("priority.concurrency", FromEnvironment, "")
	}
	return l, nil
}

// limitsFile is limits.toml as decoded; a nil field is not set.
type limitsFile struct {
	Mode      *string       `toml:"mode"`
	Never     *[]string     `toml:"never"`
	Network   *listsFile    `toml:"network"`
	Executors *listsFile    `toml:"executors"`
	Priority  *priorityFile `toml:"priority"`
}

type listsFile struct {
	Allow *[]string `toml:"allow"`
	Deny  *[]string `toml:"deny"`
}

type priorityFile struct {
	CPU      *string `toml:"cpu"`
	IO       *string `toml:"io"`
	CPUTimeS *int64  `toml:"cpu_time_s"`
	Conc     *int64  `toml:"concurrency"`
}

// takes says what each key takes, for the messages.
var takes = map[string]string{
	"mode":                 "a string: " + quotedModes(),
	"never":                `a list of paths, such as ["~/Private", "/srv/family"]`,
	"network":              "a table: [network] with allow and deny",
	"network.allow":        `a list of hosts, such as ["nas.local", "192.168.1.0/24"]`,
	"network.deny":         `a list of hosts, such as ["*.example.com", "*:25"]`,
	"executors":            "a table: [executors] with allow and deny",
	"executors.allow":      `a list of executor names, such as ["list_folder"]`,
	"executors.deny":       `a list of executor names, such as ["delete_files"]`,
	"priority":             "a table: [priority] with cpu, io, cpu_time_s and concurrency",
	"priority.cpu":         `a string: "background", "low" or "normal"`,
	"priority.io":          `a string: "idle", "low" (or "best-effort-low") or "normal"`,
	"priority.cpu_time_s":  fmt.Sprintf("a whole number of seconds from 0 (no limit) to %d", maxCPUTimeS),
	"priority.concurrency": fmt.Sprintf("a whole number of invocations run at once, from 1 (one at a time) to %d", MaxConcurrency),
}

// known lists the keys a table takes, for the message of an unknown one.
var known = map[string]string{
	"":          "mode, never, [network], [executors] and [priority]",
	"network":   "allow and deny",
	"executors": "allow and deny",
	"priority":  "cpu, io, cpu_time_s and concurrency",
}

func quotedModes() string {
	q := make([]string, len(modes))
	for i, m := range modes {
		q[i] = strconv.Quote(string(m))
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// ParseLimits reads the limits file data, read from path, ~ expanded to
// home, as [LoadLimits] does, without looking at the disk or the
// environment.
func ParseLimits(data []byte, path, home string) (Limits, error) {
	l := Limits{File: path, Present: true, Data: data}
	sum := sha256.Sum256(data)
	l.SHA256 = hex.EncodeToString(sum[:])
	var f limitsFile
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Limits{File: path}, decodeError(path, err)
	}
	var errs []error
	bad := func(key, format string, args ...any) {
		row, col := locate(data, key)
		errs = append(errs, &LimitsError{File: path, Row: row, Col: col, Msg: fmt.Sprintf(format, args...)})
	}
	set := func(key string) {
		row, col := locate(data, key)
		w := path
		if row > 0 {
			w = fmt.Sprintf("%s:%d:%d", path, row, col)
		}
		l.setFrom(key, FromFile, w)
	}
	if f.Mode != nil {
		set("mode")
		if m := Mode(*f.Mode); slices.Contains(modes, m) {
			l.Mode = m
		} else {
			bad("mode", "mode = %q is not a mode: write %s", *f.Mode, quotedModes())
		}
	}
	if f.Never != nil {
		set("never")
		for _, p := range *f.Never {
			abs, why := neverPath(p, home)
			if why != "" {
				bad("never", "never: %q %s", p, why)
				continue
			}
			if !slices.Contains(l.Never, abs) {
				l.Never = append(l.Never, abs)
				l.NeverAsWritten = append(l.NeverAsWritten, p)
			}
		}
	}
	lists := func(table string, in *listsFile, out *Lists, what string) {
		if in == nil {
			return
		}
		for _, k := range []struct {
			key string
			in  *[]string
			out *[]string
		}{{"allow", in.Allow, &out.Allow}, {"deny", in.Deny, &out.Deny}} {
			if k.in == nil {
				continue
			}
			key := table + "." + k.key
			set(key)
			for _, e := range *k.in {
				if strings.TrimSpace(e) == "" || strings.TrimSpace(e) != e {
					bad(key, "[%s] %s: %q is not %s: write it without spaces", table, k.key, e, what)
					continue
				}
				if !slices.Contains(*k.out, e) {
					*k.out = append(*k.out, e)
				}
			}
		}
	}
	lists("network", f.Network, &l.Network, "a host")
	lists("executors", f.Executors, &l.Executors, "an executor name")
	if p := f.Priority; p != nil {
		for _, k := range []struct {
			key string
			in  *string
			out *string
		}{{"priority.cpu", p.CPU, &l.Priority.CPU}, {"priority.io", p.IO, &l.Priority.IO}} {
			if k.in == nil {
				continue
			}
			set(k.key)
			if !slices.Contains(priorityValues[k.key], *k.in) {
				bad(k.key, "[priority] %s = %q is not one it takes: write %s", strings.TrimPrefix(k.key, "priority."), *k.in, strings.TrimPrefix(takes[k.key], "a string: "))
				continue
			}
			*k.out = *k.in
		}
		if p.CPUTimeS != nil {
			set("priority.cpu_time_s")
			if n := *p.CPUTimeS; n < 0 || n > maxCPUTimeS {
				bad("priority.cpu_time_s", "[priority] cpu_time_s = %d: it takes %s", n, takes["priority.cpu_time_s"])
			} else {
				l.Priority.CPUTimeS = n
			}
		}
		if p.Conc != nil {
			set("priority.concurrency")
			if n := *p.Conc; n < 1 || n > MaxConcurrency {
				bad("priority.concurrency", "[priority] concurrency = %d: it takes %s", n, takes["priority.concurrency"])
			} else {
				l.Priority.Concurrency = int(n)
			}
		}
	}
	if len(errs) > 0 {
		return Limits{File: path}, errors.Join(errs...)
	}
	return l, nil
}

// setFrom records where the setting key came from (and, from the file,
// where in it: w).
func (l *Limits) setFrom(key string, s Source, w string) {
	if l.from == nil {
		l.from, l.where = map[string]Source{}, map[string]string{}
	}
	l.from[key] = s
	if w != "" {
		l.where[key] = w
	}
}

// neverPath is the never entry p, absolute and clean (~ expanded to
// home), or why it is not one.
func neverPath(p, home string) (string, string) {
	switch {
	case p == "~" || strings.HasPrefix(p, "~/") || strings.HasPrefix(p, `~\`):
		if !filepath.IsAbs(home) {
			return "", "starts with ~ but the home folder is not known"
		}
		p = filepath.Join(home, p[1:])
	case !filepath.IsAbs(p):
		return "", "is not an absolute path: write it from / (or from ~, your home folder)"
	}
	p = filepath.Clean(p)
	switch {
	case p == filepath.Dir(p):
		return "", "would hide the whole file system"
	case filepath.IsAbs(home) && within(filepath.Clean(home), p):
		return "", "would hide your whole home folder, the agent's own folders with it: list the folders inside it instead"
	}
	return p, ""
}

// within reports whether p is dir or lies beneath it, by components.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, string(filepath.Separator))+string(filepath.Separator))
}

// decodeError is the LimitsError of a file go-toml did not decode: each
// unknown key, or the one place it stopped at.
func decodeError(path string, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var errs []error
		for _, e := range strict.Errors {
			row, col := e.Position()
			key := e.Key()
			table := ""
			if len(key) > 1 {
				table = strings.Join(key[:len(key)-1], ".")
			}
			msg := fmt.Sprintf("unknown key %q", strings.Join(key, "."))
			if strings.Contains(e.Error(), "missing table") {
				msg = fmt.Sprintf("unknown table [%s]", strings.Join(key, "."))
			}
			if k, ok := known[table]; ok {
				msg += fmt.Sprintf(" (the limits file takes %s", k)
				if table != "" {
					msg += " in [" + table + "]"
				}
				msg += ")"
			}
			errs = append(errs, &LimitsError{File: path, Row: row, Col: col, Msg: msg})
		}
		return errors.Join(errs...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		key := strings.Join(de.Key(), ".")
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		if t, ok := takes[key]; ok && strings.Contains(msg, "cannot decode") {
			msg = fmt.Sprintf("%s takes %s", key, t)
		}
		return &LimitsError{File: path, Row: row, Col: col, Msg: msg}
	}
	return &LimitsError{File: path, Msg: err.Error()}
}

// locate finds where data sets key (a dotted key: "network.allow"), for
// a message: the row and column of its value, 1-based; 0, 0 when it is
// not found. It reads the usual forms (key = value under [table], and
// table.key = value), not every form TOML has.
func locate(data []byte, key string) (row, col int) {
	table := ""
	for i, line := range strings.Split(string(data), "\n") {
		t := strings.TrimSpace(line)
		switch {
		case t == "" || strings.HasPrefix(t, "#"):
			continue
		case strings.HasPrefix(t, "["):
			name, _, _ := strings.Cut(strings.TrimLeft(t, "["), "]")
			table = strings.TrimSpace(name)
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		var parts []string
		for _, p := range strings.Split(k, ".") {
			parts = append(parts, strings.Trim(strings.TrimSpace(p), `"'`))
		}
		full := strings.Join(parts, ".")
		if table != "" {
			full = table + "." + full
		}
		if full != key {
			continue
		}
		at := len(k) + 1
		return i + 1, at + len(line[at:]) - len(strings.TrimLeft(line[at:], " \t")) + 1
	}
	return 0, 0
}
