package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Egress is the network a run reaches through the agent's per-run proxy
// (docs/protocol.md §12.4): the destinations its signed manifest's
// network capabilities name, narrowed by the deny lists. A Policy with
// Egress set and Network false has no network of its own; the proxy is
// its only way out.
//
// The proxy decides in two steps: [Egress.CheckName] before it resolves
// a name, [Egress.CheckAddr] for every address it is about to connect
// to. Both are pure: no I/O, no DNS.
type Egress struct {
	// Allow are the destinations the manifest's network:* hints name,
	// then the device owner's own allow list.
	Allow []Dest `json:"allow,omitempty"`
	// Deny is the default deny list (seed 001 §6) and the owner's; a
	// destination it matches is refused whatever Allow says.
	Deny []Dest `json:"deny,omitempty"`
	// Local are this device's own addresses and the networks its
	// interfaces are on (a LAN's IPv6 prefix, a VPS's public address):
	// CheckAddr takes them for non-public ("this device's network"),
	// so that a wildcard reaches neither the device's own services nor
	// its neighbours by a global address. The proxy fills it; it is not
	// part of the Policy's encoding.
	Local []netip.Prefix `json:"-"`
	// Ignored are the hints that name no destination (prose such as
	// "Google People API HTTPS"): they widen nothing, and the result's
	// reason names them.
	Ignored []string `json:"ignored,omitempty"`
}

// Dest is one destination pattern of an [Egress] list.
type Dest struct {
	// Host is a lower-case DNS name ("api.github.com"), a wildcard
	// label ("*.example.org": any name beneath example.org, not itself),
	// "*" (any public host), an IP literal ("127.0.0.1", "::1"), or, in
	// the owner's lists and the default deny list only, a CIDR prefix
	// ("192.168.1.0/24").
	Host string `json:"host"`
	// Port is the one port allowed or denied; 0 means any.
	Port uint16 `json:"port,omitempty"`
	// Why names where the pattern came from: "network:http hint
	// api.github.com", "default deny (mail)", "owner allow".
	Why string `json:"why,omitempty"`
}

// String returns the pattern as an owner would write it: "api.github.com",
// "127.0.0.1:8080", "[::1]:8080", "*:25", "192.168.1.0/24".
func (d Dest) String() string {
	if d.Port == 0 {
		return d.Host
	}
	return joinHostPort(d.Host, d.Port)
}

// AddHint adds one hint of the network capability capName: to Allow
// when [ParseHint] reads a destination in it, to Ignored otherwise.
func (e *Egress) AddHint(capName, hint string) {
	d, ok := ParseHint(hint)
	if !ok {
		e.Ignored = append(e.Ignored, hint)
		return
	}
	d.Why = capName + " hint " + hint
	e.Allow = append(e.Allow, d)
}

// ParseHint reads the destination a network:* capability hint names, or
// reports false when the hint names none (prose such as "Google People
// API HTTPS" or "mode=research": anything with a space or '=', or a
// host with no dot that is not localhost, an IP literal or "*").
//
// The forms are an exact host ("api.github.com"), a host and port
// ("127.0.0.1:8080", "[::1]:8080", "*:443"), an IP literal, "localhost",
// a wildcard label ("*.example.org"), "*", and URLs ("http://*",
// "https://host/path*", "http://host:8080/x"): the scheme and path are
// dropped, and the port is kept only when written, so a host without a
// port means any port. Hosts are lower-cased and lose a trailing dot;
// IDN names are kept as written (lower-cased), punycode or not.
func ParseHint(hint string) (Dest, bool) {
	d, err := parseDest(hint, false)
	return d, err == nil
}

// ParseOwnerDest reads one entry of the device owner's allow or deny
// list (limits.toml's [network] allow and deny, METNOS_NET_ALLOW,
// METNOS_NET_DENY, exec --allow-net): the forms of [ParseHint], plus CIDR prefixes
// ("192.168.1.0/24", "192.168.1.0/24:*", "[fc00::/7]:443") and "*:25"
// (any host, port 25). The error names the entry.
func ParseOwnerDest(s string) (Dest, error) {
	d, err := parseDest(s, true)
	if err != nil {
		return Dest{}, fmt.Errorf("network entry %q: %w", s, err)
	}
	return d, nil
}

func parseDest(s string, owner bool) (Dest, error) {
	if s == "" || strings.ContainsAny(s, " \t\r\n=\"'") {
		return Dest{}, fmt.Errorf("not a destination (want a host, host:port, IP, CIDR or URL)")
	}
	rest := s
	if scheme, after, ok := strings.Cut(s, "://"); ok {
		if scheme == "" || strings.Trim(strings.ToLower(scheme), "abcdefghijklmnopqrstuvwxyz0123456789+.-") != "" {
			return Dest{}, fmt.Errorf("bad URL scheme %q", scheme)
		}
		rest = after
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			rest = rest[:i]
		}
	} else if d, ok, err := parseCIDR(s); ok && err == nil {
		if !owner {
			return Dest{}, fmt.Errorf("a CIDR prefix is for the device owner's lists only")
		}
		return d, nil
	} else if owner && ok {
		return Dest{}, err
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if strings.Contains(rest, "@") {
		return Dest{}, fmt.Errorf("user information (@) is not a destination")
	}
	host, portStr, err := splitHostPort(rest)
	if err != nil {
		return Dest{}, err
	}
	var port uint16
	if portStr != "" && portStr != "*" {
		if port, err = parsePort(portStr); err != nil {
			return Dest{}, err
		}
	}
	host, err = normalizePattern(host)
	if err != nil {
		return Dest{}, err
	}
	return Dest{Host: host, Port: port}, nil
}

// parseCIDR reads "a.b.c.d/n", "a.b.c.d/n:port", "x::/n" and
// "[x::/n]:port"; ok is false when s has no '/'.
func parseCIDR(s string) (Dest, bool, error) {
	if !strings.Contains(s, "/") {
		return Dest{}, false, nil
	}
	pfx, port := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return Dest{}, true, fmt.Errorf("missing ']'")
		}
		pfx = s[1:end]
		if r := s[end+1:]; r != "" {
			if !strings.HasPrefix(r, ":") {
				return Dest{}, true, fmt.Errorf("unexpected %q after ']'", r)
			}
			port = r[1:]
		}
	} else if p, err := netip.ParsePrefix(s); err == nil {
		return Dest{Host: p.Masked().String()}, true, nil
	} else if i := strings.LastIndex(s, ":"); i > strings.Index(s, "/") {
		pfx, port = s[:i], s[i+1:]
	}
	p, err := netip.ParsePrefix(pfx)
	if err != nil {
		return Dest{}, true, fmt.Errorf("bad CIDR prefix %q (want 192.168.1.0/24 or [fc00::/7]:443)", pfx)
	}
	d := Dest{Host: p.Masked().String()}
	if port != "" && port != "*" {
		if d.Port, err = parsePort(port); err != nil {
			return Dest{}, true, err
		}
	}
	return d, true, nil
}

// splitHostPort splits "host", "host:port", "[v6]", "[v6]:port" and a
// bare IPv6 literal. The port is "" when none is written.
func splitHostPort(s string) (host, port string, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return "", "", fmt.Errorf("missing ']' in %q", s)
		}
		host, r := s[1:end], s[end+1:]
		if _, err := netip.ParseAddr(host); err != nil || !strings.Contains(host, ":") {
			return "", "", fmt.Errorf("%q in brackets is not an IPv6 address", host)
		}
		if r == "" {
			return host, "", nil
		}
		if !strings.HasPrefix(r, ":") {
			return "", "", fmt.Errorf("unexpected %q after ']'", r)
		}
		return host, r[1:], nil
	}
	switch strings.Count(s, ":") {
	case 0:
		return s, "", nil
	case 1:
		host, port, _ := strings.Cut(s, ":")
		return host, port, nil
	}
	return s, "", nil // a bare IPv6 literal; normalizePattern checks it
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || s[0] == '+' {
		return 0, fmt.Errorf("bad port %q (want 1-65535 or *)", s)
	}
	return uint16(n), nil
}

// normalizePattern lower-cases a host pattern, drops a trailing dot and
// checks its form: "*", "*.name", an IP literal, "localhost", or a DNS
// name with a dot.
func normalizePattern(h string) (string, error) {
	if strings.HasSuffix(h, "*.") {
		return "", fmt.Errorf("%q is not a host pattern", h)
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "*" {
		return h, nil
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return "", fmt.Errorf("IP literal %q has a zone", h)
		}
		return a.Unmap().String(), nil
	}
	if strings.Contains(h, ":") {
		return "", fmt.Errorf("%q is not a host", h)
	}
	name := strings.TrimPrefix(h, "*.")
	if !validName(name, true) {
		return "", fmt.Errorf("%q is not a host name", h)
	}
	if name != h {
		return h, nil // "*.org" is allowed: one label beneath the wildcard
	}
	if h != "localhost" && !strings.Contains(h, ".") {
		return "", fmt.Errorf("%q has no dot: not a host name (localhost, an IP literal or * are)", h)
	}
	return h, nil
}

// validName reports whether s is a lower-case DNS name: labels of
// letters, digits, '-' and '_' (and bytes beyond ASCII, for IDN names
// written as such), each 1-63 bytes, 253 in all.
// ValidHostName reports whether s, lower-case and without a trailing
// dot, is a DNS name in ASCII (an internationalized one in its punycode
// form): labels of 1 to 63 letters, digits, '-' and '_', 253 bytes at
// most. It is what a client of the egress proxy must name.
func ValidHostName(s string) bool { return validName(s, false) }

// validName is ValidHostName, taking non-ASCII bytes in labels when
// unicode is set (a hint may name an IDN host as written).
func validName(s string, unicode bool) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', unicode && c >= 0x80:
			default:
				return false
			}
		}
	}
	return true
}

// NormalizeHost lower-cases a host as a client names it, drops a
// trailing dot and the brackets of an IPv6 literal, and unmaps an
// IPv4-mapped IPv6 literal.
func NormalizeHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

// DefaultDeny is the default deny list of seed 001 §6, which every run's
// Egress carries and nothing overrides: personal cloud storage
// (dropbox.com, icloud.com, gdrive.google.com, each the domain itself
// and every name beneath it: the seed names "*.dropbox.com", and a
// wildcard does not match the bare domain, which serves the same
// accounts), mail submission and relay ports (25, 465, 587) and IRC
// ports (6667, 6697) on any host, names and addresses alike.
func DefaultDeny() []Dest {
	var d []Dest
	for _, dom := range []string{"dropbox.com", "icloud.com", "gdrive.google.com"} {
		why := "default deny: personal cloud storage"
		d = append(d, Dest{Host: dom, Why: why}, Dest{Host: "*." + dom, Why: why})
	}
	for _, p := range []uint16{25, 465, 587} {
		d = append(d, Dest{Host: "*", Port: p, Why: "default deny: mail port"})
	}
	for _, p := range []uint16{6667, 6697} {
		d = append(d, Dest{Host: "*", Port: p, Why: "default deny: IRC port"})
	}
	return d
}

var nonPublic = []struct {
	p    netip.Prefix
	name string
}{
	// Order matters: the first prefix containing the address names it.
	{netip.MustParsePrefix("169.254.169.254/32"), "metadata"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "CGNAT/tailnet"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmark"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/96"), "reserved"}, // IPv4-compatible, deprecated
	{netip.MustParsePrefix("64:ff9b:1::/48"), "private"},
	{netip.MustParsePrefix("100::/64"), "reserved"}, // discard
	{netip.MustParsePrefix("fd00:ec2::254/128"), "metadata"},
	{netip.MustParsePrefix("fc00::/7"), "private"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "private"}, // site-local, deprecated
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixto4 = netip.MustParsePrefix("2002::/16")
)

// NonPublic returns "" for a public address, else the name of the range
// it belongs to: "loopback", "private" (10/8, 172.16/12, 192.168/16,
// fc00::/7), "link-local" (169.254/16, fe80::/10), "metadata"
// (169.254.169.254, fd00:ec2::254), "CGNAT/tailnet" (100.64/10),
// "multicast", "unspecified" (0/8, ::), "broadcast", "reserved" (240/4,
// 192.0.0/24, IPv4-compatible ::/96, 100::/64), "benchmark" (198.18/15).
//
// An IPv4-mapped IPv6 address is unmapped first, and the IPv4 address
// inside a NAT64 (64:ff9b::/96) or 6to4 (2002::/16) address is what is
// judged. The documentation ranges (192.0.2/24, 198.51.100/24,
// 203.0.113/24, 2001:db8::/32) count as public: tests use them as
// stand-in public hosts on network namespaces they create.
func NonPublic(a netip.Addr) string {
	a = a.Unmap()
	if !a.IsValid() {
		return "invalid"
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a):
			return NonPublic(netip.AddrFrom4([4]byte(b[12:16])))
		case sixto4.Contains(a):
			return NonPublic(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	a = a.WithZone("")
	for _, r := range nonPublic {
		if r.p.Contains(a) {
			return r.name
		}
	}
	return ""
}

// Refusal is why [Egress.CheckName] or [Egress.CheckAddr] refused a
// destination.
type Refusal struct {
	// Host and Port are the destination as the client named it.
	Host string
	Port uint16
	// Addr is the resolved address refused, or "" when the name was.
	Addr string
	// Reason is the rule, in words: "default deny: mail port",
	// "loopback", "not allowed".
	Reason string
	// List is the list that refused it: "allowlist" (nothing allows
	// it), "denylist" (a deny pattern matches) or "address" (it
	// resolves to an address its pattern does not name).
	List string
}

// Error says what was refused and what to do about it.
func (r *Refusal) Error() string {
	hp := joinHostPort(r.Host, r.Port)
	switch r.List {
	case "denylist":
		if r.Addr != "" {
			hp += " (" + r.Addr + ")"
		}
		return fmt.Sprintf("egress: %s is on the deny list (%s); the deny list wins over every allow", hp, r.Reason)
	case "address":
		return fmt.Sprintf("egress: %s resolves to %s (%s): a name reaches local addresses only when a hint names the address literally (or the device owner's [network] allow in limits.toml, or METNOS_NET_ALLOW, a range holding it)", hp, r.Addr, r.Reason)
	}
	if kind, ok := strings.CutSuffix(r.Reason, " address not named literally"); ok {
		return fmt.Sprintf("egress: %s is not named by the executor's manifest network hints: it is a %s address, which a wildcard hint never reaches (only public hosts); a hint must name it literally, or the device owner allow it with [network] allow in limits.toml (or METNOS_NET_ALLOW)", hp, kind)
	}
	return fmt.Sprintf("egress: %s is not named by the executor's manifest network hints; the device owner can allow it with [network] allow in limits.toml (or METNOS_NET_ALLOW)", hp)
}

// CheckName decides a destination before its name is resolved: it
// returns the Allow pattern matching (host, port), or a
// [*Refusal]: the first naming the host itself (exact name, IP literal,
// CIDR), else the first wildcard ("*.x", "*"). Deny is checked first and
// wins, ports included; a wildcard deny ("*:25") matches names and IP
// literals alike.
//
// In Allow, "*" and "*.x" match names only; an IP literal matches only
// a pattern naming that literal or a CIDR containing it, and a public
// IP literal also matches "*". A name that passes must still pass
// [Egress.CheckAddr] for every address it resolves to.
func (e *Egress) CheckName(host string, port uint16) (Dest, error) {
	host = NormalizeHost(host)
	addr, err := netip.ParseAddr(host)
	isIP := err == nil
	for _, d := range e.Deny {
		if d.Port != 0 && d.Port != port {
			continue
		}
		if d.Host == "*" || (isIP && d.containsAddr(addr)) || (!isIP && d.matchesName(host)) {
			return Dest{}, &Refusal{Host: host, Port: port, Reason: why(d, "owner deny"), List: "denylist"}
		}
	}
	// Two passes: the patterns naming the host itself (a name, a
	// literal, a CIDR) before the wildcards, so that with "*" and
	// "localhost" both allowed, localhost is allowed by "localhost",
	// which CheckAddr lets reach loopback.
	for _, wild := range []bool{false, true} {
		for _, d := range e.Allow {
			if d.Port != 0 && d.Port != port || strings.HasPrefix(d.Host, "*") != wild {
				continue
			}
			if isIP {
				if d.containsAddr(addr) || (d.Host == "*" && NonPublic(addr) == "") {
					return d, nil
				}
			} else if d.Host == "*" || d.matchesName(host) {
				return d, nil
			}
		}
	}
	r := &Refusal{Host: host, Port: port, Reason: "not allowed", List: "allowlist"}
	if isIP {
		if np := NonPublic(addr); np != "" {
			r.Reason = np + " address not named literally"
		}
	}
	return Dest{}, r
}

// CheckAddr decides one address the proxy is about to connect to for
// (host, port), which [Egress.CheckName] allowed by the pattern by.
// A public address passes unless a Deny CIDR or literal names it. A
// non-public address (see [NonPublic]) passes only when by names it
// literally (by.Host is that IP literal, or "localhost" and the address
// is loopback) or an Allow CIDR containing it allows the port (the
// owner vouched for that range). So a name allowed exactly ("nas.lan")
// or by a wildcard that resolves to 127.0.0.1 or 10.x is refused: DNS
// rebinding.
func (e *Egress) CheckAddr(host string, port uint16, a netip.Addr, by Dest) error {
	host = NormalizeHost(host)
	a = a.Unmap().WithZone("")
	for _, d := range e.Deny {
		if (d.Port == 0 || d.Port == port) && d.containsAddr(a) {
			return &Refusal{Host: host, Port: port, Addr: a.String(), Reason: why(d, "owner deny"), List: "denylist"}
		}
	}
	np := NonPublic(a)
	if np == "" {
		for _, p := range e.Local {
			if p.Contains(a) {
				np = "this device's own network"
				break
			}
		}
	}
	if np == "" {
		return nil
	}
	if by.containsAddr(a) || (by.Host == "localhost" && a.IsLoopback()) {
		return nil
	}
	for _, d := range e.Allow {
		if strings.Contains(d.Host, "/") && (d.Port == 0 || d.Port == port) && d.containsAddr(a) {
			return nil
		}
	}
	return &Refusal{Host: host, Port: port, Addr: a.String(), Reason: np, List: "address"}
}

// matchesName reports whether the pattern matches a (normalized) name:
// equal, or beneath a "*." wildcard. "*" is left to the caller.
func (d Dest) matchesName(name string) bool {
	if suffix, ok := strings.CutPrefix(d.Host, "*."); ok {
		return strings.HasSuffix(name, "."+suffix)
	}
	return d.Host == name
}

// containsAddr reports whether the pattern is that IP literal or a CIDR
// containing it.
func (d Dest) containsAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	if d.containsExactly(a) {
		return true
	}
	// The IPv4 address inside a NAT64 or 6to4 one is the destination
	// too: a deny of 203.0.113.0/24 holds for 64:ff9b::cb00:7105.
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a):
			return d.containsExactly(netip.AddrFrom4([4]byte(b[12:16])))
		case sixto4.Contains(a):
			return d.containsExactly(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	return false
}

func (d Dest) containsExactly(a netip.Addr) bool {
	if strings.Contains(d.Host, "/") {
		p, err := netip.ParsePrefix(d.Host)
		return err == nil && p.Contains(a)
	}
	b, err := netip.ParseAddr(d.Host)
	return err == nil && b.Unmap().WithZone("") == a
}

func why(d Dest, def string) string {
	if d.Why != "" {
		return d.Why
	}
	return def + " " + d.String()
}

func joinHostPort(h string, p uint16) string {
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	return h + ":" + strconv.Itoa(int(p))
}
