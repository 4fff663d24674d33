package cli

import (
	"flag"
	"fmt"
	"os"
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
}

func addTailnetFlags(fs *flag.FlagSet) tailnetFlags {
	return tailnetFlags{
		control:     fs.String("tailnet-control-url", "", "join the tailnet of this control server (Headscale) with an embedded node, and reach the server through it"),
		authKey:     fs.String("tailnet-authkey", "", "the auth key of the first login (also $METNOS_TAILNET_AUTHKEY; prefer --tailnet-authkey-file)"),
		authKeyFile: fs.String("tailnet-authkey-file", "", "a file (mode 0600) holding the auth key"),
		name:        fs.String("tailnet-name", "", "the node's name on the tailnet (default: the device name)"),
		logUpload:   fs.Bool("tailnet-log-upload", false, "let the node upload its logs to Tailscale (off unless asked)"),
	}
}

// config merges the flags with what lay's tailnet.json keeps, and
// envKey (METNOS_TAILNET_AUTHKEY) when no flag gives a key; ok is false
// when no tailnet is configured (the OS network is used).
func (f tailnetFlags) config(lay layout.Layout, deviceName string, envKey config.Secret) (tailnet.Config, bool, error) {
	c, ok, err := tailnet.LoadConfig(lay)
	if err != nil {
		return c, false, err
	}
	control, name, keyFile := deref(f.control), deref(f.name), deref(f.authKeyFile)
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
	state := "not connected"
	if st.Connected {
		state = "connected"
	}
	fmt.Fprintf(w, "tailnet state:       %s, IPs %v, as of %s\n", state, st.IPs, st.At.Format(time.RFC3339))
	if st.LastError != "" {
		fmt.Fprintf(w, "tailnet last error:  %s\n", st.LastError)
	}
	if st.LoginURL != "" {
		fmt.Fprintf(w, "tailnet login:       %s\n", st.LoginURL)
	}
}
