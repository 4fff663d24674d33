package refserver

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/metnos/agent/wire"
)

// Join session states, in order (the real server's devices.JOIN_STATES),
// and JoinExpired, what a session that was not registered before its
// expiry reads as.
const (
	JoinCreated    = "created"
	JoinOpened     = "opened"
	JoinDownloaded = "downloaded"
	JoinRegistered = "registered"
	JoinHeartbeat  = "heartbeat"
	JoinExpired    = "expired"
)

// DefaultJoinTTL is a join session's lifetime when none is given (the
// real server's DEFAULT_JOIN_TTL_S).
const DefaultJoinTTL = 1800 * time.Second

// WindowsClientTarget is the Rust client's Windows target, whose
// "client" entry in the mirror the Windows join installer pins.
const WindowsClientTarget = "x86_64-pc-windows-gnu"

var joinOrder = map[string]int{JoinCreated: 0, JoinOpened: 1, JoinDownloaded: 2, JoinRegistered: 3, JoinHeartbeat: 4}

// joinIDRule is the real server's _JOIN_ID_RE.
var joinIDRule = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{8,32}$`) })

// JoinInfo is a join session (docs/protocol.md §4.1): a link an admin
// sends, which leads to an installer with a one-time token baked in.
type JoinInfo struct {
	ID       string
	Token    string
	Name     string
	Platform string // auto, linux or windows
	// State is the effective state: [JoinExpired] once ExpiresAt has
	// passed before the device registered.
	State     string
	ExpiresAt time.Time
	DeviceID  string // set once registered
	// ClientHint is what the join page saw of the browser: "ip" and
	// "user_agent".
	ClientHint map[string]string
}

// Link is the join link under the server's base URL.
func (j JoinInfo) Link(base string) string {
	return strings.TrimRight(base, "/") + wire.PathJoin + j.ID
}

type joinSession struct {
	JoinInfo
	tid string
}

// NewJoin creates a join session for a device called name: a pairing
// token valid for ttl ([DefaultJoinTTL] when 0) and a 16-hex-digit join
// id. platform is auto, linux or windows.
func (s *Server) NewJoin(name, platform string, ttl time.Duration) (JoinInfo, error) {
	if platform != "auto" && platform != "linux" && platform != "windows" {
		return JoinInfo{}, fmt.Errorf("refserver: join for %s: platform %q is not auto, linux or windows", name, platform)
	}
	if ttl == 0 {
		ttl = DefaultJoinTTL
	}
	tok, err := s.IssueToken(name, ttl)
	if err != nil {
		return JoinInfo{}, err
	}
	now := s.now()
	p, err := parseToken(tok, s.pub, now)
	if err != nil {
		return JoinInfo{}, fmt.Errorf("refserver: join for %s: %w", name, err)
	}
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		return JoinInfo{}, fmt.Errorf("refserver: join for %s: %w", name, err)
	}
	j := &joinSession{JoinInfo{ID: hex.EncodeToString(id), Token: tok, Name: name, Platform: platform,
		State: JoinCreated, ExpiresAt: time.Unix(now.Unix()+int64(ttl/time.Second), 0)}, p.TID}
	s.mu.Lock()
	s.joins[j.ID] = j
	s.mu.Unlock()
	s.log.Info("refserver: join session", "join_id", j.ID, "name", name, "platform", platform)
	return s.joinInfoLocked(j), nil
}

// joinInfoLocked is a copy of j with its effective state.
func (s *Server) joinInfoLocked(j *joinSession) JoinInfo {
	out := j.JoinInfo
	if joinOrder[out.State] < joinOrder[JoinRegistered] && out.ExpiresAt.Unix() < s.now().Unix() {
		out.State = JoinExpired
	}
	return out
}

// Join returns the join session with that id.
func (s *Server) Join(id string) (JoinInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.joins[id]
	if !ok {
		return JoinInfo{}, false
	}
	return s.joinInfoLocked(j), true
}

// JoinState returns the effective state of a join session: created,
// opened, downloaded, registered, heartbeat or expired.
func (s *Server) JoinState(id string) (string, bool) {
	j, ok := s.Join(id)
	return j.State, ok
}

// markJoin advances a session's stored state, never backwards (the real
// mark_join_state).
func (s *Server) markJoin(id, state string, hint map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if j, ok := s.joins[id]; ok && joinOrder[state] > joinOrder[j.State] {
		j.State = state
		if hint != nil {
			j.ClientHint = hint
		}
	}
}

// joinRegisteredLocked marks the session of the token tid registered by
// deviceID. s.mu is held.
func (s *Server) joinRegisteredLocked(tid, deviceID string) {
	for _, j := range s.joins {
		if j.tid == tid && joinOrder[j.State] < joinOrder[JoinRegistered] {
			j.State, j.DeviceID = JoinRegistered, deviceID
		}
	}
}

// joinHeartbeatLocked advances deviceID's registered sessions to
// heartbeat. s.mu is held.
func (s *Server) joinHeartbeatLocked(deviceID string) {
	for _, j := range s.joins {
		if j.DeviceID == deviceID && j.State == JoinRegistered {
			j.State = JoinHeartbeat
		}
	}
}

// lookupJoin is the real _join_session_or_none.
func (s *Server) lookupJoin(id string) (JoinInfo, bool) {
	if !joinIDRule().MatchString(id) {
		return JoinInfo{}, false
	}
	return s.Join(id)
}

const joinPage = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="robots" content="noindex">
<title>Metnos — install the client</title></head><body>
<h1>Install Metnos on this PC</h1>
<p>Device: <code>%s</code> · state: <span id="state">%s</span></p>
<p><a id="dl" href="%s">Download the installer</a></p>
<p>metnos-refserver's stand-in of the real join page; it follows
<code>%s</code>.</p>
</body></html>
`

// handleJoinPage is GET /agent/client/join/{id}: a page for the
// browser; it marks the session opened.
func (s *Server) handleJoinPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	j, ok := s.lookupJoin(id)
	if !ok {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "<h1>404</h1><p>No such join session.</p>")
		return
	}
	ua := r.Header.Get("User-Agent")
	if len(ua) > 300 {
		ua = ua[:300]
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	s.markJoin(id, JoinOpened, map[string]string{"ip": host, "user_agent": ua})
	state := j.State
	if state == JoinCreated {
		state = JoinOpened
	}
	platform := j.Platform
	if platform == "auto" {
		platform = "linux"
		if strings.Contains(ua, "Windows") {
			platform = "windows"
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprintf(w, joinPage, html.EscapeString(j.Name), state,
		wire.PathJoin+id+"/installer?platform="+platform, wire.PathJoin+id+"/status")
}

// handleJoinStatus is GET /agent/client/join/{id}/status.
func (s *Server) handleJoinStatus(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	j, ok := s.lookupJoin(id)
	if !ok {
		writeError(w, http.StatusNotFound, "unknown_join", "join session not found")
		return
	}
	out := map[string]any{"join_id": id, "state": j.State, "device_name": j.Name,
		"platform": j.Platform, "expires_at": j.ExpiresAt.Unix()}
	if j.DeviceID != "" {
		if d, ok := s.Device(j.DeviceID); ok {
			out["device"] = map[string]any{"id": d.ID, "name": d.Name, "fingerprint": d.Fingerprint,
				"os_family": d.OSFamily, "os_arch": d.OSArch,
				"last_heartbeat": timeOrNil(d.LastHeartbeat), "last_poll": timeOrNil(d.LastPoll)}
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ShQuote quotes s for a POSIX shell inside single quotes, as the real
// server's _sh_squote: each single quote closes the quoting, is
// written escaped and reopens it.
func ShQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// CmdMarker separates the batch head of the Windows join installer from
// the install.ps1 that follows it.
const CmdMarker = "#::METNOS-PS1::#"

// cmdSafe is the real _CMD_SAFE_RE: what a value baked into the batch
// head may hold.
var cmdSafe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._:/+\[\]\-]+$`) })

// cmdEnv is one baked variable of the Windows installer.
type cmdEnv struct{ name, value string }

// windowsCmdInstaller is the real _windows_cmd_installer: a CRLF batch
// head that sets env and runs the PowerShell after the marker, then
// ps1 as it is.
func windowsCmdInstaller(env []cmdEnv, ps1 string) ([]byte, error) {
	head, tail := CmdMarker[:9], CmdMarker[9:]
	boot := `powershell -NoProfile -ExecutionPolicy Bypass -Command ` +
		`"$m='` + head + `'+'` + tail + `'; ` +
		`$t=[IO.File]::ReadAllText($env:METNOS_SELF); ` +
		`$i=$t.IndexOf($m); if ($i -lt 0) { exit 9 }; ` +
		`Invoke-Expression $t.Substring($i+$m.Length)"`
	lines := []string{
		"@echo off",
		"setlocal",
		"title Metnos Client Setup",
		"rem Installer Metnos: doppio click per eseguire. La finestra resta",
		"rem aperta a fine corsa con l'esito (mai un errore che sparisce).",
	}
	for _, e := range env {
		if !cmdSafe().MatchString(e.value) {
			return nil, fmt.Errorf("valore non batch-safe per %s: %q", e.name, e.value)
		}
		lines = append(lines, `set "`+e.name+"="+e.value+`"`)
	}
	lines = append(lines,
		`set "METNOS_SELF=%~f0"`,
		boot,
		`set "EC=%ERRORLEVEL%"`,
		"echo.",
		`if "%EC%"=="0" (echo [OK] Installazione completata. Puoi chiudere `+
			"questa finestra.) else (echo [ERRORE] Installazione NON riuscita: "+
			"leggi il messaggio qui sopra.)",
		"pause",
		"exit /b %EC%",
		CmdMarker,
	)
	return []byte(strings.Join(lines, "\r\n") + "\r\n" + ps1), nil
}

// windowsRuntimePin is the real _windows_python_runtime_pin over
// Config.RuntimeDir: the newest Windows python-build-standalone archive
// and its sha256 (from a .sha256 sidecar, else computed; unlike the
// real one, it does not write the sidecar).
func (s *Server) windowsRuntimePin() (name, sha string, ok bool) {
	if s.cfg.RuntimeDir == "" {
		return "", "", false
	}
	names, err := filepath.Glob(filepath.Join(s.cfg.RuntimeDir, "cpython-*-x86_64-pc-windows-msvc-install_only.tar.gz"))
	if err != nil || len(names) == 0 {
		return "", "", false
	}
	sort.Strings(names)
	p := names[len(names)-1]
	if b, err := os.ReadFile(p + ".sha256"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			sha = strings.ToLower(f[0])
		}
		return filepath.Base(p), sha, true
	}
	if f, err := os.Open(p); err == nil {
		h := sha256.New()
		if _, err := io.Copy(h, f); err == nil {
			sha = hex.EncodeToString(h.Sum(nil))
		}
		f.Close()
	}
	return filepath.Base(p), sha, true
}

// handleJoinInstaller is GET /agent/client/join/{id}/installer: the
// mirror's installer with the server URL and the session's token baked
// in (the real client_join_installer); it marks the session downloaded.
func (s *Server) handleJoinInstaller(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	j, ok := s.lookupJoin(id)
	if !ok {
		writeError(w, http.StatusNotFound, "unknown_join", "join session not found")
		return
	}
	if j.State == JoinExpired {
		writeError(w, http.StatusGone, "expired", "join session expired; generate a new link")
		return
	}
	platform := r.URL.Query().Get("platform")
	if platform == "" {
		platform = j.Platform
	}
	if platform == "auto" || platform == "" {
		platform = "linux"
		if strings.Contains(r.Header.Get("User-Agent"), "Windows") {
			platform = "windows"
		}
	}
	if platform != "linux" && platform != "windows" {
		writeError(w, http.StatusBadRequest, "invalid_platform", "platform must be linux|windows")
		return
	}
	serverURL := "http://" + r.Host
	if r.Host == "" {
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			serverURL = "http://" + a.String()
		}
	}
	src := "install.sh"
	if platform == "windows" {
		src = "install.ps1"
	}
	var body []byte
	var err error
	if s.cfg.Mirror != "" {
		var st os.FileInfo
		p := filepath.Join(s.cfg.Mirror, src)
		if st, err = os.Stat(p); err == nil && st.Mode().IsRegular() {
			body, err = os.ReadFile(p)
		} else if err == nil {
			err = errors.New("not a regular file")
		}
	}
	if s.cfg.Mirror == "" || err != nil {
		writeError(w, http.StatusServiceUnavailable, "installer_missing", "no %s in the server's client mirror", src)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if platform == "windows" {
		version, entry, merr := s.lookupEntry(RustClientComponent, WindowsClientTarget)
		sha, _ := entry["sha256"].(string)
		if merr != nil || version == "" || sha == "" {
			writeError(w, http.StatusServiceUnavailable, "pin_unavailable",
				"cannot build the Windows installer with a sha256 pin: the mirror has no client for %s", WindowsClientTarget)
			return
		}
		env := []cmdEnv{{"METNOS_SERVER", serverURL}, {"METNOS_TOKEN", j.Token},
			{"METNOS_CLIENT_VERSION", version}, {"METNOS_CLIENT_SHA256", sha}}
		if name, rsha, ok := s.windowsRuntimePin(); ok {
			env = append(env, cmdEnv{"METNOS_PYTHON_RUNTIME_WIN", name})
			if rsha != "" {
				env = append(env, cmdEnv{"METNOS_PYTHON_RUNTIME_WIN_SHA256", rsha})
			}
		}
		raw, err := windowsCmdInstaller(env, string(body))
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "unsafe_value", "%v", err)
			return
		}
		s.markJoin(id, JoinDownloaded, nil)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="MetnosClientSetup.cmd"`)
		w.WriteHeader(http.StatusOK)
		w.Write(raw)
		return
	}
	prelude := "METNOS_SERVER=" + ShQuote(serverURL) + "; export METNOS_SERVER\n" +
		"METNOS_TOKEN=" + ShQuote(j.Token) + "; export METNOS_TOKEN\n"
	text := string(body)
	if first, rest, _ := strings.Cut(text, "\n"); strings.HasPrefix(first, "#!") {
		text = first + "\n" + prelude + rest
	} else {
		text = prelude + text
	}
	s.markJoin(id, JoinDownloaded, nil)
	w.Header().Set("Content-Type", "text/x-shellscript; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="metnos-client-install.sh"`)
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, text)
}
