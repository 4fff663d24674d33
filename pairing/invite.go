package pairing

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"

	"github.com/metnos/agent/internal/term"
)

// Invite is what a user was sent to pair a device with: either a join
// link an admin made on the server's Devices page (JoinURL set), or the
// server URL and one-time token of the manual one-liner that page shows
// (Server and Token set).
type Invite struct {
	// JoinURL is the join link, <scheme>://<host>[/prefix]/agent/client/join/<id>,
	// without a trailing slash.
	JoinURL string
	// Server is the server's URL of a one-liner.
	Server string
	// Token is the one-time pairing token of a one-liner (DEV.….…).
	Token string
}

// joinPath is the path of a join link before its id (wire.PathJoin; not
// imported, so that package pairing stays below package wire).
const joinPath = "/agent/client/join/"

// The patterns are compiled at their first use, not at every start of
// the agent: only pair reads invites.
var (
	// joinIDRe is the real server's _JOIN_ID_RE.
	joinIDRe = lazyRE(`^[0-9a-f]{8,32}$`)
	// tokenRe is the shape of a device token: DEV.<payload>.<signature>,
	// both base64url.
	tokenRe = lazyRE(`^DEV\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$`)
	// serverCharsRe are the characters a server URL may hold in an
	// invite or installer: those of an http URL with a host, a port and
	// a path (the real server's batch-safe set, without +).
	serverCharsRe = lazyRE(`^[A-Za-z0-9._~:/\[\]-]+$`)
	// assignRe finds METNOS_SERVER= and METNOS_TOKEN= in a one-liner,
	// as a shell, PowerShell ($env:) or cmd (set "…") would assign them.
	assignRe = lazyRE(`(^|[^A-Za-z0-9_])METNOS_(SERVER|TOKEN)[ \t]*=`)
	// shPreludeRe is a line of the shell installer's prelude, as the
	// real server writes it: METNOS_X=<_sh_squote(value)>; export METNOS_X.
	shPreludeRe = lazyRE(`^METNOS_(SERVER|TOKEN)=('(?:[^']|'\\'')*'); export METNOS_(SERVER|TOKEN)$`)
	// cmdSetRe is a line of the Windows .cmd installer's head:
	// set "METNOS_X=value".
	cmdSetRe = lazyRE(`^set "METNOS_(SERVER|TOKEN)=([^"]*)"$`)
)

// lazyRE returns a function that compiles expr the first time it is
// called and returns the same *regexp.Regexp after.
func lazyRE(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// ParseInvite reads what a user pasted to pair a device: a join link
// (<server>/agent/client/join/<join_id>, with a trailing slash, spaces,
// quotes or angle brackets around it as a chat may add them), or the
// text of a manual one-liner of the server's Devices page, which sets
// METNOS_SERVER and METNOS_TOKEN (shell, on one line or several joined
// by backslashes; PowerShell $env:; export; cmd set "…"; the values
// quoted or not). A join link followed by anything (/installer, ?…, #…)
// is refused rather than guessed at. The error is one sentence.
func ParseInvite(text string) (Invite, error) {
	s := trimPasted(text)
	if s == "" {
		return Invite{}, errors.New("the link is empty: paste the join link the admin sent (…/agent/client/join/…), or the METNOS_SERVER=… METNOS_TOKEN=… command of the Devices page")
	}
	if assignRe().MatchString(s) {
		return parseOneLiner(s)
	}
	u, err := parseJoinLink(s)
	if err != nil {
		return Invite{}, err
	}
	return Invite{JoinURL: u}, nil
}

// trimPasted drops what a chat or a mail wraps a pasted link in: spaces
// and newlines, then matching quotes or angle brackets, repeatedly.
func trimPasted(s string) string {
	for {
		s = strings.TrimSpace(s)
		if len(s) < 2 {
			return s
		}
		switch first, last := s[0], s[len(s)-1]; {
		case first == '<' && last == '>', first == '"' && last == '"', first == '\'' && last == '\'', first == '`' && last == '`':
			s = s[1 : len(s)-1]
		default:
			return s
		}
	}
}

// parseJoinLink checks s is a join link and returns it without a
// trailing slash.
func parseJoinLink(s string) (string, error) {
	q := `"` + term.Sanitize(s) + `"`
	const want = "want the join link as the admin sent it, such as http://metnos.your-tailnet:8765/agent/client/join/0123456789abcdef"
	if r, off, bad := term.FirstUnsafe(s); bad {
		return "", fmt.Errorf("the link %s holds %s at byte %d: %s", q, term.Describe(r), off, want)
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return "", fmt.Errorf("the link %s holds spaces and is not a METNOS_SERVER=… METNOS_TOKEN=… command: %s", q, want)
	}
	p, err := url.Parse(s)
	if err != nil || p.Scheme == "" || p.Host == "" {
		return "", fmt.Errorf("the link %s is not a URL: %s", q, want)
	}
	if p.RawQuery != "" || p.ForceQuery || p.Fragment != "" || strings.Contains(s, "#") {
		return "", fmt.Errorf("the link %s has something after the join id (?… or #…): %s", q, want)
	}
	if p.User != nil {
		return "", fmt.Errorf("the link %s holds a user name or password: %s", q, want)
	}
	path := p.EscapedPath()
	i := strings.LastIndex(path, joinPath)
	if i < 0 {
		return "", fmt.Errorf("the link %s is not a join link (its path has no %s): %s", q, joinPath, want)
	}
	id := strings.TrimSuffix(path[i+len(joinPath):], "/")
	if j := strings.IndexByte(id, '/'); j >= 0 {
		return "", fmt.Errorf("the link %s has %s after the join id: %s", q, term.Sanitize(id[j:]), want)
	}
	if !joinIDRe().MatchString(id) {
		return "", fmt.Errorf("the link %s has the join id %q, not 8 to 32 lowercase hex digits: %s", q, term.Sanitize(id), want)
	}
	base := p.Scheme + "://" + p.Host + path[:i]
	if err := CheckServerURL(base); err != nil {
		return "", fmt.Errorf("the link %s is not on a Metnos server: %w", q, err)
	}
	return base + joinPath + id, nil
}

// parseOneLiner reads METNOS_SERVER and METNOS_TOKEN out of a one-liner.
func parseOneLiner(s string) (Invite, error) {
	// A backslash (shell) or backquote (PowerShell) at a line's end
	// continues it: the lines are one command.
	s = strings.ReplaceAll(s, "\r\n", "\n")
	vals := map[string]string{}
	for _, m := range assignRe().FindAllStringSubmatchIndex(s, -1) {
		name := "METNOS_" + s[m[4]:m[5]]
		rest := s[m[1]:]
		if t := strings.TrimLeft(rest, " \t"); t != "" && (t[0] == '\'' || t[0] == '"') {
			rest = t // PowerShell's $env:X = '…'
		}
		v, ok := assignedValue(rest)
		if !ok {
			return Invite{}, fmt.Errorf("the value of %s is not closed by its quote", name)
		}
		if old, seen := vals[name]; seen && old != v {
			return Invite{}, fmt.Errorf("%s is set twice, to different values: paste the command once", name)
		}
		vals[name] = v
	}
	server, token := vals["METNOS_SERVER"], vals["METNOS_TOKEN"]
	switch {
	case server == "" && token == "":
		return Invite{}, errors.New("the command sets neither METNOS_SERVER nor METNOS_TOKEN to a value")
	case server == "":
		return Invite{}, errors.New("the command sets METNOS_TOKEN but not METNOS_SERVER: paste the whole command of the Devices page")
	case token == "":
		return Invite{}, errors.New("the command sets METNOS_SERVER but not METNOS_TOKEN: paste the whole command of the Devices page")
	}
	if err := checkPair(server, token); err != nil {
		return Invite{}, err
	}
	return Invite{Server: server, Token: token}, nil
}

// assignedValue reads the value at the start of s: quoted with ' or "
// up to the closing quote, else up to a space, a semicolon, a quote, a
// backquote or a line's end (ok is false for an unclosed quote).
func assignedValue(s string) (v string, ok bool) {
	if s != "" && (s[0] == '\'' || s[0] == '"') {
		end := strings.IndexByte(s[1:], s[0])
		if end < 0 {
			return "", false
		}
		return s[1 : 1+end], true
	}
	end := strings.IndexAny(s, " \t\r\n;\"'`\\|&")
	if end < 0 {
		end = len(s)
	}
	return s[:end], true
}

// checkPair checks a server URL and a token read from an invite or an
// installer, in one sentence.
func checkPair(server, token string) error {
	if !serverCharsRe().MatchString(server) {
		return fmt.Errorf("METNOS_SERVER %q holds characters no server URL of Metnos has", term.Sanitize(server))
	}
	if err := CheckServerURL(server); err != nil {
		return fmt.Errorf("METNOS_SERVER: %w", err)
	}
	if !tokenRe().MatchString(token) {
		return fmt.Errorf("METNOS_TOKEN %q is not a device token (DEV.….…)", term.Sanitize(shorten(token, 80)))
	}
	return nil
}

// shorten cuts s to n bytes, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ParseInstaller reads the server URL and token the server's join
// endpoint baked into the installer it returned, without running it:
// the two lines of the shell script's prelude,
// METNOS_SERVER='…'; export METNOS_SERVER (quoted as the real server's
// _sh_squote does), or of the Windows .cmd's head, set "METNOS_SERVER=…".
// Anything else is refused: either missing, set twice to different
// values, a server that is not an http(s) URL, a token not of the shape
// DEV.….…. The error is one sentence.
func ParseInstaller(body []byte) (server, token string, err error) {
	vals := map[string]string{}
	for _, line := range bytes.Split(body, []byte("\n")) {
		l := string(bytes.TrimSuffix(line, []byte("\r")))
		var name, v string
		if m := shPreludeRe().FindStringSubmatch(l); m != nil {
			if m[1] != m[3] {
				continue // exports another variable than it sets: not the prelude
			}
			name, v = m[1], unSquote(m[2])
		} else if m := cmdSetRe().FindStringSubmatch(l); m != nil {
			name, v = m[1], m[2]
		} else {
			continue
		}
		name = "METNOS_" + name
		if old, seen := vals[name]; seen && old != v {
			return "", "", fmt.Errorf("the server's installer sets %s twice, to different values: refused", name)
		}
		vals[name] = v
	}
	server, token = vals["METNOS_SERVER"], vals["METNOS_TOKEN"]
	switch {
	case server == "" && token == "":
		return "", "", errors.New("the server's answer is not a Metnos installer: it sets no METNOS_SERVER and no METNOS_TOKEN")
	case server == "":
		return "", "", errors.New("the server's installer sets no METNOS_SERVER: refused")
	case token == "":
		return "", "", errors.New("the server's installer sets no METNOS_TOKEN: refused")
	}
	if err := checkPair(server, token); err != nil {
		return "", "", fmt.Errorf("the server's installer is refused: %w", err)
	}
	return server, token, nil
}

// unSquote undoes _sh_squote: the value between the outer quotes,
// each quote written as close, backslash-quote, reopen back to one quote.
func unSquote(q string) string {
	return strings.ReplaceAll(q[1:len(q)-1], `'\''`, `'`)
}
