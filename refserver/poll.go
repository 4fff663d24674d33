package refserver

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/metnos/agent/wire"
)

// blockFor reads block_ms: an integer > 0, capped at MaxBlockMS; anything
// else means an immediate answer.
func blockFor(v any) time.Duration {
	n, ok := v.(json.Number)
	if !ok {
		return 0
	}
	ms, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return time.Duration(min(ms, MaxBlockMS)) * time.Millisecond
}

// handlePoll is POST /agent/poll (docs/protocol.md §5.3).
func (s *Server) handlePoll(w http.ResponseWriter, r *http.Request) {
	m, id, ok := s.authDevice(w, r)
	if !ok {
		return
	}
	cursor, _ := m["cursor"].(string)
	block := blockFor(m["block_ms"])
	s.mu.Lock()
	if d, ok := s.devices[id]; ok {
		now := s.now()
		d.LastPoll, d.LastHeartbeat = now, now
	}
	s.mu.Unlock()

	deadline := time.NewTimer(block)
	defer deadline.Stop()
	tick := time.NewTicker(s.check)
	defer tick.Stop()
	for {
		if r.Context().Err() != nil {
			return // the device went away: claim nothing for it
		}
		s.mu.Lock()
		if d, ok := s.devices[id]; !ok || d.Revoked {
			// Revoked while its long-poll waited (an agent running
			// invocations side by side keeps one open while they
			// run): it gets no more work.
			s.mu.Unlock()
			writeError(w, http.StatusForbidden, wire.CodeUnknownDevice, "device %s is unknown or revoked: pair it again", id)
			return
		}
		inv := s.claimLocked(id, cursor, s.now())
		var obj any
		if inv != nil {
			obj = inv.Object
		}
		shimSHA := s.shim.digest()
		ch := s.changed
		s.mu.Unlock()
		if inv != nil || block == 0 {
			if inv != nil {
				s.log.Info("refserver: delivered", "invocation_id", inv.ID, "device_id", id, "deliveries", inv.Deliveries)
			}
			writeJSON(w, http.StatusOK, map[string]any{"invocation": obj, "server_client_version": s.clientVersion(), "shim_sha256": shimSHA})
			return
		}
		select {
		case <-ch:
		case <-tick.C:
		case <-deadline.C:
			block = 0 // one last look, then answer null
		case <-r.Context().Done():
			return
		case <-s.closed:
			block = 0
		}
	}
}

// handleHeartbeat is POST /agent/heartbeat (docs/protocol.md §5.4).
func (s *Server) handleHeartbeat(w http.ResponseWriter, r *http.Request) {
	m, id, ok := s.authDevice(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	if d, ok := s.devices[id]; ok {
		d.LastHeartbeat = s.now()
		if p, ok := m["profile"].(map[string]any); ok {
			d.Profile = p
		}
		s.joinHeartbeatLocked(id)
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"ok": true})
}

// handleResult is POST /agent/result (docs/protocol.md §5.5).
func (s *Server) handleResult(w http.ResponseWriter, r *http.Request) {
	sig := r.Header.Get(wire.SigHeader)
	if sig == "" {
		writeError(w, http.StatusUnauthorized, wire.CodeMissingSignature, "sign the body and send the signature in %s", wire.SigHeader)
		return
	}
	body, m, ok := readObject(w, r)
	if !ok {
		return
	}
	invID, ok1 := m["invocation_id"].(string)
	devID, ok2 := m["device_id"].(string)
	if !ok1 || !ok2 {
		writeError(w, http.StatusBadRequest, wire.CodeInvalidResult, "invocation_id and device_id must be strings")
		return
	}
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		if status := gate(invID, body); status != 0 {
			writeError(w, status, wire.CodeInternal, "refused by the test gate")
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, known := s.devices[devID]
	if !known || d.Revoked || wire.VerifyBytes(d.PublicKey, body, sig) != nil {
		writeError(w, http.StatusForbidden, wire.CodeBadSignature, "result signature does not verify for device %s (unknown, revoked or wrong key)", devID)
		return
	}
	inv, ok := s.invs[invID]
	if !ok {
		writeError(w, http.StatusBadRequest, wire.CodeInvalidResult, "unknown invocation %s", invID)
		return
	}
	if inv.DeviceID != devID {
		writeError(w, http.StatusForbidden, wire.CodeBadSignature, "invocation %s was not sent to device %s", invID, devID)
		return
	}
	inv.ResultPosts++
	inv.ResultBodies = append(inv.ResultBodies, body)
	if inv.State == StateDone || inv.State == StateFailed {
		s.log.Info("refserver: duplicate result ignored", "invocation_id", invID, "posts", inv.ResultPosts)
		s.notifyLocked()
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
		return
	}
	inv.ResultBody = body
	inv.ResultAt = time.Now()
	inv.State = StateFailed
	if truthy(m["ok"]) {
		inv.State = StateDone
	}
	s.notifyLocked()
	s.log.Info("refserver: result", "invocation_id", invID, "device_id", devID, "state", inv.State)
	writeJSON(w, http.StatusOK, map[string]any{"ok": true})
}

// SetResultGate installs a test hook called with every result POST
// that carries a signature, before it is checked: a non-zero status is
// answered instead (the result is not stored), and the hook may block
// to hold the request open (a delivery cut by a crash). Nil removes it.
func (s *Server) SetResultGate(gate func(invocationID string, body []byte) int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = gate
}
