package refserver

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

// clock is real time plus an offset tests can advance.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// harness is a server started on 127.0.0.1 with the testdata executors
// and shim.
type harness struct {
	t     *testing.T
	srv   *Server
	url   string
	clock *clock
}

func newHarness(t *testing.T, mods ...func(*Config)) *harness {
	t.Helper()
	c := &clock{}
	cfg := Config{
		Executors: os.DirFS("testdata/executors"),
		Shim:      os.DirFS("testdata/shim"),
		Now:       c.Now,
	}
	for _, m := range mods {
		m(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url, err := srv.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return &harness{t: t, srv: srv, url: url, clock: c}
}

// testDevice is a paired device key.
type testDevice struct {
	key ed25519.PrivateKey
	id  string
}

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pubWire(k ed25519.PrivateKey) string {
	return wire.PublicKeyWire(k.Public().(ed25519.PublicKey))
}

// do sends a request and returns the status, the body and the response.
func (h *harness) do(method, path string, body []byte, hdr map[string]string) (int, []byte, *http.Response) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if v, ok := hdr["Host"]; ok {
		req.Host = v // the client sends req.Host, not a Host header
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode, b, resp
}

// register posts /agent/register and returns the status and decoded body.
func (h *harness) register(token string, key ed25519.PrivateKey) (int, map[string]any) {
	h.t.Helper()
	b, _ := json.Marshal(map[string]string{"token": token, "public_key": pubWire(key), "os_family": "linux", "os_arch": "x86_64"})
	st, body, _ := h.do("POST", "/agent/register", b, nil)
	return st, h.object(body)
}

// pair issues a token and registers a fresh key.
func (h *harness) pair(name string) testDevice {
	h.t.Helper()
	tok, err := h.srv.IssueToken(name, time.Minute)
	if err != nil {
		h.t.Fatal(err)
	}
	k := newKey(h.t)
	st, m := h.register(tok, k)
	if st != 200 {
		h.t.Fatalf("register: %d %v", st, m)
	}
	return testDevice{key: k, id: m["device_id"].(string)}
}

// signed posts body signed by key.
func (h *harness) signed(path string, key ed25519.PrivateKey, body []byte) (int, map[string]any) {
	h.t.Helper()
	st, b, _ := h.do("POST", path, body, map[string]string{wire.SigHeader: wire.SignBytes(key, body)})
	return st, h.object(b)
}

// poll polls for d with cursor (nil = null) and block_ms.
func (h *harness) poll(d testDevice, cursor any, blockMS int) map[string]any {
	h.t.Helper()
	body, _ := json.Marshal(map[string]any{"block_ms": blockMS, "capabilities": []string{"fs"}, "cursor": cursor, "device_id": d.id})
	st, m := h.signed("/agent/poll", d.key, body)
	if st != 200 {
		h.t.Fatalf("poll: %d %v", st, m)
	}
	return m
}

// pollInvocation polls once and returns the parsed, verified invocation.
func (h *harness) pollInvocation(d testDevice, cursor any) wire.Invocation {
	h.t.Helper()
	m := h.poll(d, cursor, 0)
	if m["invocation"] == nil {
		h.t.Fatalf("poll: no invocation: %v", m)
	}
	inv, err := wire.ParseInvocation(m["invocation"])
	if err != nil {
		h.t.Fatal(err)
	}
	if err := inv.Verify(h.srv.PublicKey()); err != nil {
		h.t.Fatal(err)
	}
	return inv
}

// result posts a result for inv from d and returns the status.
func (h *harness) result(d testDevice, invID string, ok bool, payload any) (int, []byte) {
	h.t.Helper()
	body, err := json.Marshal(map[string]any{"device_id": d.id, "invocation_id": invID, "ok": ok,
		"entries": []any{}, "n_processed": 0, "elapsed_ms": 1, "sandbox": "none", "payload": payload})
	if err != nil {
		h.t.Fatal(err)
	}
	st, _ := h.signed("/agent/result", d.key, body)
	return st, body
}

func (h *harness) object(b []byte) map[string]any {
	h.t.Helper()
	v, err := wire.Decode(b)
	if err != nil {
		return map[string]any{"_raw": string(b)}
	}
	m, _ := v.(map[string]any)
	return m
}

func (h *harness) enqueue(d testDevice, executor string, args any, o EnqueueOptions) string {
	h.t.Helper()
	id, err := h.srv.Enqueue(d.id, executor, args, o)
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}
