package refserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Protocol constants the server applies (docs/protocol.md §16);
// the ones both sides apply are in package wire.
const (
	// MaxBlockMS caps the long-poll block_ms a device may ask for.
	MaxBlockMS = 30000
	// DefaultPollCheck is how often a blocked poll re-checks the queue
	// when nothing wakes it.
	DefaultPollCheck = 100 * time.Millisecond
	// DefaultRedeliveryGrace is added to an invocation's deadline before a
	// delivered invocation without result is handed out again.
	DefaultRedeliveryGrace = 30 * time.Second
	// DefaultTokenTTL is the lifetime of a pairing token issued through
	// the admin API without ttl_s (Metnos's manual-token TTL).
	DefaultTokenTTL = 600 * time.Second
	// DefaultAddr is where [Server.Start] listens when addr is "".
	DefaultAddr = "127.0.0.1:0"
)

// Config configures a [Server]. The zero value is a working server with a
// throwaway key and no executors, shim or runtime files.
type Config struct {
	// Key is the server's "author" key, which signs tokens, invocations,
	// bundles, the shim and runtime descriptors. nil: a throwaway key is
	// generated.
	Key ed25519.PrivateKey
	// Executors holds one top-level directory per executor, named after
	// it, with manifest.toml and the files its [code].files lists. nil:
	// no executors.
	Executors fs.FS
	// Shim holds the shim's files; every regular file, recursively, is
	// served under its '/'-separated path. nil: no shim.
	Shim fs.FS
	// RuntimeDir is a directory whose *.tar.gz files are served under
	// /agent/runtime/. "": none.
	RuntimeDir string
	// Mirror is the client mirror directory, laid out as the real
	// server's MIRROR_CLIENT_DIR (see [Publish]): manifest.json, the
	// builds under version/target/, and install.sh / install.ps1 for
	// join links. It is read on every request. "": no mirror (polls say
	// server_client_version null, descriptors 404 no_manifest).
	Mirror string
	// PollCheck is how often a blocked poll re-checks the queue (an
	// enqueue wakes it at once anyway). 0: [DefaultPollCheck].
	PollCheck time.Duration
	// RedeliveryGrace is added to deadline_ms before a delivered
	// invocation without result is re-delivered. 0: [DefaultRedeliveryGrace];
	// tests shorten it. A negative value means no grace at all.
	RedeliveryGrace time.Duration
	// Logger receives the server's log. nil: discarded.
	Logger *slog.Logger
	// Now is the server's clock. nil: time.Now.
	Now func() time.Time
}

// Server is a reference Metnos device server. Its methods are safe for
// concurrent use.
type Server struct {
	key   ed25519.PrivateKey
	pub   ed25519.PublicKey
	log   *slog.Logger
	now   func() time.Time
	check time.Duration
	grace time.Duration
	cfg   Config

	mu        sync.Mutex
	devices   map[string]*device // by device id
	byFP      map[string]string  // fingerprint -> device id
	tokens    map[string]*tokenUse
	invs      map[string]*invocation
	order     []*invocation // creation order
	lastNS    int64
	changed   chan struct{} // closed and replaced whenever state changes
	executors map[string]*executor
	shim      *shimState
	gate      func(invocationID string, body []byte) int
	exGate    func(name string) int
	shimDelay time.Duration
	joins     map[string]*joinSession // by join id

	closed    chan struct{}
	closeOnce sync.Once
	httpSrv   *http.Server
	handler   http.Handler
	admin     http.Handler
}

// New builds a server: it loads and signs the executors and the shim of
// cfg. Errors name the executor or file that could not be loaded.
func New(cfg Config) (*Server, error) {
	s := &Server{
		cfg:     cfg,
		key:     cfg.Key,
		log:     cfg.Logger,
		now:     cfg.Now,
		check:   cfg.PollCheck,
		grace:   cfg.RedeliveryGrace,
		devices: map[string]*device{},
		byFP:    map[string]string{},
		tokens:  map[string]*tokenUse{},
		invs:    map[string]*invocation{},
		joins:   map[string]*joinSession{},
		changed: make(chan struct{}),
		closed:  make(chan struct{}),
	}
	if s.key == nil {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("refserver: generating a throwaway server key: %w", err)
		}
		s.key = k
	}
	if len(s.key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("refserver: Config.Key is %d bytes, want an ed25519.PrivateKey of %d", len(s.key), ed25519.PrivateKeySize)
	}
	s.pub = s.key.Public().(ed25519.PublicKey)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.check <= 0 {
		s.check = DefaultPollCheck
	}
	switch {
	case s.grace == 0:
		s.grace = DefaultRedeliveryGrace
	case s.grace < 0:
		s.grace = 0
	}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	s.handler = s.deviceMux()
	s.admin = s.adminMux()
	return s, nil
}

// Reload reads and signs again the executors and the shim of the
// configuration, dropping every change made with [Server.SetExecutorFile]
// or [Server.SetShimFile]. Invocations already enqueued keep the digests
// they were signed with.
func (s *Server) Reload() error {
	exs, err := loadExecutors(s.cfg.Executors, s.key)
	if err != nil {
		return err
	}
	sh, err := loadShim(s.cfg.Shim, s.key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.executors, s.shim = exs, sh
	s.mu.Unlock()
	s.log.Info("refserver: loaded", "executors", len(exs), "shim_files", sh.count())
	return nil
}

// PublicKey is the server's public key, the one a device pins at pairing.
func (s *Server) PublicKey() ed25519.PublicKey { return s.pub }

// Handler serves the device-facing endpoints under /agent/.
func (s *Server) Handler() http.Handler { return s.handler }

// Start listens on addr ([DefaultAddr] when "") and serves the device
// endpoints and, under /admin/ for loopback clients only, the admin API,
// in the background. It returns the base URL, e.g. http://127.0.0.1:8765.
func (s *Server) Start(addr string) (string, error) {
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("refserver: listening on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", s.admin)
	mux.Handle("/", s.handler)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	if s.httpSrv != nil {
		s.mu.Unlock()
		ln.Close()
		return "", errors.New("refserver: Start called twice: use a second Server")
	}
	s.httpSrv = srv
	s.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("refserver: serving", "addr", ln.Addr().String(), "err", err)
		}
	}()
	url := "http://" + ln.Addr().String()
	s.log.Info("refserver: listening", "url", url)
	return url, nil
}

// Close wakes every blocked poll and stops the listener of [Server.Start],
// if any. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	s.mu.Lock()
	srv := s.httpSrv
	s.mu.Unlock()
	if srv != nil {
		return srv.Close()
	}
	return nil
}

// notifyLocked wakes everything waiting for a state change. s.mu is held.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}
