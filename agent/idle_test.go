package agent

import (
	"context"
	"testing"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/refserver"
)

// idler is an agent whose Config.OnIdle reports, on idle, whether the
// server had seen a poll by then; it polls the reference server with
// long-polls of block, and sends a heartbeat every beat (the default
// when 0).
type idler struct {
	srv    *refserver.Server
	device string
	idle   chan bool
	logs   *syncBuffer
	ctx    context.Context
	stop   func() error
}

func startIdler(t *testing.T, block, beat time.Duration) *idler {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	d := &idler{idle: make(chan bool, 10), ctx: ctx}
	a := newDeviceAgent(t, examples.Executors, "idler", func(a *deviceAgent, c *Config) {
		c.Block, c.HeartbeatEvery = block, beat
		c.OnIdle = func() {
			info, _ := a.srv.Device(a.reg.DeviceID)
			d.idle <- !info.LastPoll.IsZero()
		}
	})
	d.srv, d.device, d.logs = a.srv, a.reg.DeviceID, a.logs
	stop, ran := a.start(t, ctx)
	d.stop = func() error { stop(); return <-ran }
	return d
}

// run has the agent run one echo and waits for its result.
func (d *idler) run(t *testing.T) {
	t.Helper()
	id, err := d.srv.Enqueue(d.device, "echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.srv.Wait(d.ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestOnIdle: the run loop calls Config.OnIdle once before its first
// poll, not again while it only waits, and once more when it is waiting
// again after running an invocation.
func TestOnIdle(t *testing.T) {
	d := startIdler(t, 200*time.Millisecond, 0)
	select {
	case polled := <-d.idle:
		if polled {
			t.Error("OnIdle was first called after a poll, want before the first")
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("OnIdle was not called at start-up\n%s", d.logs.String())
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case <-d.idle:
			t.Errorf("OnIdle was called again %s", what)
		case <-time.After(time.Second): // about five empty long-polls
		}
	}
	quiet("while the agent only waited")

	d.run(t)
	select {
	case <-d.idle:
	case <-time.After(30 * time.Second):
		t.Fatalf("OnIdle was not called when the agent waited again after a run\n%s", d.logs.String())
	}
	quiet("while the agent only waited after the run")
	if err := d.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestOnIdleDuringLongPoll: after a run, OnIdle comes while the next
// long-poll still waits (IdleAfterWork into it), not only once that
// poll returns empty, which here would take a minute; and once.
func TestOnIdleDuringLongPoll(t *testing.T) {
	d := startIdler(t, time.Minute, 0)
	select {
	case <-d.idle: // start-up
	case <-time.After(30 * time.Second):
		t.Fatalf("OnIdle was not called at start-up\n%s", d.logs.String())
	}
	d.run(t)
	select {
	case polled := <-d.idle:
		if !polled {
			t.Error("OnIdle came before any poll")
		}
	case <-time.After(30 * time.Second): // half the long-poll
		t.Fatalf("OnIdle was not called while the long-poll after the run waited\n%s", d.logs.String())
	}
	select {
	case <-d.idle:
		t.Error("OnIdle was called twice after one run\n" + d.logs.String())
	case <-time.After(3 * IdleAfterWork):
	}
	if err := d.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestOnIdleAfterHeartbeat: while the agent only waits (one long-poll
// of a minute), each heartbeat after the first is followed by OnIdle,
// which gives back what the heartbeat touched; without it the next
// call would come IdleAgain later.
func TestOnIdleAfterHeartbeat(t *testing.T) {
	d := startIdler(t, time.Minute, 300*time.Millisecond)
	for i := range 4 { // start-up, then three heartbeats
		select {
		case <-d.idle:
		case <-time.After(30 * time.Second):
			t.Fatalf("OnIdle was called %d times in 30 s of heartbeats every 300 ms, want 4\n%s", i, d.logs.String())
		}
	}
	if err := d.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestOnIdleAfterLongPoll: after a long-poll that timed out empty, OnIdle
// comes IdleAfterWork into the next one, and gives back what answering
// the one and sending the other touched; short polls (TestOnIdle) do
// not call it.
func TestOnIdleAfterLongPoll(t *testing.T) {
	d := startIdler(t, 2*IdleAfterWork, 0)
	for i := range 3 { // start-up, then two long-polls
		select {
		case <-d.idle:
		case <-time.After(30 * time.Second):
			t.Fatalf("OnIdle was called %d times in 30 s of empty long-polls of %v, want 3\n%s", i, 2*IdleAfterWork, d.logs.String())
		}
	}
	if err := d.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}
