package policy

import (
	"reflect"
	"strings"
	"testing"
)

// TestDeriveEgress: network:* capabilities narrow the network to the
// destinations their hints name (upstream get_places' and find_urls'
// blocks), prose hints allow nothing and are kept to be reported, the
// owner's allow list joins them, and the default and owner deny lists
// sit on top; autonomy full still opens the whole network.
func TestDeriveEgress(t *testing.T) {
	h, _ := testHost(t)
	h.NetAllow = []Dest{{Host: "192.168.1.0/24", Why: "owner METNOS_NET_ALLOW"}}
	h.NetDeny = []Dest{{Host: "*.evil.example", Why: "owner METNOS_NET_DENY"}}
	in := DeriveInput{Host: h, Manifest: manifestOf("", []Capability{
		{Name: "network:http", Hints: []string{"maps.googleapis.com", "127.0.0.1", "localhost"}},
		{Name: "network:http", Hints: []string{"https://*", "mode=research"}},
		{Name: "network:sites", Hints: []string{"Google People API HTTPS"}},
	})}
	p, err := Derive(in)
	if err != nil {
		t.Fatal(err)
	}
	if p.Network || p.Egress == nil {
		t.Fatalf("Network %v, Egress %v: want the network narrowed", p.Network, p.Egress)
	}
	var allow []string
	for _, d := range p.Egress.Allow {
		allow = append(allow, d.String())
	}
	if want := []string{"maps.googleapis.com", "127.0.0.1", "localhost", "*", "192.168.1.0/24"}; !reflect.DeepEqual(allow, want) {
		t.Errorf("allow %v, want %v", allow, want)
	}
	if want := []string{"mode=research", "Google People API HTTPS"}; !reflect.DeepEqual(p.Egress.Ignored, want) {
		t.Errorf("ignored %v, want %v", p.Egress.Ignored, want)
	}
	if got := p.Egress.Allow[0].Why; got != "network:http hint maps.googleapis.com" {
		t.Errorf("why %q", got)
	}
	deny := map[string]bool{}
	for _, d := range p.Egress.Deny {
		deny[d.String()] = true
	}
	for _, want := range []string{"*:25", "*:465", "*:587", "*:6667", "*:6697", "*.dropbox.com", "*.evil.example"} {
		if !deny[want] {
			t.Errorf("deny list %v lacks %s", p.Egress.Deny, want)
		}
	}
	// What it decides, as the proxy asks.
	for _, c := range []struct {
		host string
		port uint16
		ok   bool
	}{
		{"maps.googleapis.com", 443, true},
		{"example.org", 443, true},      // https://*: a public name
		{"mail.example.org", 25, false}, // mail port, whatever allows it
		{"a.evil.example", 443, false},  // the owner's deny wins over *
		{"10.0.0.1", 80, false},         // private, not named
		{"192.168.1.7", 8080, true},     // the owner's range
		{"127.0.0.1", 8080, true},       // named literally
	} {
		_, err := p.Egress.CheckName(c.host, c.port)
		if (err == nil) != c.ok {
			t.Errorf("%s:%d: %v, want allowed %v", c.host, c.port, err, c.ok)
		}
	}

	// A network capability without a hint allows only the owner's list.
	in.Manifest = manifestOf("", []Capability{{Name: "network:http"}})
	if p, err = Derive(in); err != nil || p.Egress == nil || len(p.Egress.Allow) != 1 || p.Egress.Allow[0].Host != "192.168.1.0/24" {
		t.Errorf("no hint: %v %+v", err, p.Egress)
	}
	// No network capability: the network stays cut, no proxy.
	in.Manifest = manifestOf("", []Capability{{Name: "compute:pure"}})
	if p, err = Derive(in); err != nil || p.Network || p.Egress != nil {
		t.Errorf("no network capability: %v network %v egress %+v", err, p.Network, p.Egress)
	}
	// Autonomy full: the whole network, no narrowing.
	in.Manifest = manifestOf("", []Capability{{Name: "network:http", Hints: []string{"api.github.com"}}})
	in.Autonomy = AutonomyFull
	if p, err = Derive(in); err != nil || !p.Network || p.Egress != nil {
		t.Errorf("autonomy full: %v network %v egress %+v", err, p.Network, p.Egress)
	}
}

// TestProfileAllowNet: exec's --allow-net narrows supervised and
// readonly runs, and contradicts the profiles with the network open or
// cut.
func TestProfileAllowNet(t *testing.T) {
	h, _ := testHost(t)
	allow := []Dest{{Host: "pypi.org"}}
	p, err := ForProfile(ProfileInput{Profile: ProfileSupervised, AllowNet: allow, Host: h})
	if err != nil || p.Network || p.Egress == nil || len(p.Egress.Allow) != 1 || len(p.Egress.Deny) == 0 {
		t.Fatalf("supervised --allow-net: %v network %v egress %+v", err, p.Network, p.Egress)
	}
	for _, c := range []ProfileInput{
		{Profile: ProfileSupervised, Network: true, AllowNet: allow, Host: h},
		{Profile: ProfileFull, AllowNet: allow, Host: h},
		{Profile: ProfileFullFSNoNet, AllowNet: allow, Host: h},
	} {
		if _, err := ForProfile(c); err == nil || !strings.Contains(err.Error(), "--allow-net") {
			t.Errorf("%s (net %v) with --allow-net: %v, want an error naming --allow-net", c.Profile, c.Network, err)
		}
	}
}
