package policy

import (
	"slices"
	"strings"
)

// Capability is one [[capabilities]] entry of an executor manifest:
// a name such as "fs:read", "fs:write" or "network:http", and the
// glob-style hints that say where it applies ("~/notes/**").
type Capability struct {
	Name  string   `toml:"name" json:"name"`
	Hints []string `toml:"hint" json:"hint"`
}

// capability is a Capability with its name read: family is the text
// before the first ':' or '.', mode the text after the first ':' (""
// when there is none).
type capability struct {
	Capability
	family, mode string
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
	caps []capability
	min  Level
}

// ParseManifest reads a manifest's [[capabilities]] and its [placement]
// min_sandbox (any word [ParseLevel] accepts; "" is none). It fails only
// on an unknown min_sandbox word; capability names it does not know
// grant nothing.
func ParseManifest(caps []Capability, minSandbox string) (Manifest, error) {
	min, err := ParseLevel(minSandbox)
	if err != nil {
		return Manifest{}, err
	}
	m := Manifest{min: min}
	for _, c := range caps {
		family, mode := capabilityFamilyMode(c.Name)
		c.Hints = slices.Clone(c.Hints)
		m.caps = append(m.caps, capability{Capability: c, family: family, mode: mode})
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
