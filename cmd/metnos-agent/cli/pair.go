package cli

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path"
	"strings"
	"unicode/utf8"

	xterm "golang.org/x/term"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/wire"
)

// maxNameRunes is the longest device name register accepts: a name is
// shown on one line by whoami and on the server's Devices page.
const maxNameRunes = 64

func runRegister(std stdio, args []string) int {
	fs := newFlagSet("register", std, "Pair this device with a Metnos server using a one-time token from its admin page (Devices).")
	server := fs.String("server", "", "the server's device URL, such as http://metnos.tailnet:8765")
	token := fs.String("token", "", "the one-time pairing token (DEV.…)")
	name := fs.String("name", "", "the name this device shows locally (default: the name the server gives it)")
	force := fs.Bool("force", false, "replace an existing pairing with another server without asking")
	tf := addTailnetFlags(fs)
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "register", "register takes no arguments, only flags (got %q)", term.Sanitize(fs.Arg(0)))
	}
	if *server == "" || *token == "" {
		return usageError(std.err, "register", "both --server and --token are needed")
	}
	if err := pairing.CheckServerURL(*server); err != nil {
		return usageError(std.err, "register", "--server: %v", err)
	}
	if err := tf.check(); err != nil {
		return usageError(std.err, "register", "%v", err)
	}
	if n := utf8.RuneCountInString(*name); n > maxNameRunes {
		return usageError(std.err, "register", "--name is %d characters long: a device name has at most %d", n, maxNameRunes)
	}
	if r, off, bad := term.FirstUnsafe(*name); bad {
		return usageError(std.err, "register", "--name holds %s at byte %d: a device name is shown on terminals, so it may not hold control characters, escape sequences or bidirectional overrides", term.Describe(r), off)
	}
	return pairDevice(std, pairRequest{cmd: "register", server: *server, token: *token, name: *name, force: *force, tailnet: tf})
}

// pairRequest is what register and pair pair the device with.
type pairRequest struct {
	// cmd is the command pairing: "register" or "pair".
	cmd string
	// server and token are register's flags, or a one-liner's values;
	// with joinURL set, they come from the join link's installer.
	server, token string
	// joinURL is pair's join link ("" for a server and token).
	joinURL string
	name    string
	force   bool
	tailnet tailnetFlags
	// install is pair's --install.
	install bool
}

// pairDevice pairs the device as r says, the flags checked: what
// register does, and pair after reading its link. It returns the exit
// status.
func pairDevice(std stdio, r pairRequest) int {
	server, token, name, tf := &r.server, &r.token, &r.name, r.tailnet
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	if err := pairing.CheckHome(e.lay); err != nil {
		return fail(std, err)
	}
	old, err := pairing.LoadState(e.lay)
	if err != nil {
		return fail(std, err)
	}
	if old.Paired() {
		// Held until state.json is written: a `run` started meanwhile
		// (during a tailnet join, say) is refused rather than serving
		// the pairing this replaces. A device not paired yet needs no
		// lock, and gets no file from a register that fails: `run`
		// refuses an unpaired device before it takes the lock.
		release, code, ok := holdRunLock(std, e.lay, "pairing again")
		if !ok {
			return code
		}
		defer release()
		if old, err = pairing.LoadState(e.lay); err != nil {
			return fail(std, err)
		}
	}
	if old.Paired() && r.joinURL == "" {
		if code, ok := confirmRepair(std, old, *server, r.cmd, r.force); !ok {
			return code
		}
	}
	// A new key is written only once the server paired it: a dead or
	// non-Metnos server leaves nothing behind.
	key, fresh, err := pairing.LoadOrNewKey(e.lay)
	if err == nil {
		err = pairing.CheckDataWritable(e.lay)
	}
	if err != nil {
		return fail(std, err)
	}
	dialed := *server
	if r.joinURL != "" {
		// The link's server, until its installer names the one to pair with.
		dialed = strings.TrimSuffix(r.joinURL, path.Base(r.joinURL))
		dialed = strings.TrimSuffix(dialed, wire.PathJoin)
	}
	c, node, err := connect(context.Background(), e, connectOptions{server: dialed, unpaired: true, key: key, name: *name, tailnet: tf, progress: std.err}, warnLogger(std))
	if err != nil {
		return fail(std, err)
	}
	if node != nil {
		defer node.Close()
	}
	if r.joinURL != "" {
		var mine string
		*server, *token, mine, err = readJoinLink(std, c, r.joinURL, key.Public().(ed25519.PublicKey))
		switch {
		case err != nil:
			return fail(std, err)
		case mine != "" && old.Paired() && *old.DeviceID == mine:
			fmt.Fprintf(std.err, "note: this link already paired this device (device %s): nothing to register\n", term.Sanitize(mine))
			return r.afterPairing(std)
		case mine != "":
			return fail(std, fmt.Errorf("this link already paired this device's key as device %s, which this device is no longer paired as: ask for a new link", term.Sanitize(mine)))
		}
		if old.Paired() {
			if code, ok := confirmRepair(std, old, *server, r.cmd, r.force); !ok {
				return code
			}
		}
		c = c.At(*server)
	}
	reg, err := c.Register(context.Background(), *token)
	if r.cmd == "pair" && tokenUsed(err) {
		return fail(std, errors.New("this link's token was already used by another device: ask for a new link"))
	}
	if err != nil {
		return fail(std, fmt.Errorf("pairing failed: %w", err))
	}
	if fresh {
		if err := pairing.SaveNewKey(e.lay, key); err != nil {
			return fail(std, fmt.Errorf("%w (the server paired this key, which is now lost: pair again with a new token once this is fixed)", err))
		}
	}
	st := pairing.State{DeviceID: &reg.DeviceID, ServerURL: server, Fingerprint: &reg.Fingerprint, PairedAt: &reg.PairedAt,
		ServerPublicKey: reg.ServerPublicKey}
	dn := reg.Name
	if *name != "" {
		dn = *name
	}
	st.DeviceName = &dn
	if err := pairing.SaveState(e.lay, st); err != nil {
		return fail(std, err)
	}
	fmt.Fprintf(std.out, "paired as \"%s\" (device %s) with %s\n", term.Sanitize(dn), term.Sanitize(reg.DeviceID), term.Sanitize(*server))
	if old.Paired() && old.ServerPublicKey != nil && reg.ServerPublicKey != nil && *old.ServerPublicKey != *reg.ServerPublicKey {
		fmt.Fprintf(std.err, "note: the pinned server key changed from %s to %s\n", term.Sanitize(*old.ServerPublicKey), term.Sanitize(*reg.ServerPublicKey))
	}
	if reg.ServerPublicKey == nil || *reg.ServerPublicKey == "" {
		fmt.Fprintln(std.err, "warning: the server has no signing key, so `metnos-agent run` will refuse to start: create its author key, then pair again")
	}
	if r.cmd == "pair" {
		fmt.Fprintf(std.out, "fingerprint: %s (the admin sees these 16 digits in the \"fingerprint\" column of the server's Devices page, /admin/devices: compare them)\n",
			groupedFingerprint(key.Public().(ed25519.PublicKey)))
		return r.afterPairing(std)
	}
	return exitOK
}

// holdRunLock takes the lock `run` holds (lay's Lock) for a command
// that changes the pairing, so that no agent serves the pairing while
// it changes and none starts until release is called. When an agent
// runs, it says which process and how to stop it, and ok is false with
// the exit status in code.
func holdRunLock(std stdio, lay layout.Layout, doing string) (release func(), code int, ok bool) {
	held, err := lockfile.Lock(lay.Lock())
	if err == nil {
		return func() { held.Release() }, 0, true
	}
	if !errors.Is(err, lockfile.ErrLocked) {
		return nil, fail(std, err), false
	}
	who := "metnos-agent is running"
	if pid, ok, _ := lockfile.LockHolder(lay.Lock()); ok && pid > 0 {
		who = fmt.Sprintf("metnos-agent is running (pid %d)", pid)
	}
	fmt.Fprintf(std.err, "metnos-agent: %s, serving the current pairing: stop it first with `systemctl --user stop metnos-agent` (or Ctrl-C in its terminal), then retry %s\n", who, doing)
	return nil, exitLocked, false
}

// confirmRepair says what pairing again replaces and, when the new
// server is another one, asks on a terminal unless force; without a
// terminal and without force it refuses. ok says to go on; otherwise
// code is the exit status.
func confirmRepair(std stdio, old pairing.State, server, cmd string, force bool) (code int, ok bool) {
	oldServer := "-"
	if old.ServerURL != nil {
		oldServer = *old.ServerURL
	}
	if sameServer(oldServer, server) {
		fmt.Fprintf(std.err, "note: this device is paired with %s as device %s; pairing again replaces that pairing and its pinned server key\n", term.Sanitize(oldServer), term.Sanitize(*old.DeviceID))
		return 0, true
	}
	fmt.Fprintf(std.err, "this device is paired with %s as device %s: pairing with %s replaces the pinned server key and the server, and %s will no longer reach this device (revoke it on that server's Devices page)\n",
		term.Sanitize(oldServer), term.Sanitize(*old.DeviceID), term.Sanitize(server), term.Sanitize(oldServer))
	if force {
		return 0, true
	}
	if std.in == nil || !xterm.IsTerminal(int(std.in.Fd())) {
		fmt.Fprintf(std.err, "metnos-agent: not replaced: run %s again with --force to replace the pairing\n", cmd)
		return exitFailure, false
	}
	if !askYes(std.in, std.err, "Replace it? [y/N] ") {
		fmt.Fprintln(std.err, "metnos-agent: not replaced; the pairing is unchanged")
		return exitFailure, false
	}
	return 0, true
}

// askYes writes question to w and reports whether the line read from r
// is y or yes (any case).
func askYes(r io.Reader, w io.Writer, question string) bool {
	fmt.Fprint(w, question)
	line, _ := bufio.NewReader(r).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

// sameServer reports whether two server URLs name the same server:
// equal but for the case of the scheme and host and a trailing slash.
func sameServer(a, b string) bool {
	norm := func(s string) string {
		u, err := url.Parse(s)
		if err != nil {
			return s
		}
		return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host) + strings.TrimRight(u.Path, "/")
	}
	return norm(a) == norm(b)
}

func runWhoami(std stdio, args []string) int {
	fs := newFlagSet("whoami", std, "Show this device's identity and pairing. It changes nothing: on a device that was never paired there is no key yet.")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "whoami", "whoami takes no arguments (got %q)", term.Sanitize(fs.Arg(0)))
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	data := e.lay.Data
	key, keyErr := pairing.LoadKey(e.lay)
	st, err := pairing.LoadState(e.lay)
	if err != nil {
		return fail(std, err)
	}
	s := func(p *string) string {
		if p == nil || *p == "" {
			return "-"
		}
		return term.Sanitize(*p)
	}
	w := std.out
	if !st.Paired() {
		fmt.Fprintln(w, "paired:              no (run `metnos-agent pair LINK` with the join link the admin sent, or `metnos-agent register --server URL --token TOKEN`)")
	} else {
		fmt.Fprintf(w, "device id:           %s\n", s(st.DeviceID))
		fmt.Fprintf(w, "name:                %s\n", s(st.DeviceName))
		fmt.Fprintf(w, "server:              %s\n", s(st.ServerURL))
		fmt.Fprintf(w, "paired at:           %s\n", s(st.PairedAt))
	}
	switch {
	case errors.Is(keyErr, pairing.ErrNoKey) && !st.Paired():
		fmt.Fprintf(w, "device key:          none yet (not paired, no key yet: `metnos-agent register` makes one in %s)\n", e.lay.Key())
	case keyErr != nil:
		fmt.Fprintf(w, "device key:          unusable: %s\n", term.Sanitize(keyErr.Error()))
	default:
		pub := key.Public().(ed25519.PublicKey)
		fmt.Fprintf(w, "device key (hex):    %s   (what the Rust client's whoami calls its fingerprint)\n", pairing.LocalFingerprint(pub))
		fmt.Fprintf(w, "server fingerprint:  %s   (SHA-256 of the device key, as the server's Devices page shows it)\n", wire.ServerFingerprint(pub))
		if st.Fingerprint != nil && *st.Fingerprint != wire.ServerFingerprint(pub) {
			fmt.Fprintf(w, "warning: state.json records the fingerprint %s, which is not this key's: the key changed since pairing; pair again\n", s(st.Fingerprint))
		}
	}
	if st.Paired() {
		if sk, err := st.ServerKey(); err == nil {
			fmt.Fprintf(w, "server key (pinned): %s\n", wire.PublicKeyWire(sk))
		} else {
			fmt.Fprintf(w, "server key (pinned): none (%s)\n", term.Sanitize(err.Error()))
		}
	}
	printTailnet(w, e.lay)
	printRuns(w, e.lay)
	fmt.Fprintf(w, "data dir:            %s\n", data)
	if keyErr != nil && st.Paired() {
		return exitFailure
	}
	return exitOK
}

func runUnpair(std stdio, args []string) int {
	fs := newFlagSet("unpair", std, "Forget the pairing (state.json). The device key stays, so pairing again gives the same device. Refused while `metnos-agent run` serves the pairing.")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "unpair", "unpair takes no arguments (got %q)", term.Sanitize(fs.Arg(0)))
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	if _, err := os.Lstat(e.lay.State()); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(std.out, "this device was not paired")
		return exitOK
	}
	release, code, ok := holdRunLock(std, e.lay, "unpair")
	if !ok {
		return code
	}
	defer release()
	err = os.Remove(e.lay.State())
	switch {
	case errors.Is(err, os.ErrNotExist):
		fmt.Fprintln(std.out, "this device was not paired")
	case err != nil:
		return fail(std, err)
	default:
		fmt.Fprintln(std.out, "unpaired: state.json removed; the device key is kept (revoke the device on the server's Devices page too)")
	}
	return exitOK
}

// warnLogger logs warnings and errors to stderr: what a command that is
// not the agent shows of the tailnet node.
func warnLogger(std stdio) *slog.Logger {
	return slog.New(slog.NewTextHandler(std.err, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// fail prints err and returns exitFailure. The error may carry what a
// server said, so it is sanitised for the terminal.
func fail(std stdio, err error) int {
	fmt.Fprintf(std.err, "metnos-agent: %s\n", term.SanitizeLines(err.Error()))
	return exitFailure
}
