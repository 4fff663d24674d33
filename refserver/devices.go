package refserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/metnos/agent/wire"
)

// DeviceInfo is what the server knows of a paired device.
type DeviceInfo struct {
	ID            string
	Name          string
	Owner         string
	Fingerprint   string // SHA-256 hex of the raw public key (docs/protocol.md §2.3)
	PublicKey     ed25519.PublicKey
	OSFamily      string
	OSArch        string
	PairedAt      time.Time
	Revoked       bool
	LastPoll      time.Time // zero: never polled
	LastHeartbeat time.Time // zero: never seen
	// Profile is the latest heartbeat profile, decoded with numbers as
	// json.Number; nil until a heartbeat carried an object.
	Profile map[string]any
}

type device struct{ DeviceInfo }

// Device returns the device with that id.
func (s *Server) Device(id string) (DeviceInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.devices[id]
	if !ok {
		return DeviceInfo{}, false
	}
	return d.DeviceInfo, true
}

// Devices returns every paired device, revoked ones included, by name
// then id.
func (s *Server) Devices() []DeviceInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]DeviceInfo, 0, len(s.devices))
	for _, d := range s.devices {
		out = append(out, d.DeviceInfo)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Revoke revokes a device: its signed requests get 403 until it pairs
// again with a fresh token.
func (s *Server) Revoke(deviceID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.devices[deviceID]
	if !ok {
		return fmt.Errorf("refserver: revoking device %s: no such device (see Devices)", deviceID)
	}
	d.Revoked = true
	s.log.Info("refserver: device revoked", "device_id", deviceID)
	return nil
}

// handleRegister is POST /agent/register (docs/protocol.md §4.2).
func (s *Server) handleRegister(w http.ResponseWriter, r *http.Request) {
	_, m, ok := readObject(w, r)
	if !ok {
		return
	}
	tok, ok1 := m["token"].(string)
	pubText, ok2 := m["public_key"].(string)
	if !ok1 || !ok2 {
		writeError(w, http.StatusBadRequest, wire.CodeMissingField, "token and public_key must be strings")
		return
	}
	pub, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(pubText, "="))
	if err != nil || len(pub) != ed25519.PublicKeySize {
		writeError(w, http.StatusBadRequest, wire.CodeMissingField, "public_key must be the base64url of a 32-byte Ed25519 key")
		return
	}
	osFamily, _ := m["os_family"].(string)
	osArch, _ := m["os_arch"].(string)
	now := s.now()
	p, err := parseToken(tok, s.pub, now)
	if err != nil {
		writeError(w, http.StatusBadRequest, wire.CodeInvalidToken, "%v", err)
		return
	}
	fp := wire.ServerFingerprint(pub)

	s.mu.Lock()
	defer s.mu.Unlock()
	use, issued := s.tokens[p.TID]
	switch {
	case !issued:
		writeError(w, http.StatusBadRequest, wire.CodeInvalidToken, "token was never issued by this server")
		return
	case use.consumedBy != "" && use.consumedBy != fp:
		writeError(w, http.StatusConflict, wire.CodeTokenAlreadyUsed, "token was already used by another device: issue a new one")
		return
	case use.consumedBy == fp:
		if d, ok := s.devices[use.deviceID]; ok {
			s.joinRegisteredLocked(p.TID, d.ID)
			writeJSON(w, http.StatusOK, registerResponse(d, s.pub))
			return
		}
	}
	d, known := s.devices[s.byFP[fp]]
	if !known {
		id := make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			writeError(w, http.StatusInternalServerError, wire.CodeInternal, "generating a device id: %v", err)
			return
		}
		d = &device{DeviceInfo{ID: hex.EncodeToString(id), Fingerprint: fp, PublicKey: ed25519.PublicKey(pub)}}
		s.devices[d.ID] = d
		s.byFP[fp] = d.ID
	}
	d.Name, d.Owner, d.Revoked, d.PairedAt = p.Name, p.Owner, false, now.UTC().Truncate(time.Second)
	if osFamily != "" {
		d.OSFamily = osFamily
	}
	if osArch != "" {
		d.OSArch = osArch
	}
	use.consumedBy, use.deviceID = fp, d.ID
	s.joinRegisteredLocked(p.TID, d.ID)
	s.log.Info("refserver: device registered", "device_id", d.ID, "name", d.Name, "repaired", known)
	writeJSON(w, http.StatusOK, registerResponse(d, s.pub))
}

func registerResponse(d *device, server ed25519.PublicKey) map[string]any {
	return map[string]any{
		"device_id":         d.ID,
		"name":              d.Name,
		"owner_user_id":     d.Owner,
		"fingerprint":       d.Fingerprint,
		"paired_at":         d.PairedAt.UTC().Format("2006-01-02T15:04:05Z"),
		"server_public_key": wire.PublicKeyWire(server),
	}
}

// authDevice applies the checks shared by poll and heartbeat (docs/protocol.md §5.2) in
// order and returns the parsed body and the device id. On failure it has
// already answered.
func (s *Server) authDevice(w http.ResponseWriter, r *http.Request) (map[string]any, string, bool) {
	body, m, ok := readObject(w, r)
	if !ok {
		return nil, "", false
	}
	id, ok := m["device_id"].(string)
	if !ok {
		writeError(w, http.StatusBadRequest, wire.CodeMissingField, "device_id must be a string")
		return nil, "", false
	}
	sig := r.Header.Get(wire.SigHeader)
	if sig == "" {
		writeError(w, http.StatusUnauthorized, wire.CodeMissingSignature, "sign the body and send the signature in %s", wire.SigHeader)
		return nil, "", false
	}
	s.mu.Lock()
	d, known := s.devices[id]
	var pub ed25519.PublicKey
	if known && !d.Revoked {
		pub = d.PublicKey
	}
	s.mu.Unlock()
	if pub == nil {
		writeError(w, http.StatusForbidden, wire.CodeUnknownDevice, "device %s is unknown or revoked: pair it again", id)
		return nil, "", false
	}
	if err := wire.VerifyBytes(pub, body, sig); err != nil {
		writeError(w, http.StatusForbidden, wire.CodeBadSignature, "signature over the body does not verify with device %s's key", id)
		return nil, "", false
	}
	return m, id, true
}
