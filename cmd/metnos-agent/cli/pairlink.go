package cli

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"unicode/utf8"

	xterm "golang.org/x/term"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/wire"
)

const pairHelp = `Pair this device from what the admin sent: the join link made on the
server's Devices page (http://…/agent/client/join/…), or the manual
one-liner that page shows (METNOS_SERVER=… METNOS_TOKEN=…, in any of its
shapes), quoted as one argument, or - to read it from standard input.

From a join link, the server's installer for this platform is fetched
and only read, never run: the server URL and the token it carries are
used to register exactly as register does. Then the device fingerprint
is printed, for the admin to compare with the Devices page.`

// maxInviteBytes bounds what pair reads from standard input.
const maxInviteBytes = 64 << 10

func runPair(std stdio, args []string) int {
	fs := newFlagSet("pair", std, pairHelp)
	install := fs.Bool("install", false, "install and start the agent as this user's service once paired (what metnos-agent install does)")
	name := fs.String("name", "", "the name this device shows locally (default: the name the server gives it)")
	force := fs.Bool("force", false, "replace an existing pairing with another server without asking")
	tf := addTailnetFlags(fs)
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() != 1 {
		return usageError(std.err, "pair", "pair takes one LINK: the join link or the one-liner the admin sent, quoted, or - to read it from standard input")
	}
	text := fs.Arg(0)
	if text == "-" {
		if std.in == nil {
			return usageError(std.err, "pair", "no standard input to read the link from")
		}
		if xterm.IsTerminal(int(std.in.Fd())) {
			fmt.Fprintln(std.err, "paste the link or the command the admin sent, then press Ctrl-D (Ctrl-Z and Enter on Windows):")
		}
		b, err := io.ReadAll(io.LimitReader(std.in, maxInviteBytes+1))
		if err != nil {
			return fail(std, fmt.Errorf("reading the link from standard input: %w", err))
		}
		if len(b) > maxInviteBytes {
			return usageError(std.err, "pair", "standard input holds more than %d KiB: not a link", maxInviteBytes>>10)
		}
		text = string(b)
	}
	inv, err := pairing.ParseInvite(text)
	if err != nil {
		return usageError(std.err, "pair", "%v", err)
	}
	if err := tf.check(); err != nil {
		return usageError(std.err, "pair", "%v", err)
	}
	if n := utf8.RuneCountInString(*name); n > maxNameRunes {
		return usageError(std.err, "pair", "--name is %d characters long: a device name has at most %d", n, maxNameRunes)
	}
	if r, off, bad := term.FirstUnsafe(*name); bad {
		return usageError(std.err, "pair", "--name holds %s at byte %d: a device name is shown on terminals, so it may not hold control characters, escape sequences or bidirectional overrides", term.Describe(r), off)
	}
	return pairDevice(std, pairRequest{cmd: "pair", server: inv.Server, token: inv.Token, joinURL: inv.JoinURL,
		name: *name, force: *force, tailnet: tf, install: *install})
}

// readJoinLink walks the join link as the real client's installer
// would: its status (refused when the link paired another device or
// expired), its page (the admin sees "opened"), then the installer
// for this platform, from which it reads the server URL and token
// without running it. When the link already paired the key pub, mine
// is the device id it paired, and nothing else is asked.
func readJoinLink(std stdio, c *client.Client, joinURL string, pub ed25519.PublicKey) (server, token, mine string, err error) {
	ctx := context.Background()
	st, err := c.JoinStatus(ctx, joinURL)
	if err != nil {
		return "", "", "", err
	}
	switch st.State {
	case "expired":
		return "", "", "", client.ErrJoinExpired
	case "registered", "heartbeat":
		if st.Device != nil && st.Device.Fingerprint == wire.ServerFingerprint(pub) {
			return "", "", st.Device.ID, nil
		}
		who := st.DeviceName
		if st.Device != nil && st.Device.Name != "" {
			who = st.Device.Name
		}
		return "", "", "", fmt.Errorf("this link was already used to pair another device (%s): ask for a new link", term.Sanitize(who))
	}
	if err := c.OpenJoinPage(ctx, joinURL); err != nil {
		return "", "", "", err
	}
	b, err := c.JoinInstaller(ctx, joinURL, client.JoinPlatform())
	if err != nil {
		return "", "", "", err
	}
	server, token, err = pairing.ParseInstaller(b)
	if err != nil {
		return "", "", "", fmt.Errorf("%s %w (%v)", joinURL, client.ErrNotMetnos, err)
	}
	if lh, sh := hostOf(joinURL), hostOf(server); !strings.EqualFold(lh, sh) {
		fmt.Fprintf(std.err, "note: the server's installer names it %s, not %s as the link does: pairing with %s\n", term.Sanitize(server), term.Sanitize(lh), term.Sanitize(server))
	}
	return server, token, "", nil
}

// hostOf is the host (and port) of a URL, "" if it is none.
func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Host
}

// tokenUsed reports whether err is the server's 409 token_already_used.
func tokenUsed(err error) bool {
	var se *client.ServerError
	return errors.As(err, &se) && se.Code == wire.CodeTokenAlreadyUsed
}

// groupedFingerprint is the first 16 hex digits of the server's
// fingerprint of pub ([wire.ServerFingerprint]), what its Devices page
// shows, in four groups of four for a person to compare by eye.
func groupedFingerprint(pub ed25519.PublicKey) string {
	f := wire.ServerFingerprint(pub)[:16]
	return f[0:4] + " " + f[4:8] + " " + f[8:12] + " " + f[12:16]
}

// afterPairing is what pair does once the device is paired: install
// the service with --install, else say how to start the agent.
func (r pairRequest) afterPairing(std stdio) int {
	if r.install {
		return runInstall(std, nil)
	}
	fmt.Fprintln(std.out, "to start the agent: `metnos-agent install` (as this user's service, started at login), or `metnos-agent run` (in this terminal)")
	return exitOK
}
