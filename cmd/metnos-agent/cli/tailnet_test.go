package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/tailnet"
)

// TestDescribeTailnet: whoami says the tailnet is up only when the
// server answered through it lately and the node sees control and its
// relay; a status written during an outage, with the node's backend
// still running, says when the server last answered and what is down,
// and gives the peers online only as of when control last gave them.
func TestDescribeTailnet(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 10, 0, 0, time.Local)
	up := tailnet.Status{Hostname: "laptop", IPs: []string{"100.64.0.2"}, Running: true, ControlReachable: true,
		DERPHome: "test", DERPReachable: true, Peers: 1, PeersOnline: 1}
	for _, c := range []struct {
		name      string
		edit      func(*tailnet.Status)
		want      []string
		forbidden []string
	}{
		{name: "answer stale", edit: func(s *tailnet.Status) {
			s.At, s.ServerAnswered = now.Add(-5*time.Second), now.Add(-3*time.Minute-10*time.Second)
		},
			want: []string{"no answer from the server since 12:06:50 (the node itself sees"}},
		{name: "answering", edit: func(s *tailnet.Status) {
			s.At, s.ServerAnswered = now.Add(-5*time.Second), now.Add(-20*time.Second)
			s.ControlSeen = s.At
		},
			want: []string{"tailnet:             node up, server last answered 20 s ago", "control reachable, DERP relay test, as of",
				"tailnet peers:       1 of 1 online as of 12:09:55\n"}},
		{name: "status without control_seen", edit: func(s *tailnet.Status) { s.At, s.ServerAnswered = now.Add(-5*time.Second), now.Add(-20*time.Second) },
			want: []string{"tailnet peers:       1 of 1 online as of 12:09:55\n"}},
		{name: "control lost", edit: func(s *tailnet.Status) {
			s.At, s.ServerAnswered = now.Add(-5*time.Second), now.Add(-6*time.Minute)
			s.ControlReachable, s.ControlSeen = false, now.Add(-6*time.Minute+3*time.Second)
		},
			want:      []string{"no answer from the server since 12:04:00 (control unreachable)", "tailnet peers:       1 of 1 online as of 12:04:03, when control was last reached"},
			forbidden: []string{"node up", "12:09:55\n"}},
		{name: "total outage", edit: func(s *tailnet.Status) {
			s.At, s.ServerAnswered = now.Add(-5*time.Second), now.Add(-6*time.Minute)
			s.ControlReachable, s.DERPReachable, s.PeersOnline = false, false, 0
			s.ControlSeen = now.Add(-6 * time.Minute)
		},
			want: []string{"no answer from the server since 12:04:00 (control unreachable, DERP relay test unreachable)", "running, IPs [100.64.0.2], control unreachable",
				"tailnet peers:       0 of 1 online as of 12:04:00, when control was last reached"},
			forbidden: []string{"node up", "connected"}},
		{name: "never answered", edit: func(s *tailnet.Status) { s.At = now.Add(-5 * time.Second); s.ControlReachable = false },
			want:      []string{"no answer from the server yet (control unreachable)", "tailnet peers:       1 known, whether online unknown (control not reached since the agent started)"},
			forbidden: []string{"node up", "1 of 1"}},
		{name: "stopped", edit: func(s *tailnet.Status) {
			s.At, s.ServerAnswered, s.Stopped = now.Add(-time.Hour), now.Add(-time.Hour-10*time.Second), true
		},
			want: []string{"tailnet:             no agent running (it stopped at 11:10:00); the server last answered it at 11:09:50"}, forbidden: []string{"node up"}},
		{name: "stale", edit: func(s *tailnet.Status) {
			s.At, s.ServerAnswered = now.Add(-time.Hour), now.Add(-time.Hour-10*time.Second)
		},
			want: []string{"tailnet:             no running agent has updated this since 11:10:00; the server last answered it at 11:09:50"}, forbidden: []string{"node up"}},
		{name: "escapes", edit: func(s *tailnet.Status) { s.At, s.LastError = now, "bad\x1b]0;owned\x07 thing" },
			want: []string{"tailnet last error:  bad]0;owned thing"}, forbidden: []string{"\x1b", "\x07"}},
	} {
		st := up
		c.edit(&st)
		out := strings.Join(describeTailnet(st, now), "\n") + "\n"
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: want %q in\n%s", c.name, w, out)
			}
		}
		for _, f := range c.forbidden {
			if strings.Contains(out, f) {
				t.Errorf("%s: %q in\n%s", c.name, f, out)
			}
		}
	}
}
