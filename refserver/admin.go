package refserver

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/metnos/agent/wire"
)

// AdminHandler serves the admin API under /admin/, answering only
// requests from loopback addresses (others get 403):
//
//	POST /admin/token      {"name", "ttl_s"}                  → {"token"}
//	POST /admin/enqueue    {"device_id", "executor", "args", "turn_id",
//	                        "reversibility", "deadline_ms", "id"} → {"invocation_id"}
//	GET  /admin/invocation/{id}                               → invocation, "result" raw
//	POST /admin/undo       {"device_id", "turn_id"}           → UndoPlan
//	POST /admin/revoke     {"device_id"}                      → {"ok": true}
//	GET  /admin/devices                                       → {"devices": [...]}
//	POST /admin/devices/join {"name", "platform", "ttl_s"}    → {"join_id", "join_url", "state",
//	                        "device_name", "platform", "expires_at", "token"}
//
// Errors use the protocol's {"error", "message"} shape.
func (s *Server) AdminHandler() http.Handler { return s.admin }

func (s *Server) adminMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/token", s.adminToken)
	mux.HandleFunc("POST /admin/enqueue", s.adminEnqueue)
	mux.HandleFunc("GET /admin/invocation/{id}", s.adminInvocation)
	mux.HandleFunc("POST /admin/undo", s.adminUndo)
	mux.HandleFunc("POST /admin/revoke", s.adminRevoke)
	mux.HandleFunc("GET /admin/devices", s.adminDevices)
	mux.HandleFunc("POST /admin/devices/join", s.adminJoin)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fromLoopback(r) {
			writeError(w, http.StatusForbidden, "forbidden", "the admin API only answers loopback clients")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// fromLoopback reports whether the request's peer is a loopback address.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func intField(m map[string]any, k string) (int64, error) {
	switch v := m[k].(type) {
	case nil:
		return 0, nil
	case json.Number:
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, errors.New(k + " must be an integer")
		}
		return n, nil
	}
	return 0, errors.New(k + " must be an integer")
}

func (s *Server) adminToken(w http.ResponseWriter, r *http.Request) {
	_, m, ok := readObject(w, r)
	if !ok {
		return
	}
	name, _ := m["name"].(string)
	ttl, err := intField(m, "ttl_s")
	if err != nil {
		writeError(w, http.StatusBadRequest, wire.CodeMissingField, "%v", err)
		return
	}
	d := DefaultTokenTTL
	if ttl != 0 {
		d = time.Duration(ttl) * time.Second
	}
	tok, err := s.IssueToken(name, d)
	if err != nil {
		writeError(w, http.StatusBadRequest, wire.CodeMissingField, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"token": tok})
}

func (s *Server) adminEnqueue(w http.ResponseWriter, r *http.Request) {
	_, m, ok := readObject(w, r)
	if !ok {
		return
	}
	dev, _ := m["device_id"].(string)
	ex, _ := m["executor"].(string)
	var o EnqueueOptions
	o.TurnID, _ = m["turn_id"].(string)
	o.Reversibility, _ = m["reversibility"].(string)
	o.ID, _ = m["id"].(string)
	var err error
	if o.DeadlineMS, err = intField(m, "deadline_ms"); err != nil {
		writeError(w, http.StatusBadRequest, wire.CodeMissingField, "%v", err)
		return
	}
	if env, ok := m["env_injections"].(map[string]any); ok {
		o.Env = map[string]string{}
		for k, v := range env {
			if sv, ok := v.(string); ok {
				o.Env[k] = sv
			}
		}
	}
	id, err := s.Enqueue(dev, ex, m["args"], o)
	if err != nil {
		writeError(w, http.StatusBadRequest, "enqueue_failed", "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"invocation_id": id})
}

// invocationJSON is the admin view of an invocation.
func invocationJSON(inv InvocationInfo) map[string]any {
	var result any
	if inv.ResultBody != nil {
		result = json.RawMessage(inv.ResultBody)
	}
	out := map[string]any{
		"invocation_id": inv.ID, "state": inv.State, "device_id": inv.DeviceID,
		"executor": inv.Executor, "turn_id": inv.TurnID, "reversibility": inv.Reversibility,
		"deadline_ms": inv.DeadlineMS, "args": inv.Args, "deliveries": inv.Deliveries,
		"result_posts": inv.ResultPosts, "undone": inv.Undone, "result": result,
		"enqueued_at": inv.EnqueuedAt.UTC().Format(time.RFC3339Nano),
	}
	return out
}

func (s *Server) adminInvocation(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	inv, ok := s.Invocation(id)
	if !ok {
		writeError(w, http.StatusNotFound, "unknown_invocation", "no invocation %s on this server", id)
		return
	}
	writeJSON(w, http.StatusOK, invocationJSON(inv))
}

func (s *Server) adminUndo(w http.ResponseWriter, r *http.Request) {
	_, m, ok := readObject(w, r)
	if !ok {
		return
	}
	dev, _ := m["device_id"].(string)
	turn, _ := m["turn_id"].(string)
	plan, err := s.Undo(dev, turn, EnqueueOptions{})
	if err != nil {
		writeError(w, http.StatusBadRequest, "undo_failed", "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, plan)
}

func (s *Server) adminRevoke(w http.ResponseWriter, r *http.Request) {
	_, m, ok := readObject(w, r)
	if !ok {
		return
	}
	dev, _ := m["device_id"].(string)
	if err := s.Revoke(dev); err != nil {
		writeError(w, http.StatusNotFound, wire.CodeUnknownDevice, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true})
}

func (s *Server) adminDevices(w http.ResponseWriter, r *http.Request) {
	list := []map[string]any{}
	ts := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	for _, d := range s.Devices() {
		list = append(list, map[string]any{
			"device_id": d.ID, "name": d.Name, "owner_user_id": d.Owner, "fingerprint": d.Fingerprint,
			"public_key": wire.PublicKeyWire(d.PublicKey), "os_family": d.OSFamily, "os_arch": d.OSArch,
			"paired_at": ts(d.PairedAt), "revoked": d.Revoked, "last_poll": ts(d.LastPoll),
			"last_heartbeat": ts(d.LastHeartbeat), "profile": d.Profile,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"devices": list})
}

// adminJoin is the real POST /admin/devices/join, with "ttl_s" (default
// [DefaultJoinTTL]) and "token" added: the real one takes no TTL and
// does not return the token.
func (s *Server) adminJoin(w http.ResponseWriter, r *http.Request) {
	_, m, ok := readObject(w, r)
	if !ok {
		return
	}
	name, _ := m["name"].(string)
	name = strings.TrimSpace(name)
	platform, _ := m["platform"].(string)
	platform = strings.TrimSpace(platform)
	if platform == "" {
		platform = "auto"
	}
	if name == "" || strings.ContainsFunc(name, unicode.IsSpace) {
		writeError(w, http.StatusBadRequest, "invalid_name", "device name must be non-empty, without spaces")
		return
	}
	ttl, err := intField(m, "ttl_s")
	if err != nil || ttl < 0 {
		writeError(w, http.StatusBadRequest, wire.CodeMissingField, "ttl_s must be a positive integer")
		return
	}
	j, err := s.NewJoin(name, platform, time.Duration(ttl)*time.Second)
	if err != nil {
		writeError(w, http.StatusBadRequest, "token_error", "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"join_id": j.ID, "join_url": j.Link("http://" + r.Host), "state": j.State,
		"device_name": j.Name, "platform": j.Platform, "expires_at": j.ExpiresAt.Unix(), "token": j.Token,
	})
}
