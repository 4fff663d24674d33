// Package tailnet joins the user's Tailscale or Headscale network with
// an embedded node (tailscale.com/tsnet), so that the agent reaches its
// server over the tailnet without a system Tailscale, root or a TUN
// device.
//
// # What it guarantees
//
//   - The node's state lives in the agent's data folder, in the
//     [layout.Layout]'s TailnetState, never in /var/lib/tailscale; the node is not ephemeral,
//     so it keeps its identity across restarts.
//   - Log upload to Tailscale is off unless Config.LogUpload is set.
//   - The node accepts no connection from the tailnet: it is "shields
//     up", and its peer API is not exempt from that (see [Start]); the
//     agent only dials out through it ([Node.Dial]). Executors never see
//     it (they use the OS network, or none).
//   - [DenyListen], which the agent calls before [Start], makes that
//     hold for the kernel too, on Linux: see its doc for what it costs.
//
// # What it does not guarantee
//
//   - The node binds a UDP socket on the OS for WireGuard (one per
//     address family) and reaches the control server and DERP relays
//     over the OS network, as any Tailscale node does.
//   - Its Hostinfo still advertises the peer API (peerapi4, peerapi6,
//     peerapi-dns-proxy), though nothing answers there, and the agent
//     needs none of it (no Taildrop, no Taildrive, never an exit node).
//     tailscale.com v1.102 has no way to stop that short of rebuilding
//     it: ipnlocal's LocalBackend.hostInfoWithServicesLocked appends
//     peerAPIServicesLocked to every Hostinfo it gives the control
//     client, and that lists peerapi4 and peerapi6 for each peer API
//     listener, which initPeerAPIListenerLocked creates whenever the
//     node has addresses (a netstack stand-in when listen(2) is denied;
//     only the ts_omit_peerapiserver build tag stops it), and
//     peerapi-dns-proxy on every OS the agent runs on, whatever the
//     build tags. No tsnet field, envknob, ipnext hook (its
//     ShouldUploadServices governs only the portlist's services) or
//     hostinfo hook (RegisterHostinfoNewHook runs before the peer API
//     entries are added) reaches it.
package tailnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tailscale.com/client/local"
	"tailscale.com/envknob"
	"tailscale.com/ipn"
	"tailscale.com/tsconst"
	"tailscale.com/tsnet"

	"github.com/metnos/agent/internal/layout"
)

// Config is how the agent joins a tailnet.
type Config struct {
	// ControlURL is the control server (Headscale); "" is Tailscale's.
	ControlURL string `json:"control_url,omitempty"`
	// Hostname is the node's name (default: the device name).
	Hostname string `json:"hostname"`
	// AuthKey authorises the first login; later starts reuse the node's
	// state. It is never written to disk by this package.
	AuthKey string `json:"-"`
	// LogUpload sends the node's logs to Tailscale (off by default).
	LogUpload bool `json:"log_upload,omitempty"`
	// Progress, when set, is told every few seconds, while [Start] waits
	// for the node to join, what it waits for (one line, no newline).
	Progress func(line string) `json:"-"`
}

// CheckControlURL reports whether u can be a control server's URL: ""
// (Tailscale's own), or an http:// or https:// URL with a host and
// nothing after the path.
func CheckControlURL(u string) error {
	if u == "" {
		return nil
	}
	p, err := url.Parse(u)
	if err == nil && (p.Scheme != "http" && p.Scheme != "https" || p.Hostname() == "" || p.User != nil || p.RawQuery != "" || p.Fragment != "") {
		err = errors.New("want an http:// or https:// URL with a host, e.g. https://headscale.example")
	}
	if err != nil {
		return fmt.Errorf("tailnet: control URL %q: %w", u, err)
	}
	return nil
}

// LoadConfig reads lay's TailnetConfig; ok is false when there is none
// (the agent then uses the OS network).
func LoadConfig(lay layout.Layout) (c Config, ok bool, err error) {
	p := lay.TailnetConfig()
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return Config{}, false, nil
	}
	if err != nil {
		return Config{}, false, fmt.Errorf("tailnet: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, false, fmt.Errorf("tailnet: %s: %w", p, err)
	}
	return c, true, nil
}

// SaveConfig writes lay's TailnetConfig (without the auth key).
func SaveConfig(lay layout.Layout, c Config) error {
	b, _ := json.MarshalIndent(c, "", "  ")
	p := lay.TailnetConfig()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("tailnet: %w", err)
	}
	return os.WriteFile(p, b, 0o600)
}

// ReadAuthKey reads an auth key from a file that only its owner may read
// (mode 0600 or stricter).
func ReadAuthKey(path string) (string, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("tailnet: the auth key file %s does not exist: check --tailnet-authkey-file (a file holding the tailnet's auth key, mode 0600)", path)
	}
	if err != nil {
		return "", fmt.Errorf("tailnet: auth key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("tailnet: auth key file %s is readable by others (%v); chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("tailnet: auth key file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Node is a running embedded tailnet node.
type Node struct {
	s   *tsnet.Server
	cfg Config
	// status is the file the node's status is recorded in.
	status string
	log    *slog.Logger
	mu     sync.Mutex
	last   string
	// answered is when the server last sent anything over a connection
	// dialled through the node (Unix nanoseconds; 0: never).
	answered atomic.Int64
	// controlSeen is when [Node.Status] last found the node in its long
	// poll of control (Unix nanoseconds; 0: never).
	controlSeen atomic.Int64
	// stop ends the watch goroutine; done is closed when it has ended.
	stop, done chan struct{}
	// back is called when the node gets the tailnet back after an
	// outage (see [Node.OnBack]).
	back atomic.Pointer[func()]
}

// OnBack sets f to be called, from the node's own goroutine, each time
// the node finds the tailnet again after an outage it logged: the
// connections made through it before may be dead without anything on
// them saying so yet (a long poll waits in silence), so a client drops
// them then (client.Client.Reconnect).
func (n *Node) OnBack(f func()) { n.back.Store(&f) }

// Status is what whoami and doctor show of the node: the node's own
// view of the tailnet, and when the server last answered through it.
type Status struct {
	Hostname   string   `json:"hostname"`
	ControlURL string   `json:"control_url"`
	IPs        []string `json:"ips,omitempty"`
	// Running is the node's backend running (logged in, with
	// addresses). It says nothing of what can be reached: see the
	// fields below.
	Running bool `json:"running"`
	// ControlReachable is the node in its long poll of the control
	// server.
	ControlReachable bool `json:"control_reachable"`
	// ControlSeen is when the node was last found in that poll (zero:
	// not since the agent started): the peers' state below is control's
	// word as of then, however old, while control is unreachable.
	ControlSeen time.Time `json:"control_seen,omitzero"`
	// DERPHome is the region code of the node's home DERP relay ("":
	// none); DERPReachable is false when the node reports that it cannot
	// reach it, has not heard from it for over 2 minutes, or has none.
	DERPHome      string `json:"derp_home,omitempty"`
	DERPReachable bool   `json:"derp_reachable"`
	// DERPLastFrame is when the node last heard from its home relay
	// (zero: unknown).
	DERPLastFrame time.Time `json:"derp_last_frame,omitzero"`
	// Peers is how many peers the node knows, PeersOnline how many of
	// them control last said were online (at ControlSeen).
	Peers       int `json:"peers"`
	PeersOnline int `json:"peers_online"`
	// ServerAnswered is when the server last sent anything over a
	// connection through the node (zero: not since the agent started).
	ServerAnswered time.Time `json:"server_answered,omitzero"`
	// Health is the node's own warnings.
	Health    []string  `json:"health,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	LoginURL  string    `json:"login_url,omitempty"`
	At        time.Time `json:"at"`
	// Stopped is set by the last status an agent wrote as it stopped.
	Stopped bool `json:"stopped,omitempty"`
}

// Outage says what of the tailnet the node cannot reach ("": nothing
// it knows of), e.g. "control unreachable, DERP relay test unreachable".
// Peers are not judged: whether they are online is control's word,
// which not every control server keeps (the server's answers say more).
func (s Status) Outage() string {
	var out []string
	if !s.Running {
		out = append(out, "node not running")
	}
	if !s.ControlReachable {
		out = append(out, "control unreachable")
	}
	if !s.DERPReachable {
		if s.DERPHome != "" {
			out = append(out, "DERP relay "+s.DERPHome+" unreachable")
		} else {
			out = append(out, "no DERP relay")
		}
	}
	return strings.Join(out, ", ")
}

// Start brings the node up with its state in lay's TailnetState,
// refusing every connection from the tailnet, and waits until it is
// connected (or ctx ends). Without an auth key on a
// first login, it logs the login URL to open and keeps waiting.
func Start(ctx context.Context, lay layout.Layout, c Config, log *slog.Logger) (*Node, error) {
	if c.Hostname == "" {
		return nil, errors.New("tailnet: the node needs a name")
	}
	if err := CheckControlURL(c.ControlURL); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !c.LogUpload {
		envknob.Setenv("TS_NO_LOGS_NO_SUPPORT", "true")
	}
	dir := lay.TailnetState()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("tailnet: %w", err)
	}
	n := &Node{cfg: c, status: lay.TailnetStatus(), log: log}
	n.s = &tsnet.Server{
		Dir:        dir,
		Hostname:   c.Hostname,
		ControlURL: c.ControlURL,
		AuthKey:    c.AuthKey,
		Ephemeral:  false,
		Logf:       func(string, ...any) {},
		UserLogf: func(format string, args ...any) {
			msg := fmt.Sprintf(format, args...)
			if strings.Contains(msg, "://") && (strings.Contains(msg, "auth") || strings.Contains(msg, "login")) {
				// A first login without an auth key: the user must open it.
				n.setLoginURL(msg)
				log.Warn("tailnet: log this device in: " + msg)
				return
			}
			log.Info("tailnet: " + msg)
		},
	}
	if err := n.shieldsUp(ctx); err != nil {
		n.s.Close()
		return nil, err
	}
	stopProgress := n.progress(ctx, c.Progress)
	_, err := n.s.Up(ctx)
	waited := stopProgress()
	if err != nil {
		n.s.Close()
		n.note(err)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("tailnet: could not join the tailnet of %s as %s within %s: check the control URL, that this machine reaches it, and the auth key (--tailnet-authkey-file), or allow longer with --tailnet-wait",
				controlName(c.ControlURL), c.Hostname, waited.Round(time.Second))
		}
		return nil, fmt.Errorf("tailnet: joining %s as %s: %w", controlName(c.ControlURL), c.Hostname, err)
	}
	n.writeStatus(ctx)
	n.stop, n.done = make(chan struct{}), make(chan struct{})
	go n.watch(watchEvery)
	return n, nil
}

// progressEvery is how often Start says what it waits for.
const progressEvery = 5 * time.Second

// progress tells report, every progressEvery until the returned stop
// is called, what joining the tailnet waits for; stop returns how long
// it waited.
func (n *Node) progress(ctx context.Context, report func(string)) (stop func() time.Duration) {
	start := time.Now()
	if report == nil {
		return func() time.Duration { return time.Since(start) }
	}
	host := "Tailscale"
	if u, err := url.Parse(n.cfg.ControlURL); err == nil && u.Host != "" {
		host = u.Host
	}
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			what := "waiting for control"
			if lc, err := n.s.LocalClient(); err == nil {
				sctx, cancel := context.WithTimeout(ctx, time.Second)
				st, err := lc.StatusWithoutPeers(sctx)
				cancel()
				if err == nil {
					switch {
					case st.AuthURL != "":
						what = "waiting for this device to be logged in at " + st.AuthURL
					case st.BackendState == ipn.NeedsMachineAuth.String():
						what = "waiting for the tailnet's admin to approve this device"
					case st.BackendState == ipn.Starting.String() && st.Self != nil && st.Self.Online:
						what = "waiting for the tailnet to be set up"
					}
				}
			}
			report(fmt.Sprintf("joining the tailnet at %s: %s (%d s)…", host, what, int(time.Since(start).Seconds())))
		}
	}()
	return func() time.Duration {
		close(done)
		<-ended
		return time.Since(start)
	}
}

// watchEvery is how often the node's goroutine looks at its state.
const watchEvery = 5 * time.Second

// statusEvery is how often the status file is rewritten when nothing
// in it changed but the time.
const statusEvery = 30 * time.Second

// watch looks at the node's state every period until Close: it logs,
// once, when the node loses the tailnet (at warn, "tailnet unreachable:
// …") and when it gets it back (at info), and keeps the status file
// current, so that whoami sees an outage even when no heartbeat gets
// through.
func (n *Node) watch(period time.Duration) {
	defer close(n.done)
	t := time.NewTicker(period)
	defer t.Stop()
	var (
		down      string
		downSince time.Time
		written   = time.Now()
	)
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), period)
		st := n.Status(ctx)
		cancel()
		outage := st.Outage()
		switch {
		case outage != "" && down == "":
			downSince = st.At
			n.log.Warn("tailnet unreachable: "+outage, "control", st.ControlURL, "server_answered", formatTime(st.ServerAnswered))
		case outage == "" && down != "":
			n.log.Info("tailnet reachable again", "control", st.ControlURL, "after", st.At.Sub(downSince).Round(time.Second).String())
			if f := n.back.Load(); f != nil {
				(*f)()
			}
		}
		if outage != down || time.Since(written) >= statusEvery {
			n.write(st)
			written = time.Now()
		}
		down = outage
	}
}

// formatTime is t for a log line, or "never".
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format(time.RFC3339)
}

// shieldsUp starts the node's backend and, before it joins, makes it
// accept no connection from the tailnet:
//
//   - its "shields up" preference, so that its packet filter drops
//     every connection a peer opens to it (tsnet resets the preferences
//     at every start, so it is set each time);
//   - and no exemption from that filter for the peer API, which the
//     node serves whatever the preferences say (with listen(2) denied,
//     from its own network stack on port 1: "This is my Tailscale
//     device"), and which tsnet offers no way to turn off.
//
// The agent's own connections out, and their replies, are unaffected.
// The node still advertises its peer API in its Hostinfo (peerapi4,
// peerapi6, peerapi-dns-proxy), which nothing can stop (see the package
// doc): nothing answers there.
func (n *Node) shieldsUp(ctx context.Context) error {
	if err := n.s.Start(); err != nil {
		return fmt.Errorf("tailnet: starting the node in %s: %w", n.s.Dir, err)
	}
	tun, ok := n.s.Sys().Tun.GetOK()
	if !ok {
		return errors.New("tailnet: the node has no packet filter to refuse the tailnet's connections with; not joining")
	}
	// Read only when a packet comes in from a peer, and there is no peer
	// before the node has joined.
	tun.PeerAPIPort = nil
	lc, err := n.s.LocalClient()
	if err == nil {
		_, err = lc.EditPrefs(ctx, &ipn.MaskedPrefs{ShieldsUpSet: true, Prefs: ipn.Prefs{ShieldsUp: true}})
	}
	if err != nil {
		return fmt.Errorf("tailnet: refusing connections from the tailnet (shields up): %w", err)
	}
	return nil
}

func controlName(u string) string {
	if u == "" {
		return "Tailscale"
	}
	return u
}

func (n *Node) setLoginURL(msg string) {
	n.mu.Lock()
	n.last = msg
	n.mu.Unlock()
}

func (n *Node) note(err error) {
	n.mu.Lock()
	n.last = err.Error()
	n.mu.Unlock()
}

// Name is the node's name on the tailnet.
func (n *Node) Name() string { return n.cfg.Hostname }

// Dial connects to addr through the node, over the tailnet; the
// device's server client (package client) dials with it, and nothing
// else does. Whatever the far end sends on the connection counts as the
// server answering (see [Node.ServerAnswered]).
func (n *Node) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := n.s.Dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return answerConn{c, n}, nil
}

// answerConn marks the server as having answered whenever a read from
// it returns data.
type answerConn struct {
	net.Conn
	n *Node
}

func (c answerConn) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	if k > 0 {
		c.n.ServerAnswered(time.Now())
	}
	return k, err
}

// ServerAnswered records that the server answered at t, for the status
// file; [Node.Dial]'s connections call it as data arrives. An earlier
// t than the one recorded is ignored.
func (n *Node) ServerAnswered(t time.Time) { storeLater(&n.answered, t) }

// storeLater stores t in a (Unix nanoseconds) unless a holds a later
// time.
func storeLater(a *atomic.Int64, t time.Time) {
	v := t.UnixNano()
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// Status reports the node's state now.
func (n *Node) Status(ctx context.Context) Status {
	st := Status{Hostname: n.cfg.Hostname, ControlURL: controlName(n.cfg.ControlURL), At: time.Now().UTC()}
	if v := n.answered.Load(); v != 0 {
		st.ServerAnswered = time.Unix(0, v).UTC()
	}
	lc, err := n.s.LocalClient()
	if err != nil {
		lc = nil
	} else {
		if s, err2 := lc.Status(ctx); err2 == nil {
			for _, ip := range s.TailscaleIPs {
				st.IPs = append(st.IPs, ip.String())
			}
			st.Running = s.BackendState == ipn.Running.String()
			if s.AuthURL != "" {
				st.LoginURL = s.AuthURL
			}
			if s.Self != nil {
				st.ControlReachable = s.Self.Online
				st.DERPHome = s.Self.Relay
			}
			if st.ControlReachable {
				storeLater(&n.controlSeen, st.At)
			}
			for _, p := range s.Peer {
				st.Peers++
				if p.Online {
					st.PeersOnline++
				}
			}
			st.Health = s.Health
		} else {
			err = err2
		}
	}
	if st.DERPHome != "" && lc != nil {
		st.DERPReachable, st.DERPLastFrame = n.derpHealthy(ctx, lc, st.DERPHome)
	}
	if v := n.controlSeen.Load(); v != 0 {
		st.ControlSeen = time.Unix(0, v).UTC()
	}
	n.mu.Lock()
	st.LastError = n.last
	n.mu.Unlock()
	if err != nil {
		st.LastError = err.Error()
	}
	return st
}

// derpIdle is how long the node may go without a frame from its home
// DERP relay (which sends a keep-alive every minute) before the relay
// counts as unreachable: tailscale's own threshold.
const derpIdle = 2*time.Minute + 5*time.Second

// derpHealthy reports whether the node's home DERP relay, the region
// whose code is home, is reachable: no warning about it from the node,
// and a frame from it within derpIdle; and when the last frame came.
// (The node's own warnings about its relay are silent while it is cut
// from control, hence the frames.)
func (n *Node) derpHealthy(ctx context.Context, lc *local.Client, home string) (ok bool, last time.Time) {
	sys := n.s.Sys()
	if sys == nil {
		return false, time.Time{}
	}
	ht, ok := sys.HealthTracker.GetOK()
	if !ok {
		return false, time.Time{}
	}
	for code := range ht.CurrentState().Warnings {
		switch code {
		case tsconst.HealthWarnableNoDERPHome, tsconst.HealthWarnableNoDERPConnection, tsconst.HealthWarnableDERPTimedOut:
			return false, time.Time{}
		}
	}
	dm, err := lc.CurrentDERPMap(ctx)
	if err != nil || dm == nil {
		return true, time.Time{}
	}
	for id, r := range dm.Regions {
		if r != nil && r.RegionCode == home {
			last = ht.GetDERPRegionReceivedTime(id)
			return !last.IsZero() && time.Since(last) < derpIdle, last.UTC()
		}
	}
	return true, time.Time{}
}

// writeStatus records the status in the layout's TailnetStatus, for
// whoami and doctor (which do not start a second node on the same
// state).
func (n *Node) writeStatus(ctx context.Context) { n.write(n.Status(ctx)) }

func (n *Node) write(st Status) {
	b, _ := json.MarshalIndent(st, "", "  ")
	p := n.status
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		n.log.Debug("tailnet: recording the node's status", "path", p, "err", err)
		return
	}
	if err := os.Rename(tmp, p); err != nil {
		n.log.Debug("tailnet: recording the node's status", "path", p, "err", err)
	}
}

// Report writes the status file; the agent calls it with each heartbeat.
func (n *Node) Report(ctx context.Context) { n.writeStatus(ctx) }

// Close stops the node, recording its last status as stopped.
func (n *Node) Close() error {
	if n.stop != nil {
		close(n.stop)
		<-n.done
		n.stop = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st := n.Status(ctx)
	cancel()
	st.Stopped = true
	n.write(st)
	return n.s.Close()
}

// LastStatus reads what a running agent last recorded in lay's
// TailnetStatus.
func LastStatus(lay layout.Layout) (Status, bool) {
	b, err := os.ReadFile(lay.TailnetStatus())
	if err != nil {
		return Status{}, false
	}
	var s Status
	return s, json.Unmarshal(b, &s) == nil
}
