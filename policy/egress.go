package policy

// Egress is the network a run reaches through the agent's per-run proxy
// (docs/protocol.md §12.4): the destinations its signed manifest's
// network capabilities name, narrowed by the deny lists. A Policy with
// Egress set and Network false has no network of its own; the proxy is
// its only way out.
type Egress struct {
	// Allow are the destinations the manifest's network:* hints name,
	// then the device owner's own allow list.
	Allow []Dest `json:"allow,omitempty"`
	// Deny is the default deny list (seed 001 §6) and the owner's; a
	// destination it matches is refused whatever Allow says.
	Deny []Dest `json:"deny,omitempty"`
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
