package wire

import (
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/metnos/agent/internal/term"
)

// Paths of the server's client mirror (docs/protocol.md §9): signed
// component descriptors, the files they name, and join links.
const (
	// PathComponent is followed by <component>/update/<target>.
	PathComponent = "/agent/component/"
	// PathClientFiles is followed by a descriptor's path in the mirror,
	// <version>/<target>/<file>, or by an installer's name.
	PathClientFiles = "/agent/client/"
	// PathJoin is followed by a join id: the join link an admin sends,
	// with /status and /installer after it.
	PathJoin = "/agent/client/join/"
)

// AgentComponent is the name metnos-agent's builds are published
// under in the mirror's manifest, and asked for in
// GET /agent/component/metnos-agent/update/<target>.
const AgentComponent = "metnos-agent"

// ComponentDescriptor is the server's signed description of one
// component's build for one target (GET
// /agent/component/<component>/update/<target>, docs/protocol.md §9.4):
// the signature covers the canonical {component, sha256, target,
// version}.
type ComponentDescriptor struct {
	Component string
	Version   string
	Target    string
	SHA256    string
	// URLPath is where the build is served, /agent/client/<path>.
	URLPath string
}

var (
	componentName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9_\-]*$`) })
	targetName    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9_\-]+$`) })
	// versionRule is what a published version may hold: it is compared
	// and shown, never used as a path by the device.
	// versionRule is unbounded: ValidVersion checks the length (a bounded
	// repeat compiles to a program that long, at every start).
	versionRule = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+\-]*$`) })
)

// ValidComponent reports whether name can be a component the server
// publishes (the server's own rule).
func ValidComponent(name string) bool { return componentName().MatchString(name) }

// ValidTarget reports whether name can be a target the server
// publishes for (the server's own rule).
func ValidTarget(name string) bool { return targetName().MatchString(name) }

// ValidVersion reports whether v can be a published version: 1 to 64
// characters of [A-Za-z0-9._+-], starting with a letter or digit.
func ValidVersion(v string) bool { return len(v) <= 64 && versionRule().MatchString(v) }

// UpdateTarget is metnos-agent's own target name for an OS and
// architecture (Go's names), such as linux-amd64 or windows-arm64:
// never a target of the Rust client (x86_64-unknown-linux-musl...), so
// a server that publishes both can never hand one the other's build.
func UpdateTarget(goos, goarch string) string { return goos + "-" + goarch }

// SignComponentDescriptor returns the descriptor the server sends,
// {component, version, target, sha256, url_path, sig}, signed as the
// real server signs it.
func SignComponentDescriptor(key ed25519.PrivateKey, d ComponentDescriptor) (map[string]any, error) {
	payload := map[string]any{"component": d.Component, "version": d.Version, "target": d.Target, "sha256": d.SHA256}
	sig, err := SignCanonical(key, payload)
	if err != nil {
		return nil, fmt.Errorf("wire: signing the descriptor of %s %s for %s: %w", d.Component, d.Version, d.Target, err)
	}
	payload["url_path"] = d.URLPath
	payload["sig"] = sig
	return payload, nil
}

// VerifyComponentDescriptor checks the body of GET
// /agent/component/<component>/update/<target> against the pinned
// server key, and that it describes the component and target asked for,
// with a sha256 of 64 hex digits, a valid version and a url_path under
// /agent/client/ that stays there.
func VerifyComponentDescriptor(body []byte, key ed25519.PublicKey, component, target string) (ComponentDescriptor, error) {
	v, err := Decode(body)
	m, _ := v.(map[string]any)
	if err != nil || m == nil {
		return ComponentDescriptor{}, fmt.Errorf("update descriptor for %s %s: not a JSON object", component, target)
	}
	str := func(k string) string { s, _ := m[k].(string); return s }
	d := ComponentDescriptor{Component: str("component"), Version: str("version"), Target: str("target"),
		SHA256: str("sha256"), URLPath: str("url_path")}
	payload := map[string]any{"component": m["component"], "version": m["version"], "target": m["target"], "sha256": m["sha256"]}
	if err := VerifyCanonical(key, payload, str("sig")); err != nil {
		return ComponentDescriptor{}, fmt.Errorf("update descriptor for %s %s: %w (not signed by the paired server: nothing was downloaded)", component, target, err)
	}
	switch {
	case d.Component != component:
		return ComponentDescriptor{}, fmt.Errorf("update descriptor: the server signed a descriptor of %q, not of %q: refused (a descriptor of another program)", term.Sanitize(d.Component), component)
	case d.Target != target:
		return ComponentDescriptor{}, fmt.Errorf("update descriptor for %s: it is for target %q, not %q: refused", component, term.Sanitize(d.Target), target)
	case !ValidVersion(d.Version):
		return ComponentDescriptor{}, fmt.Errorf("update descriptor for %s %s: version %q is not a version: refused", component, target, term.Sanitize(d.Version))
	}
	if _, herr := hex.DecodeString(d.SHA256); len(d.SHA256) != 64 || herr != nil || strings.ToLower(d.SHA256) != d.SHA256 {
		return ComponentDescriptor{}, fmt.Errorf("update descriptor for %s %s: sha256 %q is not 64 lowercase hex digits: refused", component, target, term.Sanitize(d.SHA256))
	}
	rest, ok := strings.CutPrefix(d.URLPath, PathClientFiles)
	if !ok || rest == "" || !SafePath(rest) || strings.ContainsAny(rest, "?#%") {
		return ComponentDescriptor{}, fmt.Errorf("update descriptor for %s %s: url_path %q is not a file under %s: refused", component, target, term.Sanitize(d.URLPath), PathClientFiles)
	}
	return d, nil
}

// CompareVersions compares two dot-separated versions numerically, as
// the Rust client does (docs/protocol.md §9.1): each dot-separated part
// is a number, a part that is not counts as 0, and a missing part is
// lower than any present one (1.2 < 1.2.0). A leading "v" is ignored.
// It returns -1, 0 or +1.
func CompareVersions(a, b string) int {
	pa, pb := versionParts(a), versionParts(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] != pb[i] {
			if pa[i] < pb[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(pa) < len(pb):
		return -1
	case len(pa) > len(pb):
		return 1
	}
	return 0
}

func versionParts(v string) []uint64 {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	var out []uint64
	for _, s := range strings.Split(v, ".") {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			n = 0
		}
		out = append(out, n)
	}
	return out
}
