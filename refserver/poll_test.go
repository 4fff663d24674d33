package refserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

func TestSignedPostErrors(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	revoked := h.pair("old")
	if err := h.srv.Revoke(revoked.id); err != nil {
		t.Fatal(err)
	}
	stranger := newKey(t)
	body := func(id string) []byte { return []byte(`{"block_ms":0,"cursor":null,"device_id":"` + id + `"}`) }
	sign := func(k []byte) string { return wire.SignBytes(d.key, k) }
	cases := []struct {
		name   string
		body   []byte
		sig    string
		status int
		code   string
	}{
		{"not JSON", []byte(`{"device_id":`), "x", 400, wire.CodeInvalidJSON},
		{"not an object", []byte(`"x"`), "x", 400, wire.CodeInvalidJSON},
		{"device_id missing (before the signature)", []byte(`{"block_ms":0}`), "", 400, wire.CodeMissingField},
		{"device_id not a string", []byte(`{"device_id":5}`), "x", 400, wire.CodeMissingField},
		{"no signature", body(d.id), "", 401, wire.CodeMissingSignature},
		{"unknown device", body("0123456789abcdef0123456789abcdef"), "x", 403, wire.CodeUnknownDevice},
		{"revoked device", body(revoked.id), wire.SignBytes(revoked.key, body(revoked.id)), 403, wire.CodeUnknownDevice},
		{"signature by another key", body(d.id), wire.SignBytes(stranger, body(d.id)), 403, wire.CodeBadSignature},
		{"signature over other bytes", body(d.id), sign([]byte(string(body(d.id)) + " ")), 403, wire.CodeBadSignature},
		{"garbage signature", body(d.id), "!!", 403, wire.CodeBadSignature},
	}
	for _, path := range []string{"/agent/poll", "/agent/heartbeat"} {
		for _, c := range cases {
			t.Run(path+"/"+c.name, func(t *testing.T) {
				hdr := map[string]string{}
				if c.sig != "" {
					hdr[wire.SigHeader] = c.sig
				}
				st, b, _ := h.do("POST", path, c.body, hdr)
				if m := h.object(b); st != c.status || m["error"] != c.code {
					t.Errorf("got %d %s, want %d %s", st, b, c.status, c.code)
				}
			})
		}
	}
}

func TestPollEmptyShapeAndBookkeeping(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	m := h.poll(d, nil, 0)
	want := map[string]any{"invocation": nil, "server_client_version": nil, "shim_sha256": h.srv.ShimDigest()}
	if fmt.Sprint(m) != fmt.Sprint(want) || len(h.srv.ShimDigest()) != 64 {
		t.Errorf("poll = %v, want %v", m, want)
	}
	info, _ := h.srv.Device(d.id)
	if info.LastPoll.IsZero() || info.LastHeartbeat.IsZero() {
		t.Errorf("poll did not record last_poll/last_heartbeat: %+v", info)
	}
	// Without a shim, shim_sha256 is "".
	h2 := newHarness(t, func(c *Config) { c.Shim = nil })
	if m := h2.poll(h2.pair("pc"), nil, 0); m["shim_sha256"] != "" {
		t.Errorf("shim_sha256 without shim = %v", m["shim_sha256"])
	}
}

func TestHeartbeatStoresProfile(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	body := []byte(`{"device_id":"` + d.id + `","profile":{"client_version":"0.2.55","cpu_count":16,"os_arch":"x86_64","os_family":"linux","sandbox_level":"bwrap"}}`)
	st, m := h.signed("/agent/heartbeat", d.key, body)
	if st != 200 || m["ok"] != true {
		t.Fatalf("heartbeat: %d %v", st, m)
	}
	info, _ := h.srv.Device(d.id)
	if info.Profile["client_version"] != "0.2.55" || info.Profile["cpu_count"] != json.Number("16") {
		t.Errorf("profile %v", info.Profile)
	}
	if !info.LastPoll.IsZero() || info.LastHeartbeat.IsZero() {
		t.Errorf("heartbeat must set last_heartbeat only: %+v", info)
	}
	// A profile that is not an object only refreshes last_heartbeat.
	h.signed("/agent/heartbeat", d.key, []byte(`{"device_id":"`+d.id+`","profile":"x"}`))
	if info, _ := h.srv.Device(d.id); info.Profile["client_version"] != "0.2.55" {
		t.Errorf("profile replaced by a non-object: %v", info.Profile)
	}
}

func TestPollDeliversSignedInvocation(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	args := map[string]any{"q": "città", "n": 3, "big": json.Number("9007199254740993"), "u": "\u2028<&>😀",
		"paths": []any{`C:\Users\x`}, "nested": map[string]any{"t": true, "nul": nil}}
	id := h.enqueue(d, "echo_args", args, EnqueueOptions{TurnID: "turn-1", Env: map[string]string{"METNOS_TURN_ID": "turn-1"}, DeadlineMS: 5000})
	if !strings.HasPrefix(id, "inv-") || len(id) != 28 || wire.CheckID(id, time.Now()) != nil {
		t.Errorf("id %q is not inv-<16 hex ns><8 hex>", id)
	}
	inv := h.pollInvocation(d, nil)
	ms, cs, _ := h.srv.ExecutorDigests("echo_args")
	if inv.ID != id || inv.TurnID != "turn-1" || inv.Executor != "echo_args" || inv.Scope != "device" ||
		inv.Reversibility != "read_only" || inv.DeadlineMS != 5000 || inv.Env["METNOS_TURN_ID"] != "turn-1" ||
		inv.ManifestSHA256 != ms || inv.CodeSHA256 != cs {
		t.Errorf("invocation %+v", inv)
	}
	got, _ := wire.Canonical(inv.Args)
	want, _ := wire.Canonical(mustDecode(t, `{"big":9007199254740993,"n":3,"nested":{"nul":null,"t":true},"paths":["C:\\Users\\x"],"q":"città","u":"`+"\u2028<&>😀"+`"}`))
	if string(got) != string(want) {
		t.Errorf("args %s, want %s", got, want)
	}
	info, _ := h.srv.Invocation(id)
	if info.State != StateDelivered || info.Deliveries != 1 {
		t.Errorf("after delivery: %+v", info)
	}
	if m := h.poll(d, id, 0); m["invocation"] != nil {
		t.Errorf("delivered invocation handed out again: %v", m)
	}
	// Another device never sees it.
	if m := h.poll(h.pair("other"), nil, 0); m["invocation"] != nil {
		t.Errorf("other device got %v", m)
	}
}

func mustDecode(t *testing.T, s string) any {
	t.Helper()
	v, err := wire.Decode([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestEnqueueRefuses(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	cases := []struct {
		name     string
		dev, ex  string
		args     any
		o        EnqueueOptions
		canonErr bool
	}{
		{"float", d.id, "echo_args", map[string]any{"x": 1.5}, EnqueueOptions{}, true},
		{"integral float", d.id, "echo_args", []any{float64(1)}, EnqueueOptions{}, true},
		{"float json.Number", d.id, "echo_args", map[string]any{"x": json.Number("1.5")}, EnqueueOptions{}, true},
		{"unknown device", "nope", "echo_args", nil, EnqueueOptions{}, false},
		{"unknown executor", d.id, "nope", nil, EnqueueOptions{}, false},
		{"bad id", d.id, "echo_args", nil, EnqueueOptions{ID: "bad id"}, false},
		{"negative deadline", d.id, "echo_args", nil, EnqueueOptions{DeadlineMS: -1}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.srv.Enqueue(c.dev, c.ex, c.args, c.o)
			if err == nil || errors.Is(err, wire.ErrNotCanonical) != c.canonErr {
				t.Errorf("err = %v", err)
			}
		})
	}
	id := h.enqueue(d, "echo_args", nil, EnqueueOptions{ID: "inv-durable-0123456789abcdef0123456789abcdef"})
	if _, err := h.srv.Enqueue(d.id, "echo_args", nil, EnqueueOptions{ID: id}); err == nil {
		t.Error("duplicate id accepted")
	}
}

func TestCursorSemantics(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	a := h.enqueue(d, "echo_args", 1, EnqueueOptions{})
	b := h.enqueue(d, "echo_args", 2, EnqueueOptions{})
	if a >= b {
		t.Fatalf("ids not increasing: %s %s", a, b)
	}
	// Lowest id first, one per response.
	if inv := h.pollInvocation(d, nil); inv.ID != a {
		t.Errorf("first poll got %s, want %s", inv.ID, a)
	}
	// A cursor past b hides it.
	if m := h.poll(d, b, 0); m["invocation"] != nil {
		t.Errorf("cursor %s still delivered %v", b, m["invocation"])
	}
	if inv := h.pollInvocation(d, a); inv.ID != b {
		t.Errorf("cursor %s got %s, want %s", a, inv.ID, b)
	}
	// docs/protocol.md §17.1: a durable id sorts after every inv-<hex> id, so a cursor set
	// to it hides later normal invocations.
	dur := h.enqueue(d, "echo_args", 3, EnqueueOptions{ID: "inv-durable-0123456789abcdef0123456789abcdef"})
	if inv := h.pollInvocation(d, b); inv.ID != dur {
		t.Errorf("got %s, want the durable %s", inv.ID, dur)
	}
	c := h.enqueue(d, "echo_args", 4, EnqueueOptions{})
	if m := h.poll(d, dur, 0); m["invocation"] != nil {
		t.Errorf("cursor %s should hide %s", dur, c)
	}
	if inv := h.pollInvocation(d, nil); inv.ID != c {
		t.Errorf("null cursor got %s, want %s", inv.ID, c)
	}
}

func TestLongPoll(t *testing.T) {
	// PollCheck of an hour: only the enqueue notification can wake the poll.
	h := newHarness(t, func(c *Config) { c.PollCheck = time.Hour })
	d := h.pair("pc")
	start := time.Now()
	if m := h.poll(d, nil, 300); m["invocation"] != nil {
		t.Fatalf("idle long-poll returned %v", m)
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Errorf("idle long-poll returned after %s, before block_ms", el)
	}

	before, _ := h.srv.Device(d.id)
	got := make(chan map[string]any, 1)
	go func() { got <- h.poll(d, nil, 30000) }()
	// Wait until the poll reached the server (it records last_poll), then enqueue.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if info, _ := h.srv.Device(d.id); !info.LastPoll.Equal(before.LastPoll) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long-poll never reached the server")
		}
	}
	id := h.enqueue(d, "echo_args", nil, EnqueueOptions{})
	select {
	case m := <-got:
		inv, _ := m["invocation"].(map[string]any)
		if inv["invocation_id"] != id {
			t.Errorf("woken poll got %v", m)
		}
	case <-time.After(20 * time.Second): // well under block_ms: the enqueue must wake it
		t.Fatal("long-poll was not woken by the enqueue")
	}
}

func TestBlockMS(t *testing.T) {
	cases := []struct {
		in   any
		want time.Duration
	}{
		{json.Number("25000"), 25 * time.Second},
		{json.Number("99999"), 30 * time.Second},
		{json.Number("1"), time.Millisecond},
		{json.Number("0"), 0},
		{json.Number("-5"), 0},
		{json.Number("1.5"), 0},
		{"25000", 0},
		{nil, 0},
		{true, 0},
	}
	for _, c := range cases {
		if got := blockFor(c.in); got != c.want {
			t.Errorf("blockFor(%#v) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestRedeliveryAfterDeadlineAndGrace(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.RedeliveryGrace = 5 * time.Second })
	d := h.pair("pc")
	id := h.enqueue(d, "echo_args", nil, EnqueueOptions{DeadlineMS: 1000})
	h.pollInvocation(d, nil)
	if m := h.poll(d, nil, 0); m["invocation"] != nil {
		t.Fatalf("re-delivered before deadline+grace: %v", m)
	}
	h.clock.Advance(5 * time.Second) // 5 s < 1 s + 5 s
	if m := h.poll(d, nil, 0); m["invocation"] != nil {
		t.Fatalf("re-delivered before deadline+grace: %v", m)
	}
	h.clock.Advance(1500 * time.Millisecond)
	// The live client's cursor still hides it; a restarted one (null) gets it.
	if m := h.poll(d, id, 0); m["invocation"] != nil {
		t.Errorf("cursor did not hide the orphan: %v", m)
	}
	if inv := h.pollInvocation(d, nil); inv.ID != id {
		t.Errorf("re-delivered %s, want %s", inv.ID, id)
	}
	if info, _ := h.srv.Invocation(id); info.Deliveries != 2 || info.State != StateDelivered {
		t.Errorf("after re-delivery: %+v", info)
	}
	// Once answered, never again.
	if st, _ := h.result(d, id, true, map[string]any{}); st != 200 {
		t.Fatalf("result: %d", st)
	}
	h.clock.Advance(time.Hour)
	if m := h.poll(d, nil, 0); m["invocation"] != nil {
		t.Errorf("done invocation re-delivered: %v", m)
	}
	// Expired invocations are not delivered either.
	h.enqueue(d, "echo_args", nil, EnqueueOptions{})
	h.clock.Advance(25 * time.Hour)
	if n := h.srv.ExpireOlderThan(24 * time.Hour); n != 1 {
		t.Errorf("expired %d, want 1", n)
	}
	if m := h.poll(d, nil, 0); m["invocation"] != nil {
		t.Errorf("expired invocation delivered: %v", m)
	}
}
