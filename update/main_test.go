package update

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/wire"
)

// The test binary is also the process the kill tests kill: with
// METNOS_UPDATE_CHILD set it runs one step of the cycle and exits, or is
// killed by the step hook at METNOS_UPDATE_KILL_AT.
func TestMain(m *testing.M) {
	if mode := os.Getenv("METNOS_UPDATE_CHILD"); mode != "" {
		os.Exit(child(mode))
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// child runs as METNOS_UPDATE_CHILD says:
//   - apply: Apply the descriptor METNOS_UPDATE_DESC (JSON) from the
//     server at METNOS_UPDATE_URL to METNOS_UPDATE_EXE's files;
//   - boot: Boot METNOS_UPDATE_EXE's files;
//   - swap: swap METNOS_UPDATE_EXE's files (Windows: its own).
//
// METNOS_UPDATE_EXE "self" is this executable. It prints what it got
// and exits 0, or 1 on an error.
func child(mode string) int {
	exe := os.Getenv("METNOS_UPDATE_EXE")
	if exe == "self" {
		var err error
		if exe, err = Executable(); err != nil {
			fmt.Println(err)
			return 1
		}
	}
	f := FilesFor(exe)
	statePath := os.Getenv("METNOS_UPDATE_STATE")
	if kill := os.Getenv("METNOS_UPDATE_KILL_AT"); kill != "" {
		step = func(name string) {
			if name == kill {
				die()
			}
		}
	}
	switch mode {
	case "apply":
		var d wire.ComponentDescriptor
		if err := json.Unmarshal([]byte(os.Getenv("METNOS_UPDATE_DESC")), &d); err != nil {
			fmt.Println(err)
			return 1
		}
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		c := client.New(os.Getenv("METNOS_UPDATE_URL"), key, "dev1", nil)
		u := New(Config{StatePath: statePath, Files: f, Version: "1.0.0", Target: testTarget, Client: c})
		err := u.Apply(context.Background(), d)
		fmt.Println("apply:", err)
		if !errors.Is(err, ErrRestart) {
			return 1
		}
	case "boot":
		out, _, err := Boot(statePath, f, nil)
		fmt.Println("boot:", out, err)
		if err != nil {
			return 1
		}
	case "swap":
		err := swap(f)
		fmt.Println("swap:", err)
		if err != nil {
			return 1
		}
	default:
		fmt.Println("unknown child mode", mode)
		return 1
	}
	return 0
}

// testTarget is the target the tests' updaters and descriptors use.
var testTarget = wire.UpdateTarget(runtime.GOOS, runtime.GOARCH)

// builds are the stand-in agents of testdata/agent, built once per run.
type builds struct {
	old, new, crash string // paths
	err             error
}

var (
	buildOnce sync.Once
	built     builds
	buildDir  string
)

// agents builds testdata/agent three times: 1.0.0 and 2.0.0 that
// confirm, and a 2.0.0 that crashes at start.
func agents(t *testing.T) builds {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the stand-in agents are built for the Linux and macOS tests")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "update-agents-")
		if err != nil {
			built.err = err
			return
		}
		buildDir = dir
		b := func(name, version, mode string) string {
			out := filepath.Join(dir, name)
			if built.err != nil {
				return out
			}
			cmd := exec.Command("go", "build", "-o", out, "-ldflags", "-X main.version="+version+" -X main.mode="+mode, "./testdata/agent")
			if msg, err := cmd.CombinedOutput(); err != nil {
				built.err = fmt.Errorf("building the %s agent: %v\n%s", name, err, msg)
			}
			return out
		}
		built.old = b("old", "1.0.0", "ok")
		built.new = b("new", "2.0.0", "ok")
		built.crash = b("crash", "2.0.0", "crash")
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built
}

// server is the paired server over loopback: it serves one signed
// descriptor at GET /agent/component/metnos-agent/update/<target> and
// the builds of its mirror under /agent/client/, with Range.
type server struct {
	*httptest.Server
	key ed25519.PrivateKey

	mu     sync.Mutex
	desc   []byte            // the descriptor's body; nil: 404 no_binary
	files  map[string][]byte // url_path -> content
	cutReq int               // > 0: the cutReq-th file request is cut...
	cut    int               // ...after cut bytes of its body
	ranges []string          // the Range header of each file request
	// hold, when set, is where a file request waits (without the
	// server's lock) until it is closed, after telling held.
	hold, held chan struct{}
}

func newServer(t *testing.T) *server {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{key: key, files: map[string][]byte{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	hold, held := s.hold, s.held
	s.mu.Unlock()
	if hold != nil && strings.HasPrefix(r.URL.Path, wire.PathClientFiles) {
		select {
		case held <- struct{}{}:
		default:
		}
		<-hold
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case strings.HasPrefix(r.URL.Path, wire.PathComponent):
		if r.URL.Path != wire.PathComponent+wire.AgentComponent+"/update/"+testTarget || s.desc == nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":"no_binary","message":"nessun metnos-agent in the mirror"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(s.desc)
	case strings.HasPrefix(r.URL.Path, wire.PathClientFiles):
		b, ok := s.files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		s.ranges = append(s.ranges, r.Header.Get("Range"))
		var out http.ResponseWriter = w
		if s.cutReq > 0 && len(s.ranges) == s.cutReq {
			out = &cutWriter{ResponseWriter: w, left: s.cut}
		}
		http.ServeContent(out, r, "metnos-agent", time.Unix(1e9, 0), strings.NewReader(string(b)))
	default:
		http.NotFound(w, r)
	}
}

// cutWriter drops the connection once left bytes of the body are sent.
type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(b []byte) (int, error) {
	if len(b) < c.left {
		c.left -= len(b)
		return c.ResponseWriter.Write(b)
	}
	c.ResponseWriter.Write(b[:c.left])
	c.ResponseWriter.(http.Flusher).Flush()
	panic(http.ErrAbortHandler)
}

// publish signs d with the server's key (or with key, when set), serves
// it, and serves content at d.URLPath. It returns d as the device
// reads it.
func (s *server) publish(t *testing.T, d wire.ComponentDescriptor, content []byte) wire.ComponentDescriptor {
	t.Helper()
	if d.Component == "" {
		d.Component = wire.AgentComponent
	}
	if d.Target == "" {
		d.Target = testTarget
	}
	if d.SHA256 == "" {
		d.SHA256 = sum(content)
	}
	if d.URLPath == "" {
		d.URLPath = wire.PathClientFiles + d.Version + "/" + d.Target + "/metnos-agent"
	}
	m, err := wire.SignComponentDescriptor(s.key, d)
	if err != nil {
		t.Fatal(err)
	}
	s.serveDescriptor(t, m)
	s.mu.Lock()
	s.files[d.URLPath] = content
	s.mu.Unlock()
	return d
}

// serveDescriptor serves m, a signed descriptor, as the body of the
// descriptor's GET.
func (s *server) serveDescriptor(t *testing.T, m map[string]any) {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.desc = b
	s.mu.Unlock()
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	s, err := FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// device is an agent installed at dir/metnos-agent (a copy of exe) with
// its update record in a data folder of its own.
type device struct {
	Files
	state string
}

func install(t *testing.T, exe string) device {
	t.Helper()
	dir, data := t.TempDir(), t.TempDir()
	name := "metnos-agent"
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	return installAt(t, exe, filepath.Join(dir, name), filepath.Join(data, "agent-update.json"))
}

func installAt(t *testing.T, exe, path, state string) device {
	t.Helper()
	if err := os.WriteFile(path, read(t, exe), 0o755); err != nil {
		t.Fatal(err)
	}
	return device{Files: FilesFor(path), state: state}
}

// updater is the device's Updater, talking to s.
func (d device) updater(t *testing.T, s *server, probation bool) *Updater {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(s.URL, key, "dev1", nil)
	return New(Config{StatePath: d.state, Files: d.Files, Version: "1.0.0", Target: testTarget,
		ServerKey: s.key.Public().(ed25519.PublicKey), Client: c, Probation: probation})
}

func (d device) load(t *testing.T) State {
	t.Helper()
	st, err := LoadState(d.state)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// version runs exe version and returns what it printed, failing the
// test when it does not run.
func version(t *testing.T, exe string) string {
	t.Helper()
	out, err := exec.Command(exe, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", exe, err, out)
	}
	return strings.TrimSpace(string(out))
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// exitCode is the exit status of a command's error, -1 when it did not
// exit.
func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}
