package refserver

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/metnos/agent/wire"
)

func (h *harness) admin(method, path string, body any) (int, map[string]any) {
	h.t.Helper()
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	st, out, _ := h.do(method, path, b, nil)
	return st, h.object(out)
}

func TestAdminAPI(t *testing.T) {
	h := newHarness(t)
	st, m := h.admin("POST", "/admin/token", map[string]any{"name": "demo-pc", "ttl_s": 60})
	tok, _ := m["token"].(string)
	if st != 200 || !strings.HasPrefix(tok, TokenPrefix) {
		t.Fatalf("token: %d %v", st, m)
	}
	k := newKey(t)
	st, reg := h.register(tok, k)
	if st != 200 {
		t.Fatalf("register: %d %v", st, reg)
	}
	d := testDevice{key: k, id: reg["device_id"].(string)}

	st, m = h.admin("POST", "/admin/enqueue", map[string]any{"device_id": d.id, "executor": "move_files", "turn_id": "t1",
		"reversibility": "revertible", "deadline_ms": 5000, "args": map[string]any{"entries": []any{map[string]any{"src": "/a/f"}}, "dst_template": "/b/{name}"}})
	id, _ := m["invocation_id"].(string)
	if st != 200 || id == "" {
		t.Fatalf("enqueue: %d %v", st, m)
	}
	inv := h.pollInvocation(d, nil)
	if inv.ID != id || inv.TurnID != "t1" || inv.Reversibility != "revertible" || inv.DeadlineMS != 5000 {
		t.Errorf("invocation %+v", inv)
	}
	_, body := h.result(d, id, true, map[string]any{"results": []any{map[string]any{"src": "/a/f", "dst": "/b/f"}}})

	st, out, _ := h.do("GET", "/admin/invocation/"+id, nil, nil)
	m = h.object(out)
	if st != 200 || m["state"] != StateDone || m["deliveries"] != json.Number("1") || m["result_posts"] != json.Number("1") {
		t.Errorf("invocation: %d %s", st, out)
	}
	var raw struct{ Result json.RawMessage }
	json.Unmarshal(out, &raw)
	if !bytes.Equal(compact(t, raw.Result), compact(t, body)) {
		t.Errorf("result %s, want %s", raw.Result, body)
	}

	st, m = h.admin("POST", "/admin/undo", map[string]any{"device_id": d.id, "turn_id": "t1"})
	if ids, _ := m["invocation_ids"].([]any); st != 200 || len(ids) != 1 {
		t.Errorf("undo: %d %v", st, m)
	}
	st, m = h.admin("GET", "/admin/devices", nil)
	if list, _ := m["devices"].([]any); st != 200 || len(list) != 1 || list[0].(map[string]any)["name"] != "demo-pc" {
		t.Errorf("devices: %d %v", st, m)
	}
	if st, m = h.admin("POST", "/admin/revoke", map[string]any{"device_id": d.id}); st != 200 || m["ok"] != true {
		t.Errorf("revoke: %d %v", st, m)
	}
	body2 := []byte(`{"device_id":"` + d.id + `"}`)
	if st, m := h.signed("/agent/poll", d.key, body2); st != 403 || m["error"] != wire.CodeUnknownDevice {
		t.Errorf("poll after revoke: %d %v", st, m)
	}

	errCases := []struct {
		method, path string
		body         any
		status       int
	}{
		{"POST", "/admin/token", map[string]any{"name": "bad name"}, 400},
		{"POST", "/admin/token", map[string]any{"name": "x", "ttl_s": "1"}, 400},
		{"POST", "/admin/enqueue", map[string]any{"device_id": d.id, "executor": "echo_args", "args": 1.5}, 400},
		{"POST", "/admin/enqueue", map[string]any{"device_id": d.id, "executor": "nope"}, 400},
		{"GET", "/admin/invocation/inv-nope-nope", nil, 404},
		{"POST", "/admin/revoke", map[string]any{"device_id": "nope"}, 404},
		{"POST", "/admin/undo", map[string]any{"device_id": "nope"}, 400},
		{"POST", "/admin/undo", "[", 400},
	}
	for _, c := range errCases {
		if st, m := h.admin(c.method, c.path, c.body); st != c.status || m["error"] == nil {
			t.Errorf("%s %s %v: %d %v, want %d", c.method, c.path, c.body, st, m, c.status)
		}
	}
}

func compact(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func TestAdminOnlyLoopback(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]int{"192.0.2.7:5000": 403, "[2001:db8::1]:80": 403, "127.0.0.1:5000": 200, "[::1]:9": 200} {
		req := httptest.NewRequest("GET", "/admin/devices", nil)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		s.AdminHandler().ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("%s: %d, want %d", addr, rec.Code, want)
		}
	}
	// The device handler does not serve /admin/.
	req := httptest.NewRequest("GET", "/admin/devices", nil)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusNotFound {
		t.Errorf("Handler serves /admin/: %d", rec.Code)
	}
}
