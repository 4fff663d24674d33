//go:build linux

package hostile

import (
	"encoding/json"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// The sandbox side of system:read network_interfaces
// (Policy.HostNetView): the run stays in the host's network namespace,
// with the network cut by seccomp (AF_NETLINK NETLINK_ROUTE and, when
// allowed, AF_UNIX only) and Landlock (no TCP bind/connect). It sees
// the host's interfaces and addresses and sends nothing.

// hostNetView is pf with the host's network interfaces in view.
func hostNetView(pf policyFunc) policyFunc {
	return func(t *testing.T, fx *fixture) policy.Policy {
		p := pf(t, fx)
		p.HostNetView = true
		return p
	}
}

// pyNetView prints, as one JSON line after "NETVIEW ", what the
// interface readers a stdlib executor has give: if_nameindex (glibc,
// over rtnetlink), /proc/net/dev, and `ip -j addr` (rtnetlink), with
// the error of each that fails.
const pyNetView = `
import json, subprocess
out = {}
try:
    out["if_nameindex"] = sorted(n for _, n in socket.if_nameindex())
except OSError as e:
    out["if_nameindex"] = "error: %s" % e
try:
    out["proc_net_dev"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
except OSError as e:
    out["proc_net_dev"] = "error: %s" % e
try:
    addrs = {}
    for i in json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout):
        addrs[i["ifname"]] = sorted("%s/%s" % (a["local"], a["prefixlen"]) for a in i.get("addr_info", []))
    out["ip_addr"] = addrs
except Exception as e:
    out["ip_addr"] = "error: %s" % e
print("NETVIEW " + json.dumps(out, sort_keys=True), flush=True)
`

type netView struct {
	IfNameindex any `json:"if_nameindex"`
	ProcNetDev  any `json:"proc_net_dev"`
	IPAddr      any `json:"ip_addr"`
}

func parseNetView(t *testing.T, r result) netView {
	t.Helper()
	for _, line := range strings.Split(r.stdout, "\n") {
		if s, ok := strings.CutPrefix(line, "NETVIEW "); ok {
			var v netView
			if err := json.Unmarshal([]byte(s), &v); err != nil {
				t.Fatalf("probe output %q: %v", s, err)
			}
			return v
		}
	}
	t.Fatalf("the probe printed no view\n%s", r)
	return netView{}
}

// TestHostNetViewInterfaces: with HostNetView, the interfaces and
// addresses seen inside are the host's, by every reader; without it
// (bwrap's own network namespace) only the loopback is there.
func TestHostNetViewInterfaces(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		probe := pyArgv(pyNetView)
		host := parseNetView(t, runOutside(t, fx, probe, 0))
		names, _ := host.IfNameindex.([]any)
		if len(names) < 2 {
			t.Fatalf("the host has %v interfaces: only a loopback, so this test proves nothing", host.IfNameindex)
		}
		base := supervised(nil, []string{"{{WORK}}"})
		r := runInside(t, fx, m, hostNetView(base)(t, fx), probe, sandbox.Limits{})
		in := parseNetView(t, r)
		if !reflect.DeepEqual(in, host) {
			t.Errorf("with HostNetView the view inside differs from the host's:\ninside  %+v\noutside %+v", in, host)
		}
		if !strings.Contains(r.out.Reason, "network namespace read-only") {
			t.Errorf("a run in the host's network namespace gave the reason %q, which does not say so", r.out.Reason)
		}
		if m.bwrap {
			r = runInside(t, fx, m, base(t, fx), probe, sandbox.Limits{})
			own := parseNetView(t, r)
			if reflect.DeepEqual(own, host) {
				t.Errorf("without HostNetView bwrap's run sees the host's interfaces: %+v", own)
			}
			if strings.Contains(r.out.Reason, "network namespace") {
				t.Errorf("a run without HostNetView speaks of the network namespace: %q", r.out.Reason)
			}
		}
	})
}

// nlSink is a host NETLINK_ROUTE socket (bound to a port id of its own)
// that counts what reaches it.
type nlSink struct {
	fd   int
	pid  uint32
	hits atomic.Int64
}

func listenNetlink(t *testing.T, proto int) *nlSink {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, proto)
	if err != nil {
		t.Fatalf("netlink socket %d: %v", proto, err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	s := &nlSink{fd: fd, pid: sa.(*syscall.SockaddrNetlink).Pid}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := syscall.Recvfrom(fd, buf, 0)
			if err != nil {
				return
			}
			if n > 0 && strings.Contains(string(buf[:n]), "PWNED") {
				s.hits.Add(1)
			}
		}
	}()
	t.Cleanup(func() { syscall.Shutdown(fd, syscall.SHUT_RDWR); syscall.Close(fd) })
	return s
}

func (s *nlSink) reached(r result) []string {
	// The send is synchronous: a datagram that reached the socket is
	// queued before sendto returns; give the reader a moment.
	for i := 0; i < 20 && s.hits.Load() == 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.hits.Swap(0); n > 0 {
		return []string{"the host netlink socket received " + strconv.FormatInt(n, 10) + " message(s)"}
	}
	return nil
}

// pyNetlinkTo sends a message to the netlink port {{NLPID}} of protocol
// {{NLPROTO}}.
const pyNetlinkTo = `
import struct
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, {{NLPROTO}})
    msg = b"PWNED" * 4
    hdr = struct.pack("=LHHLL", 16 + len(msg), 0x10, 1, 1, 0)
    s.sendto(hdr + msg, ({{NLPID}}, 0))
    print("sent")
except OSError as e:
    print("blocked:", e)
    sys.exit(1)
`

// TestHostNetViewAttacks: with HostNetView, the command that sees the
// host's interfaces cannot send anything: TCP and UDP (IPv4 and IPv6)
// to host listeners, a raw packet, a netlink message to another
// process (usersock or route), or a change to the host's addresses.
// Each attack works outside the sandbox (the address change as root).
func TestHostNetViewAttacks(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		pol := hostNetView(supervised(nil, []string{"{{WORK}}"}))
		tcp := listenSink(t, "tcp", "127.0.0.1:0")
		udp := listenSink(t, "udp", "127.0.0.1:0")
		udp6 := listenSink(t, "udp", "[::1]:0")
		fx.set("PORT", tcp.port())
		attack(t, fx, m, attackCase{name: "tcp-to-host", policy: pol, py: pyTCP,
			landed: func(t *testing.T, fx *fixture, r result) []string { return tcp.reached(r) }})
		fx.set("PORT", udp.port())
		attack(t, fx, m, attackCase{name: "udp-to-host", policy: pol, py: pyUDP,
			landed: func(t *testing.T, fx *fixture, r result) []string { return udp.reached(r) }})
		fx.set("PORT", udp6.port())
		attack(t, fx, m, attackCase{name: "udp6-to-host", policy: pol,
			py:     strings.NewReplacer("AF_INET", "AF_INET6", `"127.0.0.1"`, `"::1"`).Replace(pyUDP),
			landed: func(t *testing.T, fx *fixture, r result) []string { return udp6.reached(r) }})
		// The get_processes fallback's own move: a UDP connect that
		// sends nothing, only to read the source address.
		attack(t, fx, m, attackCase{name: "udp-connect-getsockname", policy: pol,
			py: `
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("192.0.2.1", 80))
print("source address", s.getsockname()[0], "METNOS-UDP-SOCKET-MADE")
`, secrets: []string{"METNOS-UDP-SOCKET-MADE"}})

		raw := `
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
print("METNOS-PACKET-SOCKET-MADE")
`
		attack(t, fx, m, attackCase{name: "packet-socket", policy: pol, py: raw,
			secrets:      []string{"METNOS-PACKET-SOCKET-MADE"},
			outsideFails: ifNotRoot("AF_PACKET needs CAP_NET_RAW")})

		// NETLINK_USERSOCK lets any process send to any other's port id.
		us := listenNetlink(t, 2) // NETLINK_USERSOCK
		fx.set("NLPROTO", "2")
		fx.set("NLPID", strconv.FormatUint(uint64(us.pid), 10))
		attack(t, fx, m, attackCase{name: "netlink-usersock-to-host-process", policy: pol, py: pyNetlinkTo,
			landed: func(t *testing.T, fx *fixture, r result) []string { return us.reached(r) }})
		// NETLINK_ROUTE, the protocol HostNetView allows: unicast to
		// another process's port id needs CAP_NET_ADMIN.
		rt := listenNetlink(t, syscall.NETLINK_ROUTE)
		fx.set("NLPROTO", "0")
		fx.set("NLPID", strconv.FormatUint(uint64(rt.pid), 10))
		attack(t, fx, m, attackCase{name: "netlink-route-to-host-process", policy: pol, py: pyNetlinkTo,
			landed:       func(t *testing.T, fx *fixture, r result) []string { return rt.reached(r) },
			outsideFails: ifNotRoot("a netlink route unicast to a port id needs CAP_NET_ADMIN")})

		// An address added to the host's loopback over rtnetlink.
		const addr = "192.0.2.77"
		hasAddr := func() bool {
			out, _ := exec.Command("ip", "-br", "addr", "show", "dev", "lo").Output()
			return strings.Contains(string(out), addr+"/")
		}
		delAddr := func(t *testing.T, fx *fixture) {
			if hasAddr() {
				_ = exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").Run()
			}
		}
		attack(t, fx, m, attackCase{name: "rtnetlink-add-address", policy: pol,
			sh: "ip addr add " + addr + "/32 dev lo",
			landed: func(t *testing.T, fx *fixture, r result) []string {
				if hasAddr() {
					return []string{"the host's loopback got the address " + addr}
				}
				return nil
			},
			setup: delAddr, cleanup: delAddr,
			outsideFails: ifNotRoot("changing an address needs CAP_NET_ADMIN")})
	})
}

func ifNotRoot(why string) string {
	if isRoot() {
		return ""
	}
	return why
}
