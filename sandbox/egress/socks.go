package egress

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/metnos/agent/policy"
)

// SOCKS5 (RFC 1928) constants.
const (
	socksVersion = 5

	socksNoAuth       = 0x00
	socksNoAcceptable = 0xff

	socksCmdConnect = 1

	socksATypIPv4   = 1
	socksATypDomain = 3
	socksATypIPv6   = 4

	socksSucceeded        = 0x00
	socksGeneralFailure   = 0x01
	socksNotAllowed       = 0x02
	socksHostUnreachable  = 0x04
	socksConnRefused      = 0x05
	socksCmdNotSupported  = 0x07
	socksATypNotSupported = 0x08
)

// serveSOCKS serves one SOCKS5 CONNECT.
func (p *Proxy) serveSOCKS(c net.Conn, br *bufio.Reader) {
	r := &pending{p: p, Record: Record{Proto: "socks5", Verdict: "refused"}}
	defer r.finish()
	if !socksGreet(c, br) {
		r.Reason = "SOCKS5 greeting without the no-authentication method"
		return
	}
	cmd, host, port, err := readSOCKSRequest(br)
	r.Host, r.Port = host, port
	if err != nil {
		r.Reason = err.Error()
		code := byte(socksNotAllowed)
		if _, ok := err.(atypError); ok {
			code = socksATypNotSupported
		}
		r.reply(c, code)
		return
	}
	if cmd != socksCmdConnect {
		r.Reason = fmt.Sprintf("SOCKS5 command %d is not supported (CONNECT only: no BIND, no UDP)", cmd)
		r.reply(c, socksCmdNotSupported)
		return
	}
	c.SetReadDeadline(time.Time{})
	up, addr, err := p.connect(host, port)
	r.Addr = addr
	if err != nil {
		r.Reason = err.Error()
		switch {
		case refusalOf(err) != nil:
			r.reply(c, socksNotAllowed)
		case dialRefused(err):
			r.Verdict = "allowed"
			r.reply(c, socksConnRefused)
		default:
			r.Verdict = "allowed"
			r.reply(c, socksHostUnreachable)
		}
		return
	}
	r.Verdict = "allowed"
	cu := &countConn{Conn: up}
	if !p.track(cu) {
		r.Reason = "proxy closed"
		return
	}
	defer p.untrack(cu)
	if err := socksReply(c, socksSucceeded); err != nil {
		r.Reason = "client gone: " + err.Error()
		return
	}
	pipe(c, br, cu)
	r.Up, r.Down = cu.up.Load(), cu.down.Load()
}

// reply records r, then sends the SOCKS5 reply rep (a failure).
func (r *pending) reply(c net.Conn, rep byte) {
	r.finish()
	socksReply(c, rep)
}

// socksGreet reads the method selection and answers no authentication,
// or 0xff and false when the client does not offer it.
func socksGreet(c net.Conn, br *bufio.Reader) bool {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil || h[0] != socksVersion {
		return false
	}
	methods := make([]byte, h[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return false
	}
	for _, m := range methods {
		if m == socksNoAuth {
			_, err := c.Write([]byte{socksVersion, socksNoAuth})
			return err == nil
		}
	}
	c.Write([]byte{socksVersion, socksNoAcceptable})
	return false
}

type atypError byte

func (e atypError) Error() string {
	return fmt.Sprintf("SOCKS5 address type %d is not supported", byte(e))
}

// readSOCKSRequest reads VER CMD RSV ATYP DST.ADDR DST.PORT.
func readSOCKSRequest(br *bufio.Reader) (cmd byte, host string, port uint16, err error) {
	var h [4]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, "", 0, fmt.Errorf("reading the SOCKS5 request: %w", err)
	}
	if h[0] != socksVersion {
		return 0, "", 0, fmt.Errorf("SOCKS5 request of version %d", h[0])
	}
	cmd = h[1]
	switch h[3] {
	case socksATypIPv4:
		var a [4]byte
		if _, err := io.ReadFull(br, a[:]); err != nil {
			return cmd, "", 0, fmt.Errorf("reading the SOCKS5 address: %w", err)
		}
		host = netip.AddrFrom4(a).String()
	case socksATypIPv6:
		var a [16]byte
		if _, err := io.ReadFull(br, a[:]); err != nil {
			return cmd, "", 0, fmt.Errorf("reading the SOCKS5 address: %w", err)
		}
		host = netip.AddrFrom16(a).Unmap().String()
	case socksATypDomain:
		n, err := br.ReadByte()
		if err != nil {
			return cmd, "", 0, fmt.Errorf("reading the SOCKS5 name: %w", err)
		}
		name := make([]byte, n)
		if _, err := io.ReadFull(br, name); err != nil {
			return cmd, "", 0, fmt.Errorf("reading the SOCKS5 name: %w", err)
		}
		host = string(name)
		// An IP literal sent as a name is judged as the literal.
		if a, err := netip.ParseAddr(host); (err != nil || a.Zone() != "") && !validHost(host) {
			var pb [2]byte
			io.ReadFull(br, pb[:])
			return cmd, fmt.Sprintf("%q", host), binary.BigEndian.Uint16(pb[:]), fmt.Errorf("SOCKS5 name %q is not a host name", host)
		}
	default:
		return cmd, "", 0, atypError(h[3])
	}
	var pb [2]byte
	if _, err := io.ReadFull(br, pb[:]); err != nil {
		return cmd, host, 0, fmt.Errorf("reading the SOCKS5 port: %w", err)
	}
	port = binary.BigEndian.Uint16(pb[:])
	if port == 0 {
		return cmd, host, 0, fmt.Errorf("SOCKS5 port 0")
	}
	return cmd, policy.NormalizeHost(host), port, nil
}

// socksReply answers VER REP RSV with a zero IPv4 bound address: the
// client learns nothing of the proxy's own addresses.
func socksReply(w io.Writer, rep byte) error {
	_, err := w.Write([]byte{socksVersion, rep, 0, socksATypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}
