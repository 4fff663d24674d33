package cli

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/metnos/agent/agent"
	"github.com/metnos/agent/client"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/tailnet"
)

// connectOptions say how a command reaches the server.
type connectOptions struct {
	// server is the server's URL: register's --server (there is no
	// pairing yet), or run's --server over the paired one ("": the
	// paired one).
	server string
	// unpaired is set by register: no pairing is applied, and the
	// client has no device id.
	unpaired bool
	// key is register's device key ([pairing.LoadOrNewKey]: a new one
	// is written only once the server paired it); other commands use
	// the paired device's key.
	key ed25519.PrivateKey
	// name names the tailnet node when neither the flags nor
	// tailnet.json do ("": the paired device's name).
	name string
	// tailnet are the command's tailnet flags (the zero value:
	// tailnet.json alone decides).
	tailnet tailnetFlags
	// wait bounds the joining of the tailnet (0: --tailnet-wait, else 5
	// minutes).
	wait time.Duration
	// progress, when set, gets a line every few seconds while the node
	// joins the tailnet (nil: the log gets them, at info).
	progress io.Writer
}

// connect is the one step by which every command that talks to the
// server reaches it. It applies the pairing (state.json: the server's
// URL and the device id, with the device key) and the tailnet (the
// flags or tailnet.json: it starts the embedded node, and the client
// dials through it). node is nil on the OS network; otherwise close it
// when done.
func connect(ctx context.Context, e environment, o connectOptions, log *slog.Logger) (c *client.Client, node *tailnet.Node, err error) {
	// Bad flags are refused before anything is read or written.
	if err := o.tailnet.check(); err != nil {
		return nil, nil, err
	}
	server, deviceID, name := o.server, "", o.name
	key := o.key
	if !o.unpaired {
		// The pairing first: an unpaired device gets no key made.
		st, err := pairing.LoadState(e.lay)
		if err != nil {
			return nil, nil, err
		}
		if !st.Paired() {
			return nil, nil, agent.ErrNotPaired
		}
		if key, err = pairing.LoadKey(e.lay); err != nil {
			// A missing key of a paired device: say so, write nothing.
			_, _, err = pairing.LoadOrNewKey(e.lay)
			return nil, nil, err
		}
		deviceID = *st.DeviceID
		if server == "" && st.ServerURL != nil {
			server = *st.ServerURL
		}
		if name == "" && st.DeviceName != nil {
			name = *st.DeviceName
		}
	}
	if key == nil {
		return nil, nil, errors.New("no device key to register with")
	}
	if server == "" {
		return nil, nil, errors.New("no server URL: pass --server, or pair again")
	}
	if err := pairing.CheckServerURL(server); err != nil {
		return nil, nil, err
	}
	tc, useTailnet, err := o.tailnet.config(e.lay, name, e.cfg.TailnetAuthKey)
	if err != nil {
		return nil, nil, err
	}
	if !useTailnet {
		return client.New(server, key, deviceID, nil), nil, nil
	}
	wait := o.wait
	if wait == 0 {
		wait = o.tailnet.waitFor()
	}
	if o.progress != nil {
		tc.Progress = func(line string) { fmt.Fprintln(o.progress, line) }
	} else {
		tc.Progress = func(line string) { log.Info(line) }
	}
	node, err = joinTailnet(ctx, e.lay, tc, wait, e.cfg.GoMemLimit == "", log)
	if err != nil {
		return nil, nil, err
	}
	c = client.New(server, key, deviceID, node.Dial)
	// Back from an outage, the polls in flight may sit on connections
	// that died with the path: new ones, at once, instead of waiting for
	// the poll's idle limit.
	node.OnBack(func() {
		log.Info("tailnet back: the polls in flight start again on new connections to the server")
		c.Reconnect()
	})
	return c, node, nil
}

// joinTailnet starts the embedded node, within wait (0: 5 minutes), and
// records its configuration in tailnet.json; with setMemLimit (no
// GOMEMLIMIT) it sets a soft memory limit first.
func joinTailnet(ctx context.Context, lay layout.Layout, c tailnet.Config, wait time.Duration, setMemLimit bool, log *slog.Logger) (*tailnet.Node, error) {
	if wait == 0 {
		wait = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	// From here on, this process and everything it starts, executors
	// included, may not listen(2): the agent serves nothing, and the
	// embedded node would otherwise open a kernel listener for its peer
	// API. It is process-wide and for good, and only ever done here,
	// when a tailnet is configured (see tailnet.DenyListen).
	if err := tailnet.DenyListen(); err != nil {
		return nil, err
	}
	// The node's buffers make the heap grow in bursts; a soft limit lets
	// the collector give the memory back while the agent idles.
	if setMemLimit {
		debug.SetMemoryLimit(24 << 20)
	}
	n, err := tailnet.Start(ctx, lay, c, log)
	if err != nil {
		return nil, err
	}
	if err := tailnet.SaveConfig(lay, c); err != nil {
		n.Close()
		return nil, fmt.Errorf("%s: %w", lay.Data, err)
	}
	return n, nil
}
