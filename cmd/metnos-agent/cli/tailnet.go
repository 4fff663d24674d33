package cli

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/tailnet"
)

// tailnetFlags are the tailnet options of register and run; the zero
// value is a command without them.
type tailnetFlags struct {
	control, authKey, authKeyFile, name *string
	logUpload                           *bool
	wait                                *time.Duration
}

func addTailnetFlags(fs *flag.FlagSet) tailnetFlags {
	return tailnetFlags{
		control:     fs.String("tailnet-control-url", "", "join the tailnet of this control server (Headscale) with an embedded node, and reach the server through it"),
		authKey:     fs.String("tailnet-authkey", "", "the auth key of the first login (also $METNOS_TAILNET_AUTHKEY; prefer --tailnet-authkey-file)"),
		authKeyFile: fs.String("tailnet-authkey-file", "", "a file (mode 0600) holding the auth key"),
		name:        fs.String("tailnet-name", "", "the node's name on the tailnet (default: the device name)"),
		logUpload:   fs.Bool("tailnet-log-upload", false, "let the node upload its logs to Tailscale (off unless asked)"),
		wait:        fs.Duration("tailnet-wait", 5*time.Minute, "how long to wait for the node to join the tailnet before giving up"),
	}
}

// config merges the flags with what lay's tailnet.json keeps, and
// envKey (METNOS_TAILNET_AUTHKEY) when no flag gives a key; ok is false
// when no tailnet is configured (the OS network is used).
func (f tailnetFlags) config(lay layout.Layout, deviceName string, envKey config.Secret) (tailnet.Config, bool, error) {
	control, name, keyFile := deref(f.control), deref(f.name), deref(f.authKeyFile)
	if err := f.check(); err != nil {
		return tailnet.Config{}, false, err
	}
	c, ok, err := tailnet.LoadConfig(lay)
	if err != nil {
		return c, false, err
	}
	if control == "" {
		if err := tailnet.CheckControlURL(c.ControlURL); err != nil {
			return c, false, fmt.Errorf("%s: %w; fix it or run register again with --tailnet-control-url", lay.TailnetConfig(), err)
		}
	}
	key := deref(f.authKey)
	if key == "" {
		key = string(envKey)
	}
	if keyFile != "" {
		if key, err = tailnet.ReadAuthKey(keyFile); err != nil {
			return c, false, err
		}
	}
	if control != "" || key != "" || name != "" {
		ok = true
	}
	if control != "" {
		c.ControlURL = control
	}
	if name != "" {
		c.Hostname = name
	}
	if f.logUpload != nil && *f.logUpload {
		c.LogUpload = true
	}
	if c.Hostname == "" {
		c.Hostname = deviceName
	}
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	c.AuthKey = key
	return c, ok, nil
}

// check refuses a --tailnet-control-url that is no control server's
// URL and a --tailnet-wait that is not positive.
func (f tailnetFlags) check() error {
	if err := tailnet.CheckControlURL(deref(f.control)); err != nil {
		return err
	}
	if f.wait != nil && *f.wait <= 0 {
		return fmt.Errorf("--tailnet-wait %s: want a positive duration, e.g. 10m", *f.wait)
	}
	return nil
}

// waitFor is --tailnet-wait, or 0 for a command without it.
func (f tailnetFlags) waitFor() time.Duration {
	if f.wait == nil {
		return 0
	}
	return *f.wait
}

// deref is *p, or "" for a flag the command does not have.
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// printTailnet adds the tailnet lines to whoami and doctor.
func printTailnet(w interface{ Write([]byte) (int, error) }, lay layout.Layout) {
	c, ok, err := tailnet.LoadConfig(lay)
	switch {
	case err != nil:
		fmt.Fprintf(w, "tailnet:             %v\n", err)
		return
	case !ok:
		fmt.Fprintln(w, "tailnet:             none (the server is reached over the OS network)")
		return
	}
	control := c.ControlURL
	if control == "" {
		control = "Tailscale"
	}
	fmt.Fprintf(w, "tailnet node:        %s (control %s)\n", c.Hostname, control)
	st, ok := tailnet.LastStatus(lay)
	if !ok {
		fmt.Fprintln(w, "tailnet state:       unknown (no agent has run with it yet)")
		return
	}
	for _, l := range describeTailnet(st, time.Now()) {
		fmt.Fprintln(w, l)
	}
}

// answerFresh is how long after the server's last answer the tailnet
// still counts as working: a running agent hears from the server at
// least every poll (25 s) and heartbeat (30 s).
const answerFresh = 90 * time.Second

// statusStale is the age past which a status file no longer comes from
// a running agent (a running one rewrites it at least every 30 s).
const statusStale = 2 * time.Minute

// describeTailnet is what whoami and doctor say of the node from the
// status st a running agent last recorded, at now: whether the server
// answers through it, and the node's own view (control, DERP, peers).
// "Up" is never said of a node that only runs: it takes the server's
// answer.
func describeTailnet(st tailnet.Status, now time.Time) []string {
	outage := st.Outage()
	answered := st.ServerAnswered
	var head string
	switch {
	case answered.IsZero() && outage != "":
		head = "no answer from the server yet (" + outage + ")"
	case answered.IsZero():
		head = "no answer from the server yet"
	case outage == "" && st.At.Sub(answered) <= answerFresh:
		head = "node up, server last answered " + ago(now.Sub(answered))
	case outage != "":
		head = "no answer from the server since " + clock(answered, now) + " (" + outage + ")"
	default:
		head = "no answer from the server since " + clock(answered, now) + " (the node itself sees the tailnet up)"
	}
	// A status no running agent keeps is history: no "up" in it.
	last := "the server never answered it"
	if !answered.IsZero() {
		last = "the server last answered it at " + clock(answered, now)
	}
	switch {
	case st.Stopped:
		head = "no agent running (it stopped at " + clock(st.At, now) + "); " + last
	case now.Sub(st.At) > statusStale:
		head = "no running agent has updated this since " + clock(st.At, now) + "; " + last
	}
	control := "control unreachable"
	if st.ControlReachable {
		control = "control reachable"
	}
	derp := "no DERP relay"
	switch {
	case st.DERPHome != "" && st.DERPReachable:
		derp = "DERP relay " + st.DERPHome
	case st.DERPHome != "":
		derp = "DERP relay " + st.DERPHome + " unreachable"
	}
	if !st.DERPLastFrame.IsZero() && !st.DERPReachable {
		derp += " (last heard from at " + clock(st.DERPLastFrame, now) + ")"
	}
	running := "running"
	if !st.Running {
		running = "not running"
	}
	out := []string{
		"tailnet:             " + head,
		fmt.Sprintf("tailnet node state:  %s, IPs %v, %s, %s, as of %s",
			running, st.IPs, control, derp, st.At.Local().Format(time.RFC3339)),
		"tailnet peers:       " + describePeers(st, now),
	}
	if st.LastError != "" {
		out = append(out, "tailnet last error:  "+tailnetText(st.LastError))
	}
	if st.LoginURL != "" {
		out = append(out, "tailnet login:       "+tailnetText(st.LoginURL))
	}
	return out
}

// describePeers is how many of the node's peers are online, in
// control's word, and as of when: the node learns it only from its poll
// of control, so while control is unreachable the count is the one
// control last gave, dated, or none when control was not reached since
// the agent started.
func describePeers(st tailnet.Status, now time.Time) string {
	seen := st.ControlSeen
	if seen.IsZero() && st.ControlReachable {
		seen = st.At // a status written before ControlSeen existed
	}
	switch {
	case seen.IsZero():
		return fmt.Sprintf("%d known, whether online unknown (control not reached since the agent started)", st.Peers)
	case !st.ControlReachable:
		return fmt.Sprintf("%d of %d online as of %s, when control was last reached", st.PeersOnline, st.Peers, clock(seen, now))
	}
	return fmt.Sprintf("%d of %d online as of %s", st.PeersOnline, st.Peers, clock(seen, now))
}

// ago is d as "12 s ago", "3 min ago" or "5 h ago".
func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s ago", max(0, int(d/time.Second)))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d/time.Minute))
	}
	return fmt.Sprintf("%d h ago", int(d/time.Hour))
}

// clock is t in local time, as 15:04:05 on now's day, else with its
// date.
func clock(t, now time.Time) string {
	t, now = t.Local(), now.Local()
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format("15:04:05")
	}
	return t.Format("2006-01-02 15:04:05")
}

// tailnetText drops the control characters of s, which comes from the
// node or the control server, before it is shown on a terminal.
func tailnetText(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return -1
		}
		return r
	}, s)
}
