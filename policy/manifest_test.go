package policy

import (
	"slices"
	"testing"
)

// TestParseManifest: the facts the agent reads of a manifest (does it
// write, does it use the network, its minimum) come from one reading of
// the capability names, the one Derive grants by.
func TestParseManifest(t *testing.T) {
	for _, c := range []struct {
		names          []string
		writes, netted bool
	}{
		{nil, false, false},
		{[]string{"fs:read"}, false, false},
		{[]string{"fs:write"}, true, false},
		{[]string{"fs.write"}, false, false},
		{[]string{"fs:write:more"}, false, false},
		{[]string{"fsx:write"}, false, false},
		{[]string{"fs.x:write"}, true, false},
		{[]string{"network:http"}, false, true},
		{[]string{"net.fetch", "fs:read"}, false, true},
		{[]string{"netx:http"}, false, false},
		{[]string{"code:exec", "fs:write", "net"}, true, true},
	} {
		var caps []Capability
		for _, n := range c.names {
			caps = append(caps, Capability{Name: n, Hints: []string{"~/x/**"}})
		}
		m, err := ParseManifest(caps, "job-object")
		if err != nil {
			t.Fatalf("%v: %v", c.names, err)
		}
		if m.Writes() != c.writes || m.Network() != c.netted {
			t.Errorf("%v: Writes %v Network %v, want %v %v", c.names, m.Writes(), m.Network(), c.writes, c.netted)
		}
		if m.MinSandbox() != LevelContained {
			t.Errorf("%v: MinSandbox %v", c.names, m.MinSandbox())
		}
		if got := m.Capabilities(); !slices.EqualFunc(got, caps, func(a, b Capability) bool {
			return a.Name == b.Name && slices.Equal(a.Hints, b.Hints)
		}) {
			t.Errorf("%v: Capabilities %v", c.names, got)
		}
	}
	if _, err := ParseManifest(nil, "chroot"); err == nil {
		t.Errorf("unknown min_sandbox accepted")
	}
	var zero Manifest
	if zero.Writes() || zero.Network() || zero.MinSandbox() != LevelNone || zero.Capabilities() != nil {
		t.Errorf("zero Manifest: %+v", zero)
	}
}
