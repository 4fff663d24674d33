package update

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/wire"
)

// TestCheck: Check applies only a descriptor signed by the pinned key,
// of metnos-agent, for this build's target, newer than the version last
// applied, of a build that is not the running one and was not rolled
// back here (unless forced); and it downloads nothing.
func TestCheck(t *testing.T) {
	running := []byte("the running build")
	newer := []byte("the build of 2.0.0")
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	type check struct {
		name string
		// setup publishes a descriptor and may write the record.
		setup func(t *testing.T, s *server, d device)
		force bool
		// err is a substring of Check's error, else why of its refusal;
		// both "": applied.
		err, why string
	}
	checks := []check{{
		name: "a newer build",
		setup: func(t *testing.T, s *server, d device) {
			s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, newer)
		},
	}, {
		name: "a field edited after signing",
		setup: func(t *testing.T, s *server, d device) {
			m, _ := wire.SignComponentDescriptor(s.key, wire.ComponentDescriptor{Component: wire.AgentComponent, Version: "2.0.0",
				Target: testTarget, SHA256: sum(newer), URLPath: "/agent/client/2.0.0/x/metnos-agent"})
			m["sha256"] = sum([]byte("another build"))
			s.serveDescriptor(t, m)
		},
		err: "not signed by the paired server",
	}, {
		name: "the version edited after signing",
		setup: func(t *testing.T, s *server, d device) {
			m, _ := wire.SignComponentDescriptor(s.key, wire.ComponentDescriptor{Component: wire.AgentComponent, Version: "2.0.0",
				Target: testTarget, SHA256: sum(newer), URLPath: "/agent/client/2.0.0/x/metnos-agent"})
			m["version"] = "9.0.0"
			s.serveDescriptor(t, m)
		},
		err: "not signed by the paired server",
	}, {
		name: "signed by another key",
		setup: func(t *testing.T, s *server, d device) {
			m, _ := wire.SignComponentDescriptor(otherKey, wire.ComponentDescriptor{Component: wire.AgentComponent, Version: "2.0.0",
				Target: testTarget, SHA256: sum(newer), URLPath: "/agent/client/2.0.0/x/metnos-agent"})
			s.serveDescriptor(t, m)
		},
		err: "not signed by the paired server",
	}, {
		name: "another component's descriptor",
		setup: func(t *testing.T, s *server, d device) {
			s.publish(t, wire.ComponentDescriptor{Component: "helper", Version: "2.0.0"}, newer)
		},
		err: `a descriptor of "helper", not of "metnos-agent"`,
	}, {
		name: "another target's descriptor",
		setup: func(t *testing.T, s *server, d device) {
			s.publish(t, wire.ComponentDescriptor{Version: "2.0.0", Target: "x86_64-unknown-linux-musl"}, newer)
		},
		err: `it is for target "x86_64-unknown-linux-musl"`,
	}, {
		name: "an older version than the one applied (replay)",
		setup: func(t *testing.T, s *server, d device) {
			SaveState(d.state, State{Applied: "2.0.0"})
			s.publish(t, wire.ComponentDescriptor{Version: "1.9.10"}, newer)
		},
		why: "not newer than 2.0.0",
	}, {
		name: "the version applied again (replay)",
		setup: func(t *testing.T, s *server, d device) {
			SaveState(d.state, State{Applied: "2.0.0"})
			s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, newer)
		},
		why: "not newer than 2.0.0",
	}, {
		name: "a version newer than the one applied",
		setup: func(t *testing.T, s *server, d device) {
			SaveState(d.state, State{Applied: "2.0.0"})
			s.publish(t, wire.ComponentDescriptor{Version: "2.0.10"}, newer)
		},
	}, {
		name: "the running build",
		setup: func(t *testing.T, s *server, d device) {
			s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, running)
		},
		why: "already the build of 2.0.0",
	}, {
		name: "a build rolled back here",
		setup: func(t *testing.T, s *server, d device) {
			SaveState(d.state, State{Failed: &Failure{Version: "2.0.0", SHA256: sum(newer), Reason: "it crashed", At: time.Now(), RolledBack: true}})
			s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, newer)
		},
		why: "rolled back on this device (it crashed)",
	}, {
		name: "a build rolled back here, by hand",
		setup: func(t *testing.T, s *server, d device) {
			SaveState(d.state, State{Failed: &Failure{Version: "2.0.0", SHA256: sum(newer), Reason: "it crashed", At: time.Now(), RolledBack: true}})
			s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, newer)
		},
		force: true,
	}, {
		name: "a build that failed to download here",
		setup: func(t *testing.T, s *server, d device) {
			SaveState(d.state, State{Failed: &Failure{Version: "2.0.0", SHA256: sum(newer), Reason: "cut", At: time.Now()}})
			s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, newer)
		},
	}, {
		name: "an update on probation",
		setup: func(t *testing.T, s *server, d device) {
			SaveState(d.state, State{Phase: PhaseProbation, Version: "2.0.0", SHA256: sum(running)})
			s.publish(t, wire.ComponentDescriptor{Version: "3.0.0"}, newer)
		},
		why: "on probation",
	}}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			dir := t.TempDir()
			exe := filepath.Join(dir, "metnos-agent")
			if err := os.WriteFile(exe, running, 0o755); err != nil {
				t.Fatal(err)
			}
			d := device{Files: FilesFor(exe), state: filepath.Join(t.TempDir(), "agent-update.json")}
			c.setup(t, s, d)
			dec, err := d.updater(t, s, false).Check(context.Background(), c.force)
			switch {
			case c.err != "":
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Check: %+v, %v; want an error saying %q", dec, err, c.err)
				}
			case err != nil:
				t.Fatalf("Check: %v", err)
			case c.why == "" && !dec.Apply:
				t.Fatalf("refused (%s), want it applied", dec.Why)
			case c.why != "" && (dec.Apply || !strings.Contains(dec.Why, c.why)):
				t.Fatalf("Check: apply %v (%s); want it refused saying %q", dec.Apply, dec.Why, c.why)
			}
			if len(s.ranges) != 0 {
				t.Errorf("Check downloaded the build (%d requests)", len(s.ranges))
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("Check left files beside the executable: %v", entries)
			}
		})
	}
}

// TestCheckNoBuild: a server that publishes no metnos-agent build
// answers 404 no_binary, which Check gives as a *client.ServerError of
// status 404 (the run loop tells it from a failure).
func TestCheckNoBuild(t *testing.T) {
	s := newServer(t)
	exe := filepath.Join(t.TempDir(), "metnos-agent")
	os.WriteFile(exe, []byte("running"), 0o755)
	d := device{Files: FilesFor(exe), state: filepath.Join(t.TempDir(), "agent-update.json")}
	_, err := d.updater(t, s, false).Check(context.Background(), false)
	var se *client.ServerError
	if !errors.As(err, &se) || client.StatusOf(err) != 404 || se.Code != "no_binary" {
		t.Fatalf("Check: %v, want a *client.ServerError 404 no_binary", err)
	}
}
