//go:build linux

package hostile

import (
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
)

// sink is a host listener that counts what reaches it.
type sink struct {
	name string
	hits atomic.Int64
	ln   net.Listener
	pc   net.PacketConn
}

func listenSink(t *testing.T, network, addr string) *sink {
	t.Helper()
	s := &sink{name: network + " " + addr}
	switch network {
	case "udp":
		pc, err := net.ListenPacket(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		s.pc = pc
		s.name = network + " " + pc.LocalAddr().String()
		go func() {
			buf := make([]byte, 2048)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
				s.hits.Add(1)
			}
		}()
	default:
		ln, err := net.Listen(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		s.ln = ln
		s.name = network + " " + ln.Addr().String()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				s.hits.Add(1)
				go func() { io.Copy(io.Discard, c); c.Close() }()
			}
		}()
	}
	t.Cleanup(s.close)
	return s
}

func (s *sink) close() {
	if s.ln != nil {
		s.ln.Close()
	}
	if s.pc != nil {
		s.pc.Close()
	}
}

func (s *sink) port() string {
	var a net.Addr
	if s.ln != nil {
		a = s.ln.Addr()
	} else {
		a = s.pc.LocalAddr()
	}
	_, p, _ := net.SplitHostPort(a.String())
	return p
}

// reached waits for a hit (longer for the outside run, which must get
// one) and resets the count.
func (s *sink) reached(r result) []string {
	wait := 100 * time.Millisecond
	if strings.HasPrefix(r.where, "outside") {
		wait = 3 * time.Second
	}
	for end := time.Now().Add(wait); time.Now().Before(end) && s.hits.Load() == 0; {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.hits.Swap(0); n > 0 {
		return []string{"the host listener " + s.name + " received " + strconv.FormatInt(n, 10) + " connection(s)/packet(s)"}
	}
	return nil
}

const pyTCP = `
try:
    s = socket.create_connection(("127.0.0.1", {{PORT}}), timeout=3)
    s.sendall(b"PWNED")
    s.close()
    print("connected")
except OSError as e:
    print("blocked:", e)
    sys.exit(1)
`

const pyUDP = `
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(3):
        s.sendto(b"PWNED", ("127.0.0.1", {{PORT}}))
    print("sent")
except OSError as e:
    print("blocked:", e)
    sys.exit(1)
`

const pyUnix = `
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect({{ADDR}})
    s.sendall(b"PWNED")
    s.close()
    print("connected")
except OSError as e:
    print("blocked:", e)
    sys.exit(1)
`

// unixOpen is a hand-built Policy that lets the command create AF_UNIX
// sockets, as full-fs-no-net does, with the home writable and the
// session IPC masked.
func unixOpen(t *testing.T, fx *fixture) policy.Policy {
	p := fx.profile(t, policy.ProfileSupervised, nil, []string{fx.Home}, false)
	p.UnixSockets = true
	return p
}

// TestNetwork: a policy without network reaches no host listener, by
// TCP, UDP, a Unix socket in a write grant, the session bus or an
// abstract socket.
func TestNetwork(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		tcp := listenSink(t, "tcp", "127.0.0.1:0")
		udp := listenSink(t, "udp", "127.0.0.1:0")
		noNet := []readPolicy{
			{name: "supervised", policy: supervised(nil, []string{"{{WORK}}"})},
			{name: "readonly-profile", policy: profileOnly(policy.ProfileReadonly)},
			{name: "full-fs-no-net-profile", policy: profileOnly(policy.ProfileFullFSNoNet), bwrapOnly: true},
		}
		for _, rp := range noNet {
			if rp.bwrapOnly && !m.bwrap {
				continue
			}
			fx.set("PORT", tcp.port())
			attack(t, fx, m, attackCase{
				name: "tcp-to-host/" + rp.name, policy: rp.policy, py: pyTCP,
				landed: func(t *testing.T, fx *fixture, r result) []string { return tcp.reached(r) },
			})
			fx.set("PORT", udp.port())
			attack(t, fx, m, attackCase{
				name: "udp-to-host/" + rp.name, policy: rp.policy, py: pyUDP,
				landed: func(t *testing.T, fx *fixture, r result) []string { return udp.reached(r) },
			})
		}

		// A Unix socket a host service listens on inside a write grant.
		var us *sink
		attack(t, fx, m, attackCase{
			name:   "unix-socket-in-write-grant",
			policy: supervised(nil, []string{"{{WORK}}"}),
			setup: func(t *testing.T, fx *fixture) {
				us = listenSink(t, "unix", fx.Work+"/service.sock")
				fx.set("ADDR", strconvQuote(fx.Work+"/service.sock"))
			},
			py:      pyUnix,
			landed:  func(t *testing.T, fx *fixture, r result) []string { return us.reached(r) },
			cleanup: func(t *testing.T, fx *fixture) { us.close() },
		})

		// The session bus, at $XDG_RUNTIME_DIR/bus and at a
		// $DBUS_SESSION_BUS_ADDRESS path of its own.
		busPols := []readPolicy{
			{name: "home-write-grant", policy: supervised(nil, []string{"{{HOME}}"})},
			{name: "unix-sockets-allowed", policy: unixOpen},
			{name: "full-fs-no-net-profile", policy: profileOnly(policy.ProfileFullFSNoNet), bwrapOnly: true},
		}
		for _, rp := range busPols {
			if rp.bwrapOnly && !m.bwrap {
				continue
			}
			refusable := rp.name == "unix-sockets-allowed"
			var bus *sink
			attack(t, fx, m, attackCase{
				name:   "session-bus-in-runtime-dir/" + rp.name,
				policy: rp.policy,
				setup: func(t *testing.T, fx *fixture) {
					bus = listenSink(t, "unix", fx.RunDir+"/bus")
					fx.set("ADDR", strconvQuote(fx.RunDir+"/bus"))
				},
				py:        pyUnix,
				landed:    func(t *testing.T, fx *fixture, r result) []string { return bus.reached(r) },
				cleanup:   func(t *testing.T, fx *fixture) { bus.close() },
				mayRefuse: refusable,
			})
			attack(t, fx, m, attackCase{
				name: "session-bus-at-own-path/" + rp.name,
				policy: func(t *testing.T, fx *fixture) policy.Policy {
					saved := fx.Host
					defer func() { fx.Host = saved }()
					fx.Host.DBusSession = "unix:path=" + filepath.Join(fx.Home, "dbus", "bus") + ";unix:abstract=/tmp/dbus-x"
					return rp.policy(t, fx)
				},
				setup: func(t *testing.T, fx *fixture) {
					mkdir(t, fx.Home+"/dbus", 0o755)
					bus = listenSink(t, "unix", fx.Home+"/dbus/bus")
					fx.set("ADDR", strconvQuote(fx.Home+"/dbus/bus"))
				},
				py:        pyUnix,
				landed:    func(t *testing.T, fx *fixture, r result) []string { return bus.reached(r) },
				cleanup:   func(t *testing.T, fx *fixture) { bus.close() },
				mayRefuse: refusable,
			})
		}

		// An abstract socket a host service listens on.
		name := token("metnos-test")
		abs := listenSink(t, "unix", "@"+name)
		fx.set("ADDR", strconvQuote("\x00"+name))
		for _, rp := range []readPolicy{
			{name: "supervised", policy: supervised(nil, []string{"{{WORK}}"})},
			{name: "unix-sockets-allowed", policy: unixOpen},
			{name: "full-fs-no-net-profile", policy: profileOnly(policy.ProfileFullFSNoNet), bwrapOnly: true},
		} {
			if rp.bwrapOnly && !m.bwrap {
				continue
			}
			attack(t, fx, m, attackCase{
				name: "abstract-socket/" + rp.name, policy: rp.policy, py: pyUnix,
				mayRefuse: rp.name == "unix-sockets-allowed",
				setup:     func(t *testing.T, fx *fixture) { fx.set("ADDR", strconvQuote("\x00"+name)) },
				landed:    func(t *testing.T, fx *fixture, r result) []string { return abs.reached(r) },
			})
		}
	})
}

// strconvQuote quotes s as a Python string literal (Go's quoting is a
// subset Python reads the same way for these strings).
func strconvQuote(s string) string { return strconv.Quote(s) }
