package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParseHint(t *testing.T) {
	for _, tc := range []struct {
		hint string
		want Dest
		ok   bool
	}{
		// The hints of the upstream manifests.
		{"nominatim.openstreetmap.org", Dest{Host: "nominatim.openstreetmap.org"}, true},
		{"api.beacondb.net", Dest{Host: "api.beacondb.net"}, true},
		{"ipapi.co", Dest{Host: "ipapi.co"}, true},
		{"127.0.0.1", Dest{Host: "127.0.0.1"}, true},
		{"localhost", Dest{Host: "localhost"}, true},
		{"http://*", Dest{Host: "*"}, true},
		{"https://*", Dest{Host: "*"}, true},
		{"*", Dest{Host: "*"}, true},
		{"maps.googleapis.com", Dest{Host: "maps.googleapis.com"}, true},
		{"vision.googleapis.com", Dest{Host: "vision.googleapis.com"}, true},
		{"api.github.com", Dest{Host: "api.github.com"}, true},
		{"Google People API HTTPS", Dest{}, false},
		{"mode=research", Dest{}, false},
		{"mode=archive", Dest{}, false},
		// The other forms.
		{"127.0.0.1:8080", Dest{Host: "127.0.0.1", Port: 8080}, true},
		{"[::1]:8080", Dest{Host: "::1", Port: 8080}, true},
		{"::1", Dest{Host: "::1"}, true},
		{"[::ffff:127.0.0.1]", Dest{Host: "127.0.0.1"}, true},
		{"*.example.org", Dest{Host: "*.example.org"}, true},
		{"https://api.github.com/repos/*", Dest{Host: "api.github.com"}, true},
		{"http://localhost:8080/x", Dest{Host: "localhost", Port: 8080}, true},
		{"HTTPS://API.GitHub.COM./", Dest{Host: "api.github.com"}, true},
		{"xn--bcher-kva.example", Dest{Host: "xn--bcher-kva.example"}, true},
		{"*:443", Dest{Host: "*", Port: 443}, true},
		{"127.0.0.1:*", Dest{Host: "127.0.0.1"}, true},
		{"github", Dest{}, false},
		{"*.", Dest{}, false},
		{"https://*./", Dest{}, false},
		{"", Dest{}, false},
		{"host.example:0", Dest{}, false},
		{"host.example:70000", Dest{}, false},
		{"user@host.example", Dest{}, false},
		{"https://user@host.example/", Dest{}, false},
		{"[fe80::1%eth0]:80", Dest{}, false},
		{"192.168.1.0/24", Dest{}, false}, // CIDR is the owner's only
	} {
		got, ok := ParseHint(tc.hint)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParseHint(%q) = %+v, %v; want %+v, %v", tc.hint, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseOwnerDest(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Dest
	}{
		{"192.168.1.0/24", Dest{Host: "192.168.1.0/24"}},
		{"192.168.1.7/24:*", Dest{Host: "192.168.1.0/24"}},
		{"10.0.0.0/8:443", Dest{Host: "10.0.0.0/8", Port: 443}},
		{"fc00::/7", Dest{Host: "fc00::/7"}},
		{"[fc00::/7]:443", Dest{Host: "fc00::/7", Port: 443}},
		{"*:25", Dest{Host: "*", Port: 25}},
		{"*.dropbox.com", Dest{Host: "*.dropbox.com"}},
		{"api.telegram.org", Dest{Host: "api.telegram.org"}},
		{"127.0.0.1:*", Dest{Host: "127.0.0.1"}},
	} {
		got, err := ParseOwnerDest(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseOwnerDest(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		// String is what an owner would write, and reads back the same.
		if back, err := ParseOwnerDest(got.String()); err != nil || back != got {
			t.Errorf("ParseOwnerDest(%q.String() = %q) = %+v, %v", tc.in, got.String(), back, err)
		}
	}
	for _, bad := range []string{"192.168.1.0/33", "10.0.0.0/8:x", "nas", "a b.example", "*:0", "[fc00::/7"} {
		_, err := ParseOwnerDest(bad)
		if err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseOwnerDest(%q) = %v; want an error naming the entry", bad, err)
		}
	}
}

func TestNonPublic(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"127.0.0.1", "loopback"},
		{"127.1.2.3", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"10.0.0.1", "private"},
		{"172.16.5.4", "private"},
		{"172.32.0.1", ""},
		{"192.168.1.10", "private"},
		{"fd12::1", "private"},
		{"169.254.169.254", "metadata"},
		{"169.254.1.1", "link-local"},
		{"fe80::1", "link-local"},
		{"fd00:ec2::254", "metadata"},
		{"100.64.0.1", "CGNAT/tailnet"},
		{"100.127.255.254", "CGNAT/tailnet"},
		{"100.128.0.1", ""},
		{"224.0.0.251", "multicast"},
		{"ff02::1", "multicast"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "unspecified"},
		{"::", "unspecified"},
		{"255.255.255.255", "broadcast"},
		{"240.0.0.1", "reserved"},
		{"198.18.0.1", "benchmark"},
		{"64:ff9b::7f00:1", "loopback"},   // NAT64 of 127.0.0.1
		{"64:ff9b::a00:1", "private"},     // NAT64 of 10.0.0.1
		{"2002:a9fe:a9fe::1", "metadata"}, // 6to4 of 169.254.169.254
		{"64:ff9b::808:808", ""},          // NAT64 of 8.8.8.8
		{"2002:808:808::1", ""},           // 6to4 of 8.8.8.8
		{"8.8.8.8", ""},
		{"2606:4700::1111", ""},
		{"192.0.2.1", ""}, // documentation ranges are public on purpose
		{"198.51.100.7", ""},
		{"203.0.113.9", ""},
		{"2001:db8::1", ""},
	} {
		if got := NonPublic(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("NonPublic(%s) = %q; want %q", tc.addr, got, tc.want)
		}
	}
}

// upstream is the Egress of the upstream manifests' hints together, with
// the default deny list.
func upstream() *Egress {
	e := &Egress{Deny: DefaultDeny()}
	for _, h := range []string{"nominatim.openstreetmap.org", "api.beacondb.net", "ipapi.co", "127.0.0.1",
		"localhost", "maps.googleapis.com", "Google People API HTTPS", "mode=research"} {
		e.AddHint("network:http", h)
	}
	return e
}

func TestAddHintIgnoresProse(t *testing.T) {
	e := upstream()
	if got := strings.Join(e.Ignored, "|"); got != "Google People API HTTPS|mode=research" {
		t.Errorf("Ignored = %q", got)
	}
	for _, d := range e.Allow {
		if d.Host == "*" {
			t.Errorf("prose widened Allow to %+v", d)
		}
	}
	if e.Allow[0].Why != "network:http hint nominatim.openstreetmap.org" {
		t.Errorf("Why = %q", e.Allow[0].Why)
	}
}

func refusal(t *testing.T, err error) *Refusal {
	t.Helper()
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("error %v is not a *Refusal", err)
	}
	return r
}

func TestCheckName(t *testing.T) {
	named := upstream()
	wild := &Egress{Deny: DefaultDeny(), Allow: []Dest{{Host: "*"}, {Host: "127.0.0.1", Port: 8080}, {Host: "*.example.org"}}}
	owner := &Egress{Deny: append(DefaultDeny(), Dest{Host: "203.0.113.0/24", Why: "owner deny"}),
		Allow: []Dest{{Host: "192.168.1.0/24"}, {Host: "*"}}}
	for _, tc := range []struct {
		e    *Egress
		host string
		port uint16
		list string // "" for allowed
	}{
		{named, "nominatim.openstreetmap.org", 443, ""},
		{named, "Nominatim.OpenStreetMap.org.", 443, ""},
		{named, "api.beacondb.net", 443, ""},
		{named, "evil.openstreetmap.org", 443, "allowlist"},
		{named, "127.0.0.1", 8765, ""}, // the OCR server, any port
		{named, "127.0.0.2", 8765, "allowlist"},
		{named, "::1", 8765, "allowlist"},
		{named, "localhost", 8765, ""},
		{named, "api.github.com", 443, "allowlist"},
		{named, "127.0.0.1", 25, "denylist"}, // deny wins over a literal
		{named, "ipapi.co", 587, "denylist"},
		{wild, "example.com", 443, ""},
		{wild, "example.com", 25, "denylist"}, // deny wins over *
		{wild, "smtp.example.com", 465, "denylist"},
		{wild, "irc.example.net", 6697, "denylist"},
		{wild, "www.dropbox.com", 443, "denylist"},
		{wild, "dropbox.com", 443, "denylist"},
		{wild, "p01-caldav.icloud.com", 443, "denylist"},
		{wild, "notdropbox.com", 443, ""},
		{wild, "8.8.8.8", 443, ""},                 // a public literal matches *
		{wild, "127.0.0.1", 80, "allowlist"},       // * never reaches loopback
		{wild, "127.0.0.1", 8080, ""},              // ... the literal does
		{wild, "169.254.169.254", 80, "allowlist"}, // nor metadata
		{wild, "10.0.0.1", 80, "allowlist"},        // nor private
		{wild, "::ffff:10.0.0.1", 80, "allowlist"}, // mapped
		{wild, "64:ff9b::a00:1", 80, "allowlist"},  // NAT64
		{wild, "a.b.example.org", 443, ""},
		{owner, "192.168.1.10", 80, ""},
		{owner, "192.168.2.10", 80, "allowlist"},
		{owner, "203.0.113.9", 443, "denylist"},
	} {
		d, err := tc.e.CheckName(tc.host, tc.port)
		switch {
		case tc.list == "" && err != nil:
			t.Errorf("CheckName(%s, %d) = %v; want allowed", tc.host, tc.port, err)
		case tc.list == "" && d.Host == "":
			t.Errorf("CheckName(%s, %d) allowed by an empty pattern", tc.host, tc.port)
		case tc.list != "" && err == nil:
			t.Errorf("CheckName(%s, %d) allowed by %+v; want refused by the %s", tc.host, tc.port, d, tc.list)
		case tc.list != "":
			if r := refusal(t, err); r.List != tc.list {
				t.Errorf("CheckName(%s, %d) refused by %s (%v); want %s", tc.host, tc.port, r.List, err, tc.list)
			}
		}
	}
}

func TestCheckAddr(t *testing.T) {
	e := &Egress{Deny: append(DefaultDeny(), Dest{Host: "198.51.100.0/24"}),
		Allow: []Dest{{Host: "*"}, {Host: "nas.lan"}, {Host: "localhost"}, {Host: "127.0.0.1"}, {Host: "192.168.1.0/24", Port: 445}}}
	star, nas, lh, lit := e.Allow[0], e.Allow[1], e.Allow[2], e.Allow[3]
	for _, tc := range []struct {
		host string
		port uint16
		addr string
		by   Dest
		list string
	}{
		{"example.com", 443, "93.184.215.14", star, ""},
		{"example.com", 443, "127.0.0.1", star, "address"},       // rebinding
		{"example.com", 443, "169.254.169.254", star, "address"}, // metadata
		{"example.com", 443, "::ffff:10.1.2.3", star, "address"}, // mapped
		{"nas.lan", 80, "192.168.1.10", nas, "address"},          // exact name, private address
		{"nas.lan", 445, "192.168.1.10", nas, ""},                // ... unless an owner CIDR vouches
		{"nas.lan", 80, "192.168.1.10", nas, "address"},          // ... for that port only
		{"localhost", 631, "127.0.0.1", lh, ""},
		{"localhost", 631, "::1", lh, ""},
		{"localhost", 631, "10.0.0.1", lh, "address"},
		{"127.0.0.1", 631, "127.0.0.1", lit, ""},
		{"example.com", 443, "198.51.100.7", star, "denylist"},
	} {
		err := e.CheckAddr(tc.host, tc.port, netip.MustParseAddr(tc.addr), tc.by)
		switch {
		case tc.list == "" && err != nil:
			t.Errorf("CheckAddr(%s:%d → %s) = %v; want allowed", tc.host, tc.port, tc.addr, err)
		case tc.list != "" && err == nil:
			t.Errorf("CheckAddr(%s:%d → %s) allowed; want refused by %s", tc.host, tc.port, tc.addr, tc.list)
		case tc.list != "":
			if r := refusal(t, err); r.List != tc.list {
				t.Errorf("CheckAddr(%s:%d → %s) refused by %s; want %s", tc.host, tc.port, tc.addr, r.List, tc.list)
			}
		}
	}
}

// TestCheckNamePrefersTheHostItself: with "*" listed before
// "localhost", localhost is allowed by "localhost", so it reaches
// loopback; a wildcard alone does not.
func TestCheckNamePrefersTheHostItself(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		allow []Dest
		ok    bool
	}{
		{[]Dest{{Host: "*"}, {Host: "localhost"}}, true},
		{[]Dest{{Host: "localhost"}, {Host: "*"}}, true},
		{[]Dest{{Host: "*"}}, false},
		{[]Dest{{Host: "*"}, {Host: "localhost", Port: 80}}, false},
	} {
		e := &Egress{Allow: tc.allow}
		by, err := e.CheckName("localhost", 631)
		if err == nil {
			err = e.CheckAddr("localhost", 631, lo, by)
		}
		if (err == nil) != tc.ok {
			t.Errorf("allow %v: localhost:631 → 127.0.0.1: %v; want allowed %v", tc.allow, err, tc.ok)
		}
	}
}

func TestRefusalSaysWhatToDo(t *testing.T) {
	e := upstream()
	_, err := e.CheckName("api.github.com", 443)
	if want := "api.github.com:443 is not named by the executor's manifest network hints; the device owner can allow it with [network] allow in limits.toml (or METNOS_NET_ALLOW)"; !strings.Contains(err.Error(), want) {
		t.Errorf("got %q; want it to contain %q", err, want)
	}
	if _, err := e.CheckName("10.0.0.1", 8080); err == nil || !strings.Contains(err.Error(), "10.0.0.1:8080 is not named by the executor's manifest network hints: it is a private address, which a wildcard hint never reaches") {
		t.Errorf("a loopback literal under a wildcard: %v", err)
	}
	_, err = e.CheckName("ipapi.co", 25)
	if want := "ipapi.co:25 is on the deny list (default deny: mail port)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v; want it to contain %q", err, want)
	}
	by, _ := e.CheckName("ipapi.co", 443)
	err = e.CheckAddr("ipapi.co", 443, netip.MustParseAddr("127.0.0.1"), by)
	if want := "ipapi.co:443 resolves to 127.0.0.1 (loopback): a name reaches local addresses only when a hint names the address literally"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v; want it to contain %q", err, want)
	}
}

// TestCheckAddrThisDevice: a wildcard reaches neither this device's own
// addresses nor the networks its interfaces are on, even public ones
// (a VPS's address, a home LAN's global IPv6 prefix); a hint naming the
// address literally or an owner CIDR does.
func TestCheckAddrThisDevice(t *testing.T) {
	local := []netip.Prefix{netip.MustParsePrefix("203.0.113.5/32"), netip.MustParsePrefix("2001:db8:1::/64")}
	e := &Egress{Allow: []Dest{{Host: "*"}}, Local: local}
	by, err := e.CheckName("nas.example", 443)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"203.0.113.5", "2001:db8:1::42"} {
		err := e.CheckAddr("nas.example", 443, netip.MustParseAddr(a), by)
		if err == nil || !strings.Contains(err.Error(), "this device's own network") {
			t.Errorf("%s under *: %v, want refused as this device's own network", a, err)
		}
	}
	if err := e.CheckAddr("example.org", 443, netip.MustParseAddr("203.0.113.6"), by); err != nil {
		t.Errorf("another public address: %v", err)
	}
	lit := &Egress{Allow: []Dest{{Host: "203.0.113.5"}, {Host: "2001:db8:1::/64"}}, Local: local}
	for _, a := range []string{"203.0.113.5", "2001:db8:1::42"} {
		by, err := lit.CheckName(a, 443)
		if err != nil {
			t.Fatalf("%s named: %v", a, err)
		}
		if err := lit.CheckAddr(a, 443, netip.MustParseAddr(a), by); err != nil {
			t.Errorf("%s named literally or by an owner CIDR: %v", a, err)
		}
	}
}

// TestDenyHoldsForEmbeddedIPv4: a denied IPv4 range is denied in its
// NAT64 and 6to4 forms too, as a literal and as a DNS answer.
func TestDenyHoldsForEmbeddedIPv4(t *testing.T) {
	e := &Egress{Allow: []Dest{{Host: "*"}}, Deny: []Dest{{Host: "203.0.113.0/24"}}}
	for _, a := range []string{"203.0.113.5", "64:ff9b::cb00:7105", "2002:cb00:7105::1"} {
		if _, err := e.CheckName(a, 443); err == nil {
			t.Errorf("literal %s: allowed, want denied", a)
		}
		by, _ := e.CheckName("example.org", 443)
		if err := e.CheckAddr("example.org", 443, netip.MustParseAddr(a), by); err == nil {
			t.Errorf("answer %s: allowed, want denied", a)
		}
	}
	if _, err := e.CheckName("64:ff9b::c633:6405", 443); err != nil {
		t.Errorf("a NAT64 address outside the range: %v", err)
	}
}
