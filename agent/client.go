package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/wire"
)

// Timeouts of the protocol's requests (Appendix C).
const (
	RegisterTimeout = 15 * time.Second
	SignedTimeout   = 40 * time.Second // poll (25 s block + 15 s), heartbeat, result
	FetchTimeout    = 30 * time.Second // executor and shim bundles
	PollBlock       = 25 * time.Second
)

// maxResponse caps what the agent reads of any server response.
const maxResponse = 64 << 20

// Client speaks the device side of the Metnos HTTP protocol to one
// server: unsigned registration and fetches, and poll, heartbeat and
// result bodies signed with the device key over their exact bytes.
type Client struct {
	// Base is the server URL without a trailing slash.
	Base string
	// Key is the device key; DeviceID is set once paired.
	Key      ed25519.PrivateKey
	DeviceID string
	// HTTP is the client requests go through (nil: a plain one); the
	// embedded tailnet plugs in here.
	HTTP *http.Client
}

// NewClient returns a Client for the server at base.
func NewClient(base string, key ed25519.PrivateKey, deviceID string) *Client {
	return &Client{Base: strings.TrimRight(base, "/"), Key: key, DeviceID: deviceID}
}

// ServerError is a response of the server other than 2xx, with the
// error code and message of its JSON body (§4.3) when it had one.
type ServerError struct {
	URL     string
	Status  int
	Code    string
	Message string
}

func (e *ServerError) Error() string {
	why := serverErrorWords[e.Code]
	switch {
	case why != "" && e.Message != "":
		return fmt.Sprintf("%s: %s (%s: %s)", e.URL, why, e.Code, e.Message)
	case why != "":
		return fmt.Sprintf("%s: %s (%s)", e.URL, why, e.Code)
	case e.Code != "":
		return fmt.Sprintf("%s: the server answered %d %s: %s", e.URL, e.Status, e.Code, e.Message)
	case e.Status == http.StatusRequestEntityTooLarge:
		return fmt.Sprintf("%s: the server refused the body as too large (413, its limit is 4 MiB)", e.URL)
	}
	return fmt.Sprintf("%s: the server answered %d %s", e.URL, e.Status, strings.TrimSpace(e.Message))
}

// serverErrorWords says, for each error code of the protocol, what
// happened in one sentence and what to do.
var serverErrorWords = map[string]string{
	"invalid_token":       "the server refused the pairing token (mistyped, expired or never issued): ask the Metnos admin page for a new one",
	"token_already_used":  "this pairing token was already used by another device: ask the Metnos admin page for a new one",
	"missing_field":       "the server says the request lacks a field it needs (is this a Metnos server?)",
	"invalid_json":        "the server could not read the request as JSON (is this a Metnos server?)",
	"missing_signature":   "the server wants a device signature the request did not carry",
	"unknown_device":      "the server does not know this device, or it was revoked: pair again with `metnos-agent register`",
	"bad_signature":       "the server did not accept this device's signature (revoked, re-paired with another key, or the body was changed on the way): pair again if it persists",
	"invalid_result":      "the server does not know the invocation this result is for",
	"invalid_name":        "the server refused the executor name",
	"unknown_executor":    "the server has no executor of that name",
	"unverified_executor": "the server could not verify that executor's own signature",
	"internal_error":      "the server failed while handling the request; see its log",
}

// Retryable reports whether a result delivery that failed with status
// may succeed later (§5.5): 408, 423, 425, 429 and every 5xx, and also
// every 3xx (a proxy in the way, which the protocol never sends).
func Retryable(status int) bool {
	switch status {
	case 408, 423, 425, 429:
		return true
	}
	// A redirect is a misconfigured proxy, not the server's refusal:
	// keep the result rather than lose it.
	return status >= 500 || (status >= 300 && status < 400)
}

// plainClient follows no redirect: a 3xx is the answer (a proxy that
// redirected a signed POST to a GET must not pass for the server's 200).
var plainClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return plainClient
}

// do sends one request and reads the whole response. A non-2xx status
// is a *ServerError.
func (c *Client) do(ctx context.Context, method, path string, body []byte, signed bool, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := c.Base + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if signed {
		req.Header.Set("X-Metnos-Device-Sig", wire.SignBytes(c.Key, body))
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, fmt.Errorf("%s: reading the response: %w", url, err)
	}
	if resp.StatusCode/100 != 2 {
		se := &ServerError{URL: url, Status: resp.StatusCode}
		var eb struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &eb) == nil && eb.Error != "" {
			se.Code, se.Message = eb.Error, eb.Message
		} else {
			se.Message = string(b)
			if len(se.Message) > 200 {
				se.Message = se.Message[:200] + "…"
			}
		}
		return b, se
	}
	return b, nil
}

// StatusOf returns the HTTP status of a *ServerError, 0 for any other
// error (transport, timeout).
func StatusOf(err error) int {
	var se *ServerError
	if errors.As(err, &se) {
		return se.Status
	}
	return 0
}

// Registration is the server's answer to /agent/register (§4.3).
type Registration struct {
	DeviceID        string  `json:"device_id"`
	Name            string  `json:"name"`
	OwnerUserID     string  `json:"owner_user_id"`
	Fingerprint     string  `json:"fingerprint"`
	PairedAt        string  `json:"paired_at"`
	ServerPublicKey *string `json:"server_public_key"`
}

// Register pairs the device key with the server using a one-time token.
func (c *Client) Register(ctx context.Context, token string) (Registration, error) {
	body, _ := json.Marshal(map[string]string{
		"token":      token,
		"public_key": pairing.PublicKeyWire(c.Key.Public().(ed25519.PublicKey)),
		"os_family":  OSFamily(),
		"os_arch":    OSArch(),
	})
	b, err := c.do(ctx, http.MethodPost, "/agent/register", body, false, RegisterTimeout)
	if err != nil {
		return Registration{}, err
	}
	var r Registration
	if err := json.Unmarshal(b, &r); err != nil || r.DeviceID == "" {
		return Registration{}, fmt.Errorf("%s/agent/register: the answer is not a registration (%v): is this a Metnos server?", c.Base, err)
	}
	return r, nil
}

// PollResponse is the answer to /agent/poll (§5.3). Invocation is the
// decoded invocation object (nil when none).
type PollResponse struct {
	Invocation          any
	ShimSHA256          string
	ServerClientVersion string
}

// Poll long-polls for the next invocation after cursor ("" for none).
func (c *Client) Poll(ctx context.Context, cursor string, block time.Duration) (PollResponse, error) {
	var cur any
	if cursor != "" {
		cur = cursor
	}
	body, err := wire.Canonical(map[string]any{
		"block_ms":     block.Milliseconds(),
		"capabilities": []any{"fs", "net", "pkg"},
		"cursor":       cur,
		"device_id":    c.DeviceID,
	})
	if err != nil {
		return PollResponse{}, err
	}
	b, err := c.do(ctx, http.MethodPost, "/agent/poll", body, true, block+15*time.Second)
	if err != nil {
		return PollResponse{}, err
	}
	v, err := wire.Decode(b)
	m, ok := v.(map[string]any)
	if err != nil || !ok {
		return PollResponse{}, fmt.Errorf("%s/agent/poll: the answer is not a JSON object: %v", c.Base, err)
	}
	r := PollResponse{Invocation: m["invocation"]}
	r.ShimSHA256, _ = m["shim_sha256"].(string)
	r.ServerClientVersion, _ = m["server_client_version"].(string)
	return r, nil
}

// Heartbeat sends the device profile (§5.4).
func (c *Client) Heartbeat(ctx context.Context, profile map[string]any) error {
	// Field order device_id, profile, as the Rust client's struct.
	p, err := wire.Canonical(profile)
	if err != nil {
		return fmt.Errorf("heartbeat profile: %w", err)
	}
	id, _ := json.Marshal(c.DeviceID)
	body := []byte(`{"device_id":` + string(id) + `,"profile":` + string(p) + `}`)
	_, err = c.do(ctx, http.MethodPost, "/agent/heartbeat", body, true, SignedTimeout)
	return err
}

// Deliver posts a spooled result body, byte for byte.
func (c *Client) Deliver(ctx context.Context, body []byte) error {
	_, err := c.do(ctx, http.MethodPost, "/agent/result", body, true, SignedTimeout)
	return err
}

// Executor fetches an executor bundle (§5.6).
func (c *Client) Executor(ctx context.Context, name string) (Bundle, error) {
	b, err := c.do(ctx, http.MethodGet, "/agent/executor/"+name, nil, false, FetchTimeout)
	if err != nil {
		return Bundle{}, fmt.Errorf("executor %s: %w", name, err)
	}
	var bu Bundle
	if err := json.Unmarshal(b, &bu); err != nil {
		return Bundle{}, fmt.Errorf("executor %s: the bundle is not JSON: %w", name, err)
	}
	return bu, nil
}

// Shim fetches the shim bundle (§5.7).
func (c *Client) Shim(ctx context.Context) (ShimBundle, error) {
	b, err := c.do(ctx, http.MethodGet, "/agent/shim", nil, false, FetchTimeout)
	if err != nil {
		return ShimBundle{}, fmt.Errorf("shim: %w", err)
	}
	var sb ShimBundle
	if err := json.Unmarshal(b, &sb); err != nil {
		return ShimBundle{}, fmt.Errorf("shim: the bundle is not JSON: %w", err)
	}
	return sb, nil
}

// OSFamily is the os_family word of the protocol: linux, windows,
// macos (Rust's std::env::consts::OS).
func OSFamily() string {
	if runtime.GOOS == "darwin" {
		return "macos"
	}
	return runtime.GOOS
}

// OSArch is the os_arch word: x86_64, aarch64.
func OSArch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	}
	return runtime.GOARCH
}
