// Package egress: TEMPORARY STUB until the proxy branch is merged.
package egress

import (
	"log/slog"
	"net"
	"time"

	"github.com/metnos/agent/policy"
)

type Options struct {
	Resolver    *net.Resolver
	MaxConns    int
	DialTimeout time.Duration
	Log         *slog.Logger
}

type Record struct {
	Proto   string
	Host    string
	Port    uint16
	Addr    string
	Up      int64
	Down    int64
	Verdict string
	Reason  string
}

type Proxy struct{ l net.Listener }

func New(rules policy.Egress, opt Options) *Proxy { return &Proxy{} }
func (p *Proxy) Serve(l net.Listener) error {
	p.l = l
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		c.Close()
	}
}
func (p *Proxy) Close() error {
	if p.l != nil {
		p.l.Close()
	}
	return nil
}
func (p *Proxy) Records() []Record              { return nil }
func (p *Proxy) Refused() (n int, first string) { return 0, "" }
