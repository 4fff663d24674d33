// Package client is the device's side of every request to the Metnos
// server: registration, poll, heartbeat, result delivery, the executor
// and shim bundles, the runtime descriptor and the runtime archives
// (docs/protocol.md §4–§11).
//
// # What it guarantees
//
//   - One [Client] carries every request of a command, over one
//     transport: the OS network, or the embedded tailnet node when the
//     command was given its dialer. No request of the device goes
//     around it.
//   - No redirect is followed, by any request (including runtime
//     downloads through [Client.HTTPClient]): a 3xx is the answer, so a
//     proxy that turned a signed POST into a GET never passes for the
//     server's 200.
//   - Poll, heartbeat and result bodies are signed with the device key
//     over the exact bytes sent ([wire.SigHeader]).
//   - A non-2xx answer is a *[ServerError] naming the URL, with one
//     sentence saying what happened for each error code of the protocol.
//
// # What it does not do
//
// It verifies nothing the server sends (package agent checks bundles,
// [wire.VerifyRuntimeDescriptor] descriptors), keeps no state on disk,
// and does not retry: the run loop and the spool decide that.
package client

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	neturl "net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/wire"
)

// Timeouts of the protocol's requests (docs/protocol.md §5.1, §16).
const (
	RegisterTimeout = 15 * time.Second
	SignedTimeout   = 40 * time.Second // heartbeat, result (a poll waits its block + 15 s)
	FetchTimeout    = 30 * time.Second // executor and shim bundles, runtime descriptor
	PollBlock       = 25 * time.Second
)

// Answer limits: the most the client reads of a 2xx answer, by kind
// (docs/protocol.md §1.2). An answer announced or found larger fails
// with [ErrTooLarge] once the limit is read, and no more is read.
const (
	// smallAnswer bounds the answers to register, heartbeat and result
	// and a runtime descriptor: a few hundred bytes each, bounded here
	// by the server's own body limit.
	smallAnswer = wire.MaxBodyBytes
	// pollAnswer bounds a poll's answer: one invocation, whose
	// arguments reached the server in a request of at most
	// wire.MaxBodyBytes, and may grow when escaped again.
	pollAnswer = 16 << 20
	// bundleAnswer bounds an executor or shim bundle (code files, base64).
	bundleAnswer = 64 << 20
	// errorAnswer is what is read of a non-2xx answer: enough for its
	// error code and message, or its first line.
	errorAnswer = 64 << 10
)

// ErrTooLarge is wrapped by the error of a request whose answer is
// larger than what the protocol ever sends for it.
var ErrTooLarge = errors.New("the answer is too large")

// tooLargeError is the error of an answer above its limit.
type tooLargeError struct {
	url   string
	limit int64
}

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("the answer from %s is larger than %d MiB: not a Metnos server?", e.url, e.limit>>20)
}

func (e *tooLargeError) Unwrap() error { return ErrTooLarge }

// Dialer opens a connection to addr, as [net.Dialer.DialContext] does;
// the embedded tailnet node provides one.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// Client speaks the device side of the Metnos HTTP protocol to one
// server: unsigned registration and fetches, and poll, heartbeat and
// result bodies signed with the device key over their exact bytes.
type Client struct {
	base     string
	key      ed25519.PrivateKey
	deviceID string
	hc       *http.Client

	// polls are the cancels of the polls in flight, which a request
	// that found the server's path dead cuts short: their connections
	// are most likely dead too, and would otherwise be waited on for
	// their whole block.
	mu    sync.Mutex
	polls map[*watch]context.CancelCauseFunc
	// answerIdle and pollMargin are AnswerIdle and PollMargin (shorter
	// in this package's tests).
	answerIdle, pollMargin time.Duration
}

// New returns a Client for the server at base (its URL; a trailing
// slash is dropped) with the device key and, once paired, the device
// id. Connections go through dial, or the OS network when dial is nil.
func New(base string, key ed25519.PrivateKey, deviceID string, dial Dialer) *Client {
	hc := &http.Client{CheckRedirect: noRedirect, Transport: newTransport(dial)}
	return &Client{base: strings.TrimRight(base, "/"), key: key, deviceID: deviceID, hc: hc,
		polls: map[*watch]context.CancelCauseFunc{}, answerIdle: AnswerIdle, pollMargin: PollMargin}
}

// noRedirect is the one redirect rule of every request of the device: a
// 3xx is the answer (a proxy that redirected a signed POST to a GET must
// not pass for the server's 200).
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// URL is the server's URL, without a trailing slash.
func (c *Client) URL() string { return c.base }

// DeviceID is the device id the client signs as ("" before pairing).
func (c *Client) DeviceID() string { return c.deviceID }

// HTTPClient returns the http.Client every request goes through: the
// client's transport, no redirect followed, no overall timeout (give
// each request a context). Package fetch downloads runtime archives
// with it.
func (c *Client) HTTPClient() *http.Client { return c.hc }

// RuntimeURL is the URL of a runtime archive on the server, GET
// /agent/runtime/{filename} (docs/protocol.md §11), for a ranged download.
func (c *Client) RuntimeURL(filename string) string { return c.base + wire.PathRuntime + filename }

// ServerError is a response of the server other than 2xx, with the
// error code and message of its JSON body (docs/protocol.md §4.2) when it had one.
type ServerError struct {
	URL     string
	Status  int
	Code    string
	Message string
	// HTML is set when the body was an HTML page (a web server or a
	// proxy, not a Metnos server), which the error does not repeat.
	HTML bool
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
		return fmt.Sprintf("%s: the server refused the body as too large (413, its limit is %d MiB)", e.URL, wire.MaxBodyBytes>>20)
	case e.HTML:
		return fmt.Sprintf("not a Metnos server? %s answered %d %s with an HTML page", e.URL, e.Status, http.StatusText(e.Status))
	case e.Message == "":
		return fmt.Sprintf("%s: the server answered %d %s", e.URL, e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("%s: the server answered %d: %s", e.URL, e.Status, e.Message)
}

// serverError is the *ServerError of a non-2xx answer: the error code
// and message of a JSON body (docs/protocol.md §4.2), else the first
// line of a text body, at most 120 characters, or only that it was an
// HTML page: a body is never pasted whole into an error.
func serverError(url string, resp *http.Response, b []byte) *ServerError {
	se := &ServerError{URL: url, Status: resp.StatusCode}
	var eb struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &eb) == nil && eb.Error != "" {
		se.Code, se.Message = oneLine(eb.Error, 80), oneLine(eb.Message, 300)
		return se
	}
	text := strings.TrimSpace(string(b))
	if strings.HasPrefix(strings.ToLower(resp.Header.Get("Content-Type")), "text/html") || strings.HasPrefix(text, "<") {
		se.HTML = true
		return se
	}
	se.Message = oneLine(text, 120)
	return se
}

// oneLine returns the first line of s, its control characters shown escaped (a
// server's words shown on a terminal), cut to at most n characters.
func oneLine(s string, n int) string {
	s, _, cut := strings.Cut(strings.TrimSpace(s), "\n")
	s = term.Sanitize(strings.TrimSuffix(s, "\r"))
	if r := []rune(s); len(r) > n {
		s, cut = string(r[:n]), true
	}
	if cut {
		s += "…"
	}
	return s
}

// requestError is the error of a request that got no answer, naming
// the URL once: the *url.Error of package http, which names it too, is
// replaced by what it wraps (the chain stays for errors.Is and As).
func requestError(u string, err error) error {
	var ue *neturl.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", u, ue.Err)
	}
	return fmt.Errorf("%s: %w", u, err)
}

// serverErrorWords says, for each error code of the protocol, what
// happened in one sentence and what to do.
var serverErrorWords = map[string]string{
	wire.CodeInvalidToken:       "the server refused the pairing token (mistyped, expired or never issued): ask the Metnos admin page for a new one",
	wire.CodeTokenAlreadyUsed:   "this pairing token was already used by another device: ask the Metnos admin page for a new one",
	wire.CodeMissingField:       "the server says the request lacks a field it needs (is this a Metnos server?)",
	wire.CodeInvalidJSON:        "the server could not read the request as JSON (is this a Metnos server?)",
	wire.CodeMissingSignature:   "the server wants a device signature the request did not carry",
	wire.CodeUnknownDevice:      "the server does not know this device, or it was revoked: pair again with `metnos-agent register`",
	wire.CodeBadSignature:       "the server did not accept this device's signature (revoked, re-paired with another key, or the body was changed on the way): pair again if it persists",
	wire.CodeInvalidResult:      "the server does not know the invocation this result is for",
	wire.CodeInvalidName:        "the server refused the executor name",
	wire.CodeUnknownExecutor:    "the server has no executor of that name",
	wire.CodeUnverifiedExecutor: "the server could not verify that executor's own signature",
	wire.CodeInternal:           "the server failed while handling the request; see its log",
}

// Retryable reports whether a result delivery that failed with status
// may succeed later (docs/protocol.md §5.5): 408, 423, 425, 429 and every 5xx, and also
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

// StatusOf returns the HTTP status of a *ServerError, 0 for any other
// error (transport, timeout).
func StatusOf(err error) int {
	var se *ServerError
	if errors.As(err, &se) {
		return se.Status
	}
	return 0
}

// ErrPathDead is wrapped by the error of a poll cut short because
// another request got no data from the server for its idle limit (the
// server stalled, or the path to it is down), or [Client.Reconnect]
// said the path changed: its connection is most likely dead too.
var ErrPathDead = errors.New("cut short: the path to the server went away or changed, and the poll's connection with it")

// errStalled is the cause of a poll cut short because another request
// got no data for its idle limit; it is an [ErrPathDead].
var errStalled error = cutError("cut short: another request to the server got no data for its idle limit (the server stalled, or the network path to it is down), so the poll's connection is most likely dead too")

// ErrReconnected is the cause of a poll cut short by
// [Client.Reconnect]: the caller asked for new connections, the server
// did not fail. It is an [ErrPathDead].
var ErrReconnected error = cutError("cut short for a new connection: the path to the server changed")

// cutError is a cause of a poll cut short, other than ErrPathDead's
// words; it is an ErrPathDead.
type cutError string

func (e cutError) Error() string        { return string(e) }
func (e cutError) Is(target error) bool { return target == ErrPathDead }

// do sends one request and reads the whole response. A non-2xx status
// is a *ServerError. The request fails after timeout, or once its
// connection carries no byte for AnswerIdle (see [Client.doWatched]).
func (c *Client) do(ctx context.Context, method, path string, body []byte, signed bool, timeout time.Duration, limit int64) ([]byte, error) {
	return c.doWatched(ctx, method, path, body, signed, timeout, limit, &watch{idle: c.answerIdle})
}

// doWatched is do with the connection watched by w. After a transport
// error, the pooled connections are closed, so that the next request
// dials afresh; after a dead connection, the polls in flight are cut
// short too.
func (c *Client) doWatched(ctx context.Context, method, path string, body []byte, signed bool, timeout time.Duration, limit int64, w *watch) ([]byte, error) {
	b, err := c.send(withWatch(ctx, w), method, path, body, signed, timeout, limit, w)
	if err != nil && StatusOf(err) == 0 && ctx.Err() == nil {
		c.hc.CloseIdleConnections()
		if deadConn(err) {
			c.cutPolls(w, errStalled)
		}
	}
	return b, err
}

// Reconnect closes the pooled connections and cuts short the polls in
// flight (they fail with [ErrReconnected]), so that the next requests go
// over new connections: for when the network path to the server is
// known to have changed (the embedded tailnet node lost and found its
// way to the server again), when the old connections may be dead
// without anything on them saying so yet.
func (c *Client) Reconnect() {
	c.hc.CloseIdleConnections()
	c.cutPolls(nil, ErrReconnected)
}

// cutPolls cuts short the polls in flight but except's, with cause why.
func (c *Client) cutPolls(except *watch, why error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w, cancel := range c.polls {
		if w != except {
			cancel(why)
		}
	}
}

// send sends one request and reads the whole response, at most limit
// bytes of a 2xx answer (an answer larger fails with [ErrTooLarge]).
func (c *Client) send(ctx context.Context, method, path string, body []byte, signed bool, timeout time.Duration, limit int64, w *watch) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := c.base + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, requestError(url, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if signed {
		req.Header.Set(wire.SigHeader, wire.SignBytes(c.key, body))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, transportError(ctx, url, timeout, w, err)
	}
	defer resp.Body.Close()
	ok := resp.StatusCode/100 == 2
	if !ok {
		limit = errorAnswer
	}
	if ok && resp.ContentLength > limit {
		return nil, &tooLargeError{url, limit}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, transportError(ctx, url, timeout, w, err)
	}
	if int64(len(b)) > limit {
		if ok {
			return nil, &tooLargeError{url, limit}
		}
		b = b[:limit]
	}
	if !ok {
		return b, serverError(url, resp, b)
	}
	return b, nil
}

// transportError words a request's failure to get an answer, naming
// the URL once: no answer at all, a connection that went silent, a poll
// cut short, or nothing listening say so, rather than "context deadline
// exceeded", "i/o timeout" or "connection refused" alone. The cause
// stays in the chain.
func transportError(ctx context.Context, url string, timeout time.Duration, w *watch, err error) error {
	var ue *neturl.Error
	if errors.As(err, &ue) {
		// It names the URL again (the cause stays in the chain).
		err = ue.Err
	}
	switch {
	case deadConn(err):
		return wordedError{fmt.Sprintf("%s: no data for %s (is the server up? it stalled, or the network path to it is down)", url, seconds(w.idle)), err}
	case errors.Is(context.Cause(ctx), ErrPathDead):
		return fmt.Errorf("%s: %w", url, context.Cause(ctx))
	case errors.Is(err, context.DeadlineExceeded) && context.Cause(ctx) == context.DeadlineExceeded:
		return wordedError{fmt.Sprintf("%s: no answer within %s (is the server up? it stalled, or the network path to it is down)", url, seconds(timeout)), err}
	case errors.Is(err, syscall.ECONNREFUSED):
		host := url
		if p, perr := neturl.Parse(url); perr == nil {
			host = p.Host
		}
		return wordedError{fmt.Sprintf("%s: nothing listens at %s: is the Metnos server running, and is this its device port (8765)?", url, host), err}
	}
	return fmt.Errorf("%s: %w", url, err)
}

// wordedError is an error said in its own words, its cause kept in the
// chain for errors.Is and As but not repeated.
type wordedError struct {
	msg string
	err error
}

func (e wordedError) Error() string { return e.msg }
func (e wordedError) Unwrap() error { return e.err }

// seconds is d as "15 s".
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s"
}

// Register pairs the device key with the server using a one-time token
// (docs/protocol.md §4.2).
func (c *Client) Register(ctx context.Context, token string) (wire.Registration, error) {
	body, _ := json.Marshal(map[string]string{
		"token":      token,
		"public_key": wire.PublicKeyWire(c.key.Public().(ed25519.PublicKey)),
		"os_family":  OSFamily(),
		"os_arch":    OSArch(),
	})
	b, err := c.do(ctx, http.MethodPost, wire.PathRegister, body, false, RegisterTimeout, smallAnswer)
	if err != nil {
		return wire.Registration{}, err
	}
	var r wire.Registration
	if err := json.Unmarshal(b, &r); err != nil || r.DeviceID == "" {
		return wire.Registration{}, fmt.Errorf("not a Metnos server? %s%s answered %s", c.base, wire.PathRegister, notWhat(b, "a registration"))
	}
	return r, nil
}

// notWhat says what an answer b that is not the want the protocol
// expects is instead: an HTML page, something that is not JSON, or
// JSON that is not want.
func notWhat(b []byte, want string) string {
	text := bytes.TrimSpace(b)
	switch {
	case len(text) == 0:
		return "with an empty body"
	case text[0] == '<':
		return "with an HTML page"
	case !json.Valid(text):
		return "with something that is not JSON"
	}
	return "with JSON that is not " + want
}

// Poll long-polls for the next invocation after cursor ("" for none),
// asking the server to hold the request up to block (docs/protocol.md §5.3).
func (c *Client) Poll(ctx context.Context, cursor string, block time.Duration) (wire.PollResponse, error) {
	var cur any
	if cursor != "" {
		cur = cursor
	}
	body, err := wire.Canonical(map[string]any{
		"block_ms":     block.Milliseconds(),
		"capabilities": []any{"fs", "net", "pkg"},
		"cursor":       cur,
		"device_id":    c.deviceID,
	})
	if err != nil {
		return wire.PollResponse{}, err
	}
	// The server answers within block_ms: a connection silent for
	// longer than that and PollMargin is dead.
	w := &watch{idle: block + c.pollMargin}
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c.mu.Lock()
	c.polls[w] = cancel
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.polls, w)
		c.mu.Unlock()
	}()
	b, err := c.doWatched(pctx, http.MethodPost, wire.PathPoll, body, true, block+15*time.Second, pollAnswer, w)
	if err != nil {
		return wire.PollResponse{}, err
	}
	v, err := wire.Decode(b)
	m, ok := v.(map[string]any)
	if err != nil || !ok {
		return wire.PollResponse{}, fmt.Errorf("not a Metnos server? %s%s answered %s", c.base, wire.PathPoll, notWhat(b, "a JSON object"))
	}
	r := wire.PollResponse{Invocation: m["invocation"]}
	r.ShimSHA256, _ = m["shim_sha256"].(string)
	r.ServerClientVersion, _ = m["server_client_version"].(string)
	return r, nil
}

// Heartbeat sends the device profile (docs/protocol.md §5.4).
func (c *Client) Heartbeat(ctx context.Context, profile map[string]any) error {
	// Field order device_id, profile, as the Rust client's struct.
	p, err := wire.Canonical(profile)
	if err != nil {
		return fmt.Errorf("heartbeat profile: %w", err)
	}
	id, _ := json.Marshal(c.deviceID)
	body := []byte(`{"device_id":` + string(id) + `,"profile":` + string(p) + `}`)
	w := &watch{idle: c.answerIdle}
	_, err = c.doWatched(ctx, http.MethodPost, wire.PathHeartbeat, body, true, SignedTimeout, smallAnswer, w)
	if err != nil && StatusOf(err) == 0 && ctx.Err() == nil && (w.reused.Load() || deadConn(err)) {
		// It failed on a connection the path's outage left dead (the
		// pooled ones are closed by now): once more, on a new one.
		_, err = c.doWatched(ctx, http.MethodPost, wire.PathHeartbeat, body, true, SignedTimeout, smallAnswer, &watch{idle: c.answerIdle})
	}
	return err
}

// Deliver posts a spooled result body, byte for byte (docs/protocol.md §5.5).
func (c *Client) Deliver(ctx context.Context, body []byte) error {
	_, err := c.do(ctx, http.MethodPost, wire.PathResult, body, true, SignedTimeout, smallAnswer)
	return err
}

// Executor fetches an executor bundle (docs/protocol.md §5.6). It is not verified.
func (c *Client) Executor(ctx context.Context, name string) (wire.ExecutorBundle, error) {
	b, err := c.do(ctx, http.MethodGet, wire.PathExecutor+name, nil, false, FetchTimeout, bundleAnswer)
	if err != nil {
		return wire.ExecutorBundle{}, fmt.Errorf("executor %s: %w", name, err)
	}
	var bu wire.ExecutorBundle
	if err := json.Unmarshal(b, &bu); err != nil {
		return wire.ExecutorBundle{}, fmt.Errorf("executor %s: the bundle is not JSON: %w", name, err)
	}
	return bu, nil
}

// ExecutorUntil is [Client.Executor] for an invocation whose deadline
// is until: a failure that may pass (no answer, a connection cut
// mid-answer, 408, 429 or a 5xx) is retried with the polls' backoff
// (docs/protocol.md §16: 1 s, doubling up to 10 s, ±25 %) while the
// next attempt would start before until. The error is the last
// attempt's, saying how many there were.
func (c *Client) ExecutorUntil(ctx context.Context, name string, until time.Time) (wire.ExecutorBundle, error) {
	backoff := time.Second
	for attempt := 1; ; attempt++ {
		b, err := c.Executor(ctx, name)
		if err == nil || ctx.Err() != nil || !transient(err) {
			return b, err
		}
		wait := Jitter(backoff)
		if time.Now().Add(wait).After(until) {
			if attempt > 1 {
				err = fmt.Errorf("%w (%d attempts, until the invocation's deadline)", err, attempt)
			}
			return b, err
		}
		select {
		case <-ctx.Done():
			return b, err
		case <-time.After(wait):
		}
		backoff = NextBackoff(backoff)
	}
}

// Jitter is how long to wait after a failure, for the backoff reached:
// backoff × a factor in [0.75, 1.25) (docs/protocol.md §16).
func Jitter(backoff time.Duration) time.Duration {
	return time.Duration(float64(backoff) * (0.75 + rand.Float64()*0.5))
}

// NextBackoff is the backoff after one more failure: doubled, up to
// 10 s (docs/protocol.md §16). The first is 1 s.
func NextBackoff(backoff time.Duration) time.Duration { return min(2*backoff, 10*time.Second) }

// transient reports whether a fetch that failed with err may succeed if
// tried again: no answer or a cut answer (a transport error), or the
// status 408, 429 or 5xx.
func transient(err error) bool {
	switch st := StatusOf(err); {
	case st == 0:
		// Not an answer too large, or one that is not a bundle at all.
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		return !errors.Is(err, ErrTooLarge) && !errors.As(err, &syn) && !errors.As(err, &typ)
	case st == 408, st == 429, st >= 500:
		return true
	}
	return false
}

// Shim fetches the shim bundle (docs/protocol.md §5.7). It is not verified.
func (c *Client) Shim(ctx context.Context) (wire.ShimBundle, error) {
	b, err := c.do(ctx, http.MethodGet, wire.PathShim, nil, false, FetchTimeout, bundleAnswer)
	if err != nil {
		return wire.ShimBundle{}, fmt.Errorf("shim: %w", err)
	}
	var sb wire.ShimBundle
	if err := json.Unmarshal(b, &sb); err != nil {
		return wire.ShimBundle{}, fmt.Errorf("shim: the bundle is not JSON: %w", err)
	}
	return sb, nil
}

// RuntimeDescriptor fetches the signed descriptor envelope of a runtime
// archive (docs/protocol.md §11), as the server sent it: check it with
// [wire.VerifyRuntimeDescriptor].
func (c *Client) RuntimeDescriptor(ctx context.Context, filename string) ([]byte, error) {
	if !wire.ValidRuntimeName(filename) {
		return nil, fmt.Errorf("runtime: %q is not a runtime archive name (…tar.gz)", filename)
	}
	b, err := c.do(ctx, http.MethodGet, wire.PathRuntimeDescriptor+filename, nil, false, FetchTimeout, smallAnswer)
	if err != nil {
		return nil, fmt.Errorf("runtime descriptor: %w", err)
	}
	return b, nil
}

// OSFamily is this machine's os_family word of the protocol: linux,
// windows, macos (Rust's std::env::consts::OS).
func OSFamily() string {
	if runtime.GOOS == "darwin" {
		return "macos"
	}
	return runtime.GOOS
}

// OSArch is this machine's os_arch word: x86_64, aarch64.
func OSArch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	}
	return runtime.GOARCH
}
