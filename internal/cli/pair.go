package cli

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/wire"
)

func runRegister(std stdio, args []string) int {
	fs := newFlagSet("register", std.err, "Pair this device with a Metnos server using a one-time token from its admin page (Devices).")
	server := fs.String("server", "", "the server's device URL, such as http://metnos.tailnet:8765")
	token := fs.String("token", "", "the one-time pairing token (DEV.…)")
	name := fs.String("name", "", "the name this device shows locally (default: the name the server gives it)")
	tf := addTailnetFlags(fs)
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if *server == "" || *token == "" {
		return usageError(std.err, "register", "both --server and --token are needed")
	}
	if !strings.HasPrefix(*server, "http://") && !strings.HasPrefix(*server, "https://") {
		return usageError(std.err, "register", "--server %q must be an http:// URL", *server)
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	c, node, err := connect(context.Background(), e, connectOptions{server: *server, unpaired: true, name: *name, tailnet: tf, progress: std.err}, warnLogger(std))
	if err != nil {
		return fail(std, err)
	}
	if node != nil {
		defer node.Close()
	}
	reg, err := c.Register(context.Background(), *token)
	if err != nil {
		return fail(std, fmt.Errorf("pairing failed: %w", err))
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
	fmt.Fprintf(std.out, "paired as %q (device %s) with %s\n", dn, reg.DeviceID, *server)
	if reg.ServerPublicKey == nil || *reg.ServerPublicKey == "" {
		fmt.Fprintln(std.err, "warning: the server has no signing key, so `metnos-agent run` will refuse to start: create its author key, then pair again")
	}
	return exitOK
}

func runWhoami(std stdio, args []string) int {
	fs := newFlagSet("whoami", std.err, "Show this device's identity and pairing.")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	data := e.lay.Data
	key, err := pairing.LoadOrCreateKey(e.lay)
	if err != nil {
		return fail(std, err)
	}
	st, err := pairing.LoadState(e.lay)
	if err != nil {
		return fail(std, err)
	}
	pub := key.Public().(ed25519.PublicKey)
	s := func(p *string) string {
		if p == nil || *p == "" {
			return "-"
		}
		return *p
	}
	w := std.out
	if !st.Paired() {
		fmt.Fprintln(w, "paired:              no (run `metnos-agent register --server URL --token TOKEN`)")
	} else {
		fmt.Fprintf(w, "device id:           %s\n", s(st.DeviceID))
		fmt.Fprintf(w, "name:                %s\n", s(st.DeviceName))
		fmt.Fprintf(w, "server:              %s\n", s(st.ServerURL))
		fmt.Fprintf(w, "paired at:           %s\n", s(st.PairedAt))
	}
	fmt.Fprintf(w, "device key (hex):    %s   (what the Rust client's whoami calls its fingerprint)\n", pairing.LocalFingerprint(pub))
	fmt.Fprintf(w, "server fingerprint:  %s   (SHA-256 of the device key, as the server's Devices page shows it)\n", wire.ServerFingerprint(pub))
	if st.Fingerprint != nil && *st.Fingerprint != wire.ServerFingerprint(pub) {
		fmt.Fprintf(w, "warning: state.json records the fingerprint %s, which is not this key's: the key changed since pairing; pair again\n", *st.Fingerprint)
	}
	if st.Paired() {
		if sk, err := st.ServerKey(); err == nil {
			fmt.Fprintf(w, "server key (pinned): %s\n", wire.PublicKeyWire(sk))
		} else {
			fmt.Fprintf(w, "server key (pinned): none (%v)\n", err)
		}
	}
	printTailnet(w, e.lay)
	fmt.Fprintf(w, "data dir:            %s\n", data)
	return exitOK
}

func runUnpair(std stdio, args []string) int {
	fs := newFlagSet("unpair", std.err, "Forget the pairing (state.json). The device key stays, so pairing again gives the same device.")
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
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

// fail prints err and returns exitFailure.
func fail(std stdio, err error) int {
	fmt.Fprintf(std.err, "metnos-agent: %v\n", err)
	return exitFailure
}
