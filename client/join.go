package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/metnos/agent/wire"
)

// The answers of a join link's endpoints (docs/protocol.md §4.1), in
// one sentence each and what to do.
var (
	// ErrJoinUnknown: the server does not know the join id.
	ErrJoinUnknown = errors.New("this join link is unknown to the server (mistyped, or already cleaned up): ask for a new link")
	// ErrJoinExpired: the join session's token expired before it paired
	// a device.
	ErrJoinExpired = errors.New("this join link has expired: ask the admin for a new one (links last 30 minutes)")
	// ErrJoinNoInstaller: the server's mirror has no installer, so its
	// join endpoint has nothing to bake the token into.
	ErrJoinNoInstaller = errors.New("the server has no installer in its mirror, so its join links cannot pair a device: ask the admin for a token instead (Devices page, manual token) and run metnos-agent register")
	// ErrNotMetnos is wrapped by the error of a join link whose server
	// does not answer as a Metnos server does.
	ErrNotMetnos = errors.New("does not answer as a Metnos server")
)

// JoinStates are the states of a join session, in order, as the real
// server's devices.JOIN_STATES, and "expired".
var JoinStates = []string{"created", "opened", "downloaded", "registered", "heartbeat", "expired"}

// Limits of the join endpoints' answers.
const (
	// joinPageLimit is what is read of the join page, then dropped: the
	// request is made for its effect (the session becomes "opened").
	joinPageLimit = 64 << 10
	// installerLimit bounds an installer (a script of a few tens of KiB).
	installerLimit = 1 << 20
	// joinTimeout bounds each request of a join link.
	joinTimeout = 30 * time.Second
)

// JoinStatus is the answer of GET <join link>/status.
type JoinStatus struct {
	JoinID     string `json:"join_id"`
	State      string `json:"state"`
	DeviceName string `json:"device_name"`
	Platform   string `json:"platform"`
	// Device is the device the link paired, once it did.
	Device *JoinDevice `json:"device,omitempty"`
}

// JoinDevice is the device a join link paired, as its status shows it.
type JoinDevice struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Fingerprint string `json:"fingerprint"`
}

// At returns a Client for the server at base that shares c's key,
// device id and transport (the tailnet node, when c dials through
// one): pairing from a join link learns the server's URL from the
// installer only after it asked the link's server.
func (c *Client) At(base string) *Client {
	return &Client{base: strings.TrimRight(base, "/"), key: c.key, deviceID: c.deviceID, hc: c.hc,
		polls: map[*watch]context.CancelCauseFunc{}, answerIdle: c.answerIdle, pollMargin: c.pollMargin}
}

// JoinPlatform is the installer platform a join link is asked for:
// "windows" on Windows, "linux" elsewhere (the server has no other
// installer; the linux one is a shell script, which is only parsed).
func JoinPlatform() string {
	if runtime.GOOS == "windows" {
		return "windows"
	}
	return "linux"
}

// JoinStatus asks the server for the state of the join session at
// joinURL (GET <joinURL>/status).
func (c *Client) JoinStatus(ctx context.Context, joinURL string) (JoinStatus, error) {
	u := joinURL + "/status"
	resp, b, err := c.joinGet(ctx, u, wire.MaxBodyBytes)
	if err != nil {
		return JoinStatus{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return JoinStatus{}, joinError(u, resp, b)
	}
	var s JoinStatus
	if err := json.Unmarshal(b, &s); err != nil || s.JoinID != joinID(joinURL) || !knownState(s.State) {
		return JoinStatus{}, fmt.Errorf("%s %w (it answered %s)", u, ErrNotMetnos, notWhat(b, "a join session's status"))
	}
	return s, nil
}

// OpenJoinPage gets the join page as a browser would, which marks the
// session "opened" for the admin; the page itself is dropped.
func (c *Client) OpenJoinPage(ctx context.Context, joinURL string) error {
	resp, b, err := c.joinGet(ctx, joinURL, joinPageLimit)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusNotFound {
		// The real server's page answers an HTML 404; its status
		// endpoint, asked first, was the server's JSON.
		return ErrJoinUnknown
	}
	if resp.StatusCode != http.StatusOK {
		return joinError(joinURL, resp, b)
	}
	return nil
}

// JoinInstaller gets the installer the server made for the join
// session at joinURL, for platform (see [JoinPlatform]), with the
// server's URL and the token baked in (GET
// <joinURL>/installer?platform=…). It is returned to be parsed, never
// run.
func (c *Client) JoinInstaller(ctx context.Context, joinURL, platform string) ([]byte, error) {
	b, err := c.joinInstaller(ctx, joinURL, platform)
	if platform == "windows" && errors.Is(err, errPinUnavailable) {
		// The real server refuses a Windows installer it cannot pin the
		// Rust client's binary in (503 pin_unavailable), but that pin
		// is nothing to us: we only read METNOS_SERVER and
		// METNOS_TOKEN, which the linux script carries as well.
		b, err = c.joinInstaller(ctx, joinURL, "linux")
	}
	if errors.Is(err, errPinUnavailable) {
		err = ErrJoinNoInstaller
	}
	return b, err
}

// errPinUnavailable is the real server's 503 pin_unavailable.
var errPinUnavailable = errors.New("the server cannot pin a Windows installer")

func (c *Client) joinInstaller(ctx context.Context, joinURL, platform string) ([]byte, error) {
	u := joinURL + "/installer?platform=" + neturl.QueryEscape(platform)
	resp, b, err := c.joinGet(ctx, u, installerLimit)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusServiceUnavailable && errorCode(b) == "pin_unavailable" {
		return nil, errPinUnavailable
	}
	if resp.StatusCode != http.StatusOK {
		return nil, joinError(u, resp, b)
	}
	return b, nil
}

// joinGet gets u, reading at most limit bytes of a 200 answer (more
// is [ErrTooLarge], but for the join page, which is only cut) and
// errorAnswer of another. resp's body is read and closed.
func (c *Client) joinGet(ctx context.Context, u string, limit int64) (resp *http.Response, b []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, requestError(u, err)
	}
	resp, err = c.hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			host := u
			if p, perr := neturl.Parse(u); perr == nil {
				host = p.Host
			}
			return nil, nil, wordedError{fmt.Sprintf("%s: nothing listens at %s: is the Metnos server running, and is this its device port (8765)?", u, host), err}
		}
		return nil, nil, requestError(u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		limit = errorAnswer
	}
	b, err = io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, nil, requestError(u, err)
	}
	if int64(len(b)) > limit {
		if resp.StatusCode == http.StatusOK && limit != joinPageLimit {
			return nil, nil, &tooLargeError{u, limit}
		}
		b = b[:limit]
	}
	return resp, b, nil
}

// joinError is the error of a join endpoint's answer other than 200:
// the real server's JSON errors (404 unknown_join, 410 expired, 503
// installer_missing) in their sentence, and anything else as a
// *ServerError, or not a Metnos server when it is not the server's JSON.
func joinError(u string, resp *http.Response, b []byte) error {
	status, code := resp.StatusCode, errorCode(b)
	switch {
	case status == http.StatusNotFound && code != "":
		return ErrJoinUnknown
	case status == http.StatusGone && code != "":
		return ErrJoinExpired
	case status == http.StatusServiceUnavailable && code == "installer_missing":
		return ErrJoinNoInstaller
	case code == "":
		return fmt.Errorf("%s %w (it answered %d %s%s)", u, ErrNotMetnos, status, http.StatusText(status), notAnError(serverError(u, resp, b)))
	}
	return serverError(u, resp, b)
}

// notAnError says what a non-JSON error answer was: an HTML page, or
// its first line.
func notAnError(se *ServerError) string {
	switch {
	case se.HTML:
		return " with an HTML page"
	case se.Message != "":
		return ": " + se.Message
	}
	return ""
}

// errorCode is the error code of the server's JSON error body b, "" if
// b is not one.
func errorCode(b []byte) string {
	var eb struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &eb) != nil {
		return ""
	}
	return eb.Error
}

// joinID is the last path element of a join link.
func joinID(joinURL string) string {
	return joinURL[strings.LastIndexByte(joinURL, '/')+1:]
}

// knownState reports whether s is a join session's state.
func knownState(s string) bool {
	for _, k := range JoinStates {
		if s == k {
			return true
		}
	}
	return false
}
