package refserver

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

func TestResultErrors(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	other := h.pair("other")
	revoked := h.pair("old")
	id := h.enqueue(d, "echo_args", nil, EnqueueOptions{})
	h.srv.Revoke(revoked.id)
	res := func(dev, inv string) []byte {
		return []byte(`{"device_id":"` + dev + `","invocation_id":"` + inv + `","ok":true,"payload":{}}`)
	}
	big := append([]byte(`{"device_id":"`+d.id+`","invocation_id":"`+id+`","ok":true,"payload":"`), bytes.Repeat([]byte("x"), wire.MaxBodyBytes)...)
	big = append(big, `"}`...)
	cases := []struct {
		name   string
		body   []byte
		sig    string
		status int
		code   string // "" = plain text
	}{
		{"no signature, before JSON parsing", []byte(`not json`), "", 401, wire.CodeMissingSignature},
		{"not JSON", []byte(`{"ok":`), "x", 400, wire.CodeInvalidJSON},
		{"not an object", []byte(`[1]`), "x", 400, wire.CodeInvalidJSON},
		{"ids not strings", []byte(`{"device_id":1,"invocation_id":"` + id + `"}`), "x", 400, wire.CodeInvalidResult},
		{"unknown device", res("0123456789abcdef0123456789abcdef", id), "x", 403, wire.CodeBadSignature},
		{"revoked device", res(revoked.id, id), wire.SignBytes(revoked.key, res(revoked.id, id)), 403, wire.CodeBadSignature},
		{"bad signature", res(d.id, id), wire.SignBytes(other.key, res(d.id, id)), 403, wire.CodeBadSignature},
		{"another device's invocation", res(other.id, id), wire.SignBytes(other.key, res(other.id, id)), 403, wire.CodeBadSignature},
		{"unknown invocation", res(d.id, "inv-00000000000000000000000"), wire.SignBytes(d.key, res(d.id, "inv-00000000000000000000000")), 400, wire.CodeInvalidResult},
		{"body over 4 MiB", big, wire.SignBytes(d.key, big), 413, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			if c.sig != "" {
				hdr[wire.SigHeader] = c.sig
			}
			st, b, resp := h.do("POST", "/agent/result", c.body, hdr)
			if st != c.status {
				t.Errorf("status %d (%s), want %d", st, b, c.status)
			}
			if c.code == "" {
				if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
					t.Errorf("413 body is %q, want plain text", resp.Header.Get("Content-Type"))
				}
				return
			}
			if m := h.object(b); m["error"] != c.code {
				t.Errorf("error %v, want %s", m, c.code)
			}
		})
	}
	if info, _ := h.srv.Invocation(id); info.State != StateQueued || info.ResultPosts != 0 {
		t.Errorf("rejected results changed the invocation: %+v", info)
	}
}

func TestResultFirstWins(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	id := h.enqueue(d, "echo_args", nil, EnqueueOptions{})
	h.pollInvocation(d, nil)
	// Floats are fine in results: the server verifies raw bytes.
	first := []byte(`{"device_id":"` + d.id + `","invocation_id":"` + id + `","ok":true,"payload":{"score":0.5}}`)
	if st, m := h.signed("/agent/result", d.key, first); st != 200 || m["ok"] != true {
		t.Fatalf("first result: %d %v", st, m)
	}
	info, err := h.srv.Wait(context.Background(), id)
	if err != nil || info.State != StateDone || !bytes.Equal(info.ResultBody, first) {
		t.Fatalf("after result: %+v %v", info, err)
	}
	if st, _ := h.result(d, id, false, map[string]any{"other": 1}); st != 200 {
		t.Errorf("second result: %d, want 200", st)
	}
	info, _ = h.srv.Invocation(id)
	if info.State != StateDone || !bytes.Equal(info.ResultBody, first) || info.ResultPosts != 2 {
		t.Errorf("second result overwrote the first: %+v", info)
	}
}

func TestResultStates(t *testing.T) {
	h := newHarness(t)
	d := h.pair("pc")
	cases := []struct {
		ok   string
		want string
	}{
		{`true`, StateDone}, {`false`, StateFailed}, {`null`, StateFailed}, {`1`, StateDone}, {`0`, StateFailed}, {`"yes"`, StateDone},
	}
	for _, c := range cases {
		id := h.enqueue(d, "echo_args", nil, EnqueueOptions{})
		body := []byte(`{"device_id":"` + d.id + `","invocation_id":"` + id + `","ok":` + c.ok + `}`)
		if st, _ := h.signed("/agent/result", d.key, body); st != 200 {
			t.Fatalf("ok=%s: %d", c.ok, st)
		}
		if info, _ := h.srv.Invocation(id); info.State != c.want {
			t.Errorf("ok=%s: state %s, want %s", c.ok, info.State, c.want)
		}
	}
	// A late result for an expired invocation still wins.
	id := h.enqueue(d, "echo_args", nil, EnqueueOptions{})
	h.clock.Advance(time.Hour)
	h.srv.ExpireOlderThan(time.Minute)
	if info, _ := h.srv.Invocation(id); info.State != StateExpired {
		t.Fatalf("state %s, want expired", info.State)
	}
	h.result(d, id, true, map[string]any{})
	if info, _ := h.srv.Invocation(id); info.State != StateDone {
		t.Errorf("late result: state %s", info.State)
	}
	// Wait honours its context.
	pending := h.enqueue(d, "echo_args", nil, EnqueueOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := h.srv.Wait(ctx, pending); err == nil {
		t.Error("Wait returned without a result")
	}
	if _, err := h.srv.Wait(context.Background(), "inv-nope-nope"); err == nil {
		t.Error("Wait on an unknown id returned no error")
	}
}
