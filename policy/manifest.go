package policy

import (
	"fmt"
	"slices"
	"strings"
)

// Capability is one [[capabilities]] entry of an executor manifest:
// a name such as "fs:read", "fs:write" or "network:http", and the
// glob-style hints that say where it applies ("~/notes/**").
type Capability struct {
	Name  string   `toml:"name" json:"name"`
	Hints []string `toml:"hint" json:"hint"`
	// When is the capability's condition on the invocation's
	// arguments, as declared (nil: always in force). The forms are
	// Metnos's: {arg, values}, {arg, nonempty = true} and {arg,
	// any_item_has}; a capability whose clause does not hold is not in
	// force, and one whose clause has another form is refused.
	When map[string]any `toml:"when" json:"when,omitempty"`
}

// capability is a Capability with its name read: family is the text
// before the first ':' or '.', mode the text after the first ':' (""
// when there is none).
type capability struct {
	Capability
	family, mode string
	// when is the parsed When clause (nil: none); whenErr says why it
	// could not be read.
	when    *when
	whenErr error
}

// when is a capability's condition on one argument: exactly one of
// values, nonempty and itemHas is set.
type when struct {
	arg      string
	values   []string
	nonempty bool
	itemHas  string
}

// parseWhen reads a when clause in one of Metnos's three forms.
func parseWhen(w map[string]any) (*when, error) {
	if w == nil {
		return nil, nil
	}
	var keys []string
	for k := range w {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	form := strings.Join(keys, "+")
	arg, _ := w["arg"].(string)
	if strings.TrimSpace(arg) == "" {
		return nil, fmt.Errorf("its when clause (%s) names no argument (want arg with values, nonempty or any_item_has)", form)
	}
	switch form {
	case "arg+values":
		vs, _ := w["values"].([]any)
		out := &when{arg: arg}
		for _, v := range vs {
			s, ok := v.(string)
			if !ok || strings.TrimSpace(s) == "" {
				return nil, fmt.Errorf("its when clause's values must be non-empty strings, not %v", w["values"])
			}
			out.values = append(out.values, s)
		}
		if len(out.values) == 0 {
			return nil, fmt.Errorf("its when clause's values must be a non-empty list of strings, not %v", w["values"])
		}
		return out, nil
	case "arg+nonempty":
		if b, _ := w["nonempty"].(bool); !b {
			return nil, fmt.Errorf("its when clause's nonempty must be true, not %v", w["nonempty"])
		}
		return &when{arg: arg, nonempty: true}, nil
	case "any_item_has+arg":
		k, _ := w["any_item_has"].(string)
		if strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("its when clause's any_item_has must be a non-empty string, not %v", w["any_item_has"])
		}
		return &when{arg: arg, itemHas: k}, nil
	}
	return nil, fmt.Errorf("its when clause has the form %s, which this agent does not know (want arg with values, nonempty or any_item_has)", form)
}

// holds reports whether the clause holds for the argument's value
// (the invocation's, else the schema's default; nil when neither).
func (w *when) holds(v any) bool {
	switch {
	case w.values != nil:
		s, ok := v.(string)
		return ok && slices.Contains(w.values, s)
	case w.nonempty:
		switch x := v.(type) {
		case string:
			return x != ""
		case []any:
			return len(x) > 0
		case map[string]any:
			return len(x) > 0
		case nil:
			return false
		case bool:
			return x
		case float64:
			return x != 0
		case int64:
			return x != 0
		}
		return true
	default:
		items, _ := v.([]any)
		for _, it := range items {
			if m, ok := it.(map[string]any); ok && m[w.itemHas] != nil {
				return true
			}
		}
		return false
	}
}

// network reports whether the capability opens the network: its family
// is net or network.
func (c capability) network() bool { return c.family == "net" || c.family == "network" }

// fs reports whether the capability grants files: its family is fs.
func (c capability) fs() bool { return c.family == "fs" }

// writes reports whether the capability grants files writable: family
// fs and mode exactly "write" (so "fs.write" is read-only).
func (c capability) writes() bool { return c.fs() && c.mode == "write" }

// Manifest is what the sandbox policy reads of an executor's manifest:
// its capabilities and its [placement] min_sandbox, read once by
// [ParseManifest]. The zero Manifest has no capability and no minimum.
type Manifest struct {
	caps     []capability
	min      Level
	defaults map[string]any
}

// ParseManifest reads a manifest's [[capabilities]] and its [placement]
// min_sandbox (any word [ParseLevel] accepts; "" is none). It fails only
// on an unknown min_sandbox word; a capability, a hint or a when clause
// the capability table does not know is refused by [Derive], for the
// invocation, rather than here.
func ParseManifest(caps []Capability, minSandbox string) (Manifest, error) {
	min, err := ParseLevel(minSandbox)
	if err != nil {
		return Manifest{}, err
	}
	m := Manifest{min: min}
	for _, c := range caps {
		family, mode := capabilityFamilyMode(c.Name)
		c.Hints = slices.Clone(c.Hints)
		w, err := parseWhen(c.When)
		m.caps = append(m.caps, capability{Capability: c, family: family, mode: mode, when: w, whenErr: err})
	}
	return m, nil
}

// Capabilities returns a copy of the manifest's capabilities, in order.
func (m Manifest) Capabilities() []Capability {
	var out []Capability
	for _, c := range m.caps {
		c.Hints = slices.Clone(c.Hints)
		out = append(out, c.Capability)
	}
	return out
}

// WithArgDefaults returns the manifest with the schema defaults of its
// arguments ([args.properties.NAME] default), which when clauses read
// for an argument the invocation leaves out.
func (m Manifest) WithArgDefaults(defaults map[string]any) Manifest {
	m.defaults = defaults
	return m
}

// inForce reports whether c's when clause holds for the invocation's
// arguments args (the decoded JSON object; anything else has no named
// argument).
func (m Manifest) inForce(c capability, args map[string]any) bool {
	if c.when == nil {
		return true
	}
	v, ok := args[c.when.arg]
	if !ok {
		v = m.defaults[c.when.arg]
	}
	return c.when.holds(v)
}

// MinSandbox is the manifest's minimum sandbox.
func (m Manifest) MinSandbox() Level { return m.min }

// Writes reports whether the manifest declares fs:write: a capability
// of family fs whose mode is exactly "write".
func (m Manifest) Writes() bool { return slices.ContainsFunc(m.caps, capability.writes) }

// Network reports whether the manifest asks for the network: a
// capability of family net or network.
func (m Manifest) Network() bool { return slices.ContainsFunc(m.caps, capability.network) }

// capabilityFamilyMode splits a capability name into its family, the
// text before the first ':' or '.', and its mode, the text after the
// first ':' ("" when there is none).
func capabilityFamilyMode(name string) (family, mode string) {
	family = name
	if i := strings.IndexAny(name, ":."); i >= 0 {
		family = name[:i]
	}
	if _, m, ok := strings.Cut(name, ":"); ok {
		mode = m
	}
	return family, mode
}
