package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/sandbox/egress"
	"github.com/metnos/agent/testkit/testbin"
)

// Issue 14's speed goals for the egress proxy.
const (
	goalThroughput = 0.8                  // proxied / direct download throughput, at least
	goalTTFB       = 2 * time.Millisecond // added time to first byte per request, at most
	goalStartup    = 3 * time.Millisecond // added start-up of a run with an allowlist, at most
)

// TestEgressSpeed measures what issue 14's per-run egress proxy costs,
// each figure against a baseline measured in the same run, on loopback
// (the benchmarks run in a network namespace holding only loopback):
//
//   - proxy: a Go client downloads METNOS_BENCH_EGRESS_MB (default 256)
//     MiB from a test server, directly and through an egress.Proxy
//     served on a loopback listener (allowing that server's literal
//     127.0.0.1:PORT), over http:// (forward proxy) and over https://
//     (CONNECT), and over http:// through a bare TCP relay that only
//     copies bytes (the floor of any proxy on these cores: no goal);
//     3 rounds, the variants rotating, medians; then
//     METNOS_BENCH_EGRESS_REQS (default 200) small requests each way,
//     interleaved, a new connection each as the proxy serves one
//     request per connection, and the median time to first byte;
//   - sandbox: the same end to end: python3's urllib inside sandbox.Run,
//     once with Network: true (direct) and once with an Egress allowing
//     the server's 127.0.0.1:PORT (through the run's proxy, found in
//     the proxy variables the sandbox sets), reading the body in 1 MiB
//     pieces and discarding it, then half as many small requests as
//     above (at most 500), one run each way; Python times the download and each
//     request itself, so Python's start-up is not counted;
//   - startup: sandbox.Run of /bin/true with an Egress against the
//     same without network, METNOS_BENCH_N (default 30) rounds after 3
//     warm-ups, interleaved, both in bwrap mode; median, p10, p90.
//
// It ends with a table: each figure, its baseline, the ratio or the
// added time, and issue 14's goal (throughput ≥ 0.8× direct, time to
// first byte + ≤ 2 ms, start-up + ≤ 3 ms) with "met" or "NOT met".
// Timings are information only: nothing fails on a number. It fails
// when a download is short, when a proxied one did not go through the
// proxy (its records must show the connection allowed and the bytes),
// or when a sandboxed run is not a bwrap run. The sandbox parts need
// bwrap, Landlock and seccomp (skipped without them, failed with
// METNOS_REQUIRE_SANDBOX=1) and the shim: $METNOS_E2E_BIN's when set,
// else one built for the test. About 30 s on 2 cores at 256 MiB once
// the build is cached.
//
//	go test ./test/bench -run EgressSpeed -count=1 -v
//	METNOS_BENCH_EGRESS_MB=32 go test ./test/bench -run EgressSpeed/proxy -count=1 -v
func TestEgressSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("egress benchmark skipped under -short")
	}
	mb := envInt(t, "METNOS_BENCH_EGRESS_MB", 256)
	reqs := envInt(t, "METNOS_BENCH_EGRESS_REQS", 200)
	n := envInt(t, "METNOS_BENCH_N", defaultN)
	o := newOrigin(t, int64(mb)<<20)
	var tab table
	defer func() {
		t.Logf("\negress proxy (issue 14): %d MiB downloads (medians of %d rotated rounds), %d requests (Go) and %d (python) for the time to first byte, %d start-up rounds\n%s",
			mb, egressRounds, reqs, min(reqs/2, 500), n, tab.String())
	}()

	t.Run("proxy", func(t *testing.T) { benchProxy(t, o, mb, reqs, &tab) })

	// The sandbox runs need the lean shim (this test binary is not one):
	// $METNOS_E2E_BIN's, or one built for the test.
	var shimBin string
	parent := t
	shim := func(t *testing.T) {
		t.Helper()
		requireBwrap(t)
		if shimBin == "" {
			dir, cleanup, err := testbin.Prepare()
			if err != nil {
				t.Fatal(err)
			}
			parent.Cleanup(cleanup)
			shimBin = filepath.Join(dir, "metnos-shim")
		}
		t.Setenv("METNOS_SHIM", shimBin)
	}
	t.Run("sandbox", func(t *testing.T) {
		shim(t)
		// Half as many requests (a run reports at most 1000).
		benchSandboxed(t, o, mb, min(reqs/2, 500), &tab)
	})
	t.Run("startup", func(t *testing.T) {
		shim(t)
		benchStartup(t, n, &tab)
	})
}

// egressRounds is the number of timed rounds of each download.
const egressRounds = 3

// origin is the test server the downloads come from: /big is the
// download, /small a short answer; plain and TLS on loopback.
type origin struct {
	size       int64
	plain, tls *httptest.Server
	caPEM      string // the TLS server's certificate, for Python
}

func newOrigin(t *testing.T, size int64) *origin {
	chunk := bytes.Repeat([]byte("metnos egress bench 0123456789abcdef\n"), (1<<20)/37+1)[:1<<20]
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			w.Header().Set("Content-Type", "application/octet-stream")
			for left := size; left > 0; {
				b := chunk
				if int64(len(b)) > left {
					b = b[:left]
				}
				if _, err := w.Write(b); err != nil {
					return
				}
				left -= int64(len(b))
			}
		case "/small":
			io.WriteString(w, "ok, a small answer\n")
		default:
			http.NotFound(w, r)
		}
	})
	o := &origin{size: size, plain: httptest.NewServer(h), tls: httptest.NewTLSServer(h)}
	t.Cleanup(o.plain.Close)
	t.Cleanup(o.tls.Close)
	o.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: o.tls.Certificate().Raw}))
	return o
}

// allow is an Egress that names the origin's two addresses literally,
// as a manifest hint "127.0.0.1:PORT" does.
func (o *origin) allow() policy.Egress {
	var e policy.Egress
	for _, s := range []*httptest.Server{o.plain, o.tls} {
		ap := s.Listener.Addr().(*net.TCPAddr).AddrPort()
		e.Allow = append(e.Allow, policy.Dest{Host: ap.Addr().String(), Port: ap.Port(), Why: "bench: the test server"})
	}
	return e
}

// benchProxy measures the proxy alone, with a Go client.
func benchProxy(t *testing.T, o *origin, mb, reqs int, tab *table) {
	p := egress.New(o.allow(), egress.Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(l) }()
	closed := false
	stop := func() {
		if !closed {
			closed = true
			p.Close()
			<-served
		}
	}
	defer stop()
	proxyURL := &url.URL{Scheme: "http", Host: l.Addr().String()}

	transport := func(s *httptest.Server, viaProxy bool) *http.Transport {
		tr := s.Client().Transport.(*http.Transport).Clone()
		tr.Proxy = nil
		if viaProxy {
			tr.Proxy = http.ProxyURL(proxyURL)
		}
		// The proxy serves one request per client connection: each
		// request pays for a connection, direct ones too.
		tr.DisableKeepAlives = true
		return tr
	}
	type leg struct {
		name   string
		server *httptest.Server
	}
	legs := []leg{{"http forward", o.plain}, {"https CONNECT", o.tls}}

	// Throughput.
	type dl struct {
		name     string
		tr       *http.Transport
		url      string
		viaProxy bool
	}
	var dls []dl
	for _, lg := range legs {
		dls = append(dls,
			dl{lg.name + ", direct", transport(lg.server, false), lg.server.URL + "/big", false},
			dl{lg.name + ", via proxy", transport(lg.server, true), lg.server.URL + "/big", true})
	}
	// The floor of any proxy: the same download through a relay that
	// only copies bytes, so the table tells the proxy's own cost from
	// the cost of a second hop on the same two cores.
	relay := newRelay(t, o.plain.Listener.Addr().String())
	dls = append(dls, dl{"bare TCP relay", transport(o.plain, false), "http://" + relay + "/big", false})
	times := make([][]time.Duration, len(dls))
	proxied := 0
	for round := 0; round < egressRounds; round++ {
		for k := range dls {
			i := (k + round) % len(dls)
			d, err := goDownload(dls[i].tr, dls[i].url, o.size)
			if err != nil {
				t.Fatalf("%s: %v", dls[i].name, err)
			}
			times[i] = append(times[i], d)
			if dls[i].viaProxy {
				proxied++
			}
		}
	}
	for j, lg := range legs {
		direct, via := median(times[2*j]), median(times[2*j+1])
		tab.throughput("download, Go client, "+lg.name, mb, direct, via)
	}
	tab.throughput("  (floor: http through a bare TCP relay)", mb, median(times[0]), median(times[len(dls)-1]))
	tab.rows[len(tab.rows)-1].goal = "no goal"

	// Time to first byte.
	for _, lg := range legs {
		direct, via := transport(lg.server, false), transport(lg.server, true)
		var dt, vt []time.Duration
		for i := 0; i < reqs; i++ {
			first, second := direct, via
			if i%2 == 1 {
				first, second = via, direct
			}
			a, err := goTTFB(first, lg.server.URL+"/small")
			if err != nil {
				t.Fatalf("%s: %v", lg.name, err)
			}
			b, err := goTTFB(second, lg.server.URL+"/small")
			if err != nil {
				t.Fatalf("%s: %v", lg.name, err)
			}
			if first == via {
				a, b = b, a
			}
			dt, vt = append(dt, a), append(vt, b)
		}
		tab.ttfb("time to first byte, Go client, "+lg.name, median(dt), median(vt))
	}

	// Every proxied request went through the proxy, each download whole.
	// A connection is recorded when it ends: Close waits for them all.
	stop()
	if n, first := p.Refused(); n != 0 {
		t.Fatalf("the proxy refused %d connections (first %s)", n, first)
	}
	recs := p.Records()
	big := 0
	for _, r := range recs {
		if r.Verdict == "allowed" && r.Down >= o.size {
			big++
		}
	}
	if want, got := proxied+len(legs)*reqs, len(recs)+p.Overflow(); big != proxied || got != want {
		t.Fatalf("%d downloads and %d small requests through the proxy, but it saw %d connections, %d of them allowed and carrying %d bytes or more:\n%+v",
			proxied, len(legs)*reqs, got, big, o.size, recs)
	}
}

// newRelay listens on loopback and relays each connection to target,
// copying bytes both ways and nothing else; it returns its address.
func newRelay(t *testing.T, target string) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, up)
			}()
		}
	}()
	return l.Addr().String()
}

// goDownload gets url with tr and reads the body in 256 KiB pieces.
func goDownload(tr *http.Transport, url string, size int64) (time.Duration, error) {
	defer tr.CloseIdleConnections()
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s (%s)", url, resp.Status, resp.Header.Get("X-Proxy-Error"))
	}
	buf := make([]byte, 256<<10)
	var n int64
	for {
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("GET %s: after %d bytes: %w", url, n, err)
		}
	}
	d := time.Since(start)
	if n != size {
		return 0, fmt.Errorf("GET %s: %d bytes, want %d", url, n, size)
	}
	return d, nil
}

// goTTFB gets url with tr and returns the time from the request to the
// response's first byte.
func goTTFB(tr *http.Transport, url string) (time.Duration, error) {
	var first time.Time
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s %v", url, resp.Status, err)
	}
	return first.Sub(start), nil
}

// pyClient is what runs in the sandbox: it reads its job on stdin and
// prints its own timings, so that Python's start-up is not counted.
const pyClient = `
import json, ssl, sys, time, urllib.request
a = json.load(sys.stdin)
ctx = ssl.create_default_context(cadata=a["ca"])
op = urllib.request.build_opener(urllib.request.ProxyHandler(), urllib.request.HTTPSHandler(context=ctx))
out = {}
if a["op"] == "download":
    t0, n = time.perf_counter(), 0
    with op.open(a["url"], timeout=60) as r:
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            n += len(b)
    out = {"bytes": n, "secs": time.perf_counter() - t0}
else:
    ttfb = []
    for _ in range(a["k"]):
        t0 = time.perf_counter()
        with op.open(a["url"], timeout=60) as r:
            r.read(1)
            ttfb.append(time.perf_counter() - t0)
            r.read()
    out = {"ttfb": ttfb}
print(json.dumps(out))
`

// pyResult is what pyClient prints.
type pyResult struct {
	Bytes int64     `json:"bytes"`
	Secs  float64   `json:"secs"`
	TTFB  []float64 `json:"ttfb"`
}

// benchSandboxed measures the same end to end: Python in sandbox.Run,
// with the whole network (direct) or an allowlist (through the run's
// proxy).
func benchSandboxed(t *testing.T, o *origin, mb, reqs int, tab *table) {
	if _, err := os.Stat(python); err != nil {
		t.Skipf("the end-to-end part runs %s: %v", python, err)
	}
	allow := o.allow()
	direct, viaProxy := defaultPolicy(t), defaultPolicy(t)
	direct.Network = true
	viaProxy.Network, viaProxy.Egress = false, &allow
	run := func(pol policy.Policy, job map[string]any) pyResult {
		t.Helper()
		job["ca"] = o.caPEM
		in, _ := json.Marshal(job)
		out, err := sandbox.Run(context.Background(), sandbox.Request{
			Argv:    []string{python, "-c", pyClient},
			Stdin:   bytes.NewReader(in),
			Env:     []string{"PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"},
			Policy:  pol,
			Limits:  sandbox.Limits{Timeout: 2 * time.Minute},
			Options: testbin.SandboxOptions(),
		})
		what := fmt.Sprintf("%s of %s (network %v, egress %v)", job["op"], job["url"], pol.Network, pol.Egress != nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if out.ExitCode != 0 || out.Signal != "" {
			t.Fatalf("%s: exit %d %s (sandbox %q, reason %s)\n%s", what, out.ExitCode, out.Signal, out.Sandbox, out.Reason, out.Stderr)
		}
		if out.Sandbox != fullWord {
			t.Fatalf("%s: sandbox %q, want %q (reason %s): the comparison is between bwrap runs", what, out.Sandbox, fullWord, out.Reason)
		}
		var r pyResult
		if err := json.Unmarshal(out.Stdout, &r); err != nil {
			t.Fatalf("%s: the client printed %q: %v\n%s", what, out.Stdout, err, out.Stderr)
		}
		// A proxied run's connections went through its proxy, whole.
		if pol.Egress != nil {
			nr := out.Network
			if nr == nil {
				t.Fatalf("%s: no network report: the run had no proxy", what)
			}
			if nr.Refused != 0 {
				t.Fatalf("%s: the proxy refused %d connections (first %s)", what, nr.Refused, nr.FirstRefused)
			}
			want, least := 1, o.size
			if job["op"] == "ttfb" {
				want, least = reqs, 1
			}
			got := 0
			for _, c := range nr.Conns {
				if c.Verdict == "allowed" && c.Down >= least {
					got++
				}
			}
			if got != want || len(nr.Conns) != want {
				t.Fatalf("%s: want %d allowed connections carrying %d bytes or more in the proxy's records, got %d of %d: %+v", what, want, least, got, len(nr.Conns), nr.Conns)
			}
		}
		return r
	}
	secs := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

	legs := []struct {
		name string
		url  string
	}{{"http forward", o.plain.URL}, {"https CONNECT", o.tls.URL}}
	type variant struct {
		name string
		pol  policy.Policy
		url  string
	}
	var vs []variant
	for _, lg := range legs {
		vs = append(vs, variant{lg.name + ", direct", direct, lg.url}, variant{lg.name + ", via proxy", viaProxy, lg.url})
	}
	times := make([][]time.Duration, len(vs))
	for round := 0; round < egressRounds; round++ {
		for k := range vs {
			i := (k + round) % len(vs)
			r := run(vs[i].pol, map[string]any{"op": "download", "url": vs[i].url + "/big"})
			if r.Bytes != o.size {
				t.Fatalf("%s: %d bytes, want %d", vs[i].name, r.Bytes, o.size)
			}
			times[i] = append(times[i], secs(r.Secs))
		}
	}
	for j, lg := range legs {
		tab.throughput("download, python in sandbox, "+lg.name, mb, median(times[2*j]), median(times[2*j+1]))
	}

	for j, lg := range legs {
		// One run each, the order alternating between the legs.
		job := func() map[string]any { return map[string]any{"op": "ttfb", "url": lg.url + "/small", "k": reqs} }
		var d, v pyResult
		if j%2 == 0 {
			d, v = run(direct, job()), run(viaProxy, job())
		} else {
			v, d = run(viaProxy, job()), run(direct, job())
		}
		if len(d.TTFB) != reqs || len(v.TTFB) != reqs {
			t.Fatalf("%s: %d and %d timings, want %d", lg.name, len(d.TTFB), len(v.TTFB), reqs)
		}
		var dt, vt []time.Duration
		for i := range d.TTFB {
			dt, vt = append(dt, secs(d.TTFB[i])), append(vt, secs(v.TTFB[i]))
		}
		tab.ttfb("time to first byte, python in sandbox, "+lg.name, median(dt), median(vt))
	}
}

// benchStartup times sandbox.Run of /bin/true with an allowlist
// against the same with no network.
func benchStartup(t *testing.T, n int, tab *table) {
	// A destination nothing is asked of: the run only sets its proxy up.
	allow := policy.Egress{Allow: []policy.Dest{{Host: "127.0.0.1", Port: 9, Why: "bench"}}}
	none, with := defaultPolicy(t), defaultPolicy(t)
	none.Network, with.Network, with.Egress = false, false, &allow
	variants := []struct {
		name string
		pol  policy.Policy
	}{{"no network", none}, {"allowlist", with}}
	times := make([][]time.Duration, len(variants))
	for round := 0; round < warmups+n; round++ {
		for k := range variants {
			i := (round + k) % len(variants)
			v := variants[i]
			start := time.Now()
			out, err := sandbox.Run(context.Background(), sandbox.Request{Argv: []string{"/bin/true"}, Policy: v.pol, Options: testbin.SandboxOptions()})
			d := time.Since(start)
			if err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			if out.ExitCode != 0 || out.Signal != "" {
				t.Fatalf("%s: exit %d %s: %s", v.name, out.ExitCode, out.Signal, out.Stderr)
			}
			if out.Sandbox != fullWord {
				t.Fatalf("%s: sandbox %q, want %q (reason %s): the comparison is between bwrap runs", v.name, out.Sandbox, fullWord, out.Reason)
			}
			if (out.Network != nil) != (v.pol.Egress != nil) {
				t.Fatalf("%s: network report %+v: a run has a proxy exactly when it has an allowlist", v.name, out.Network)
			}
			if round >= warmups {
				times[i] = append(times[i], d)
			}
		}
	}
	for i := range times {
		sort.Slice(times[i], func(a, b int) bool { return times[i][a] < times[i][b] })
	}
	base, allowed := pct(times[0], 50), pct(times[1], 50)
	tab.add(row{
		what:  "start-up of sandbox.Run /bin/true (bwrap)",
		base:  fmt.Sprintf("no network %s (p10 %s, p90 %s)", ms(base), ms(pct(times[0], 10)), ms(pct(times[0], 90))),
		with:  fmt.Sprintf("%s (p10 %s, p90 %s)", ms(allowed), ms(pct(times[1], 10)), ms(pct(times[1], 90))),
		got:   added(allowed - base),
		goal:  "≤ +" + ms(goalStartup),
		met:   allowed-base <= goalStartup,
		extra: fmt.Sprintf("%.2f×", ratio(allowed, base)),
	})
}

// requireBwrap skips the test (or fails it, with
// METNOS_REQUIRE_SANDBOX=1) when a run with an allowlist cannot be made
// here: it needs bwrap, Landlock and seccomp.
func requireBwrap(t *testing.T) {
	t.Helper()
	// As an unprivileged user, TestMain runs the benchmarks in a user
	// namespace of their own, mapping only this user (to 0): there the
	// system folders belong to nobody, so no bwrap is trusted, and the
	// placeholder locks go to root's folder. Whatever the machine has.
	if m, err := os.ReadFile("/proc/self/uid_map"); err == nil && len(strings.Fields(string(m))) == 3 && strings.Fields(string(m))[1] != "0" {
		t.Skipf("the benchmarks run in a user namespace mapping only uid %s (TestMain, as an unprivileged user): sandbox runs need the host's own view; run as root", strings.Fields(string(m))[1])
	}
	c := sandbox.Probe(testbin.SandboxOptions())
	var missing []string
	if !c.BwrapUsable {
		missing = append(missing, "bwrap: "+c.BwrapError)
	}
	if c.LandlockABI == 0 {
		missing = append(missing, "landlock: none in this kernel")
	}
	if !c.Seccomp {
		missing = append(missing, "seccomp: no filters")
	}
	if c.Disabled != "" {
		missing = append(missing, c.Disabled)
	}
	if len(missing) == 0 {
		return
	}
	msg := "a run with an allowlist needs every sandbox layer; missing: " + strings.Join(missing, "; ")
	if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
		t.Fatal(msg + " (METNOS_REQUIRE_SANDBOX=1)")
	}
	t.Skip(msg)
}

// envInt is the positive integer in the environment variable key, or
// def when it is unset.
func envInt(t *testing.T, key string, def int) int {
	t.Helper()
	s := os.Getenv(key)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		t.Fatalf("%s=%q: want a positive integer", key, s)
	}
	return v
}

// python is the interpreter the end-to-end part runs.
const python = "/usr/bin/python3"

// row is one line of the summary table.
type row struct {
	what, base, with, got, goal, extra string
	met                                bool
}

// table is the summary TestEgressSpeed prints.
type table struct{ rows []row }

func (tb *table) add(r row) { tb.rows = append(tb.rows, r) }

// throughput adds a download: the ratio of the throughputs, which is
// direct time / proxied time.
func (tb *table) throughput(what string, mb int, direct, via time.Duration) {
	r := ratio(direct, via)
	tb.add(row{
		what: what,
		base: fmt.Sprintf("direct %s, %.0f MiB/s", direct.Round(time.Millisecond), float64(mb)/direct.Seconds()),
		with: fmt.Sprintf("%s, %.0f MiB/s", via.Round(time.Millisecond), float64(mb)/via.Seconds()),
		got:  fmt.Sprintf("%.2f×", r),
		goal: fmt.Sprintf("≥ %.1f×", goalThroughput),
		met:  r >= goalThroughput,
	})
}

// ttfb adds the medians of the time to first byte.
func (tb *table) ttfb(what string, direct, via time.Duration) {
	tb.add(row{
		what:  what,
		base:  "direct " + ms(direct),
		with:  ms(via),
		got:   added(via - direct),
		goal:  "≤ +" + ms(goalTTFB),
		met:   via-direct <= goalTTFB,
		extra: fmt.Sprintf("%.2f×", ratio(via, direct)),
	})
}

// added is d with its sign, in milliseconds.
func added(d time.Duration) string {
	if d < 0 {
		return "-" + ms(-d)
	}
	return "+" + ms(d)
}

func (tb *table) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-52s %-50s %-40s %-17s %-10s %s\n", "measure", "baseline", "through the proxy", "result", "goal", "")
	for _, r := range tb.rows {
		met := "met"
		switch {
		case r.goal == "no goal":
			met = ""
		case !r.met:
			met = "NOT met"
		}
		got := r.got
		if r.extra != "" {
			got += " (" + r.extra + ")"
		}
		fmt.Fprintf(&b, "%-52s %-50s %-40s %-17s %-10s %s\n", r.what, r.base, r.with, got, r.goal, met)
	}
	if len(tb.rows) == 0 {
		b.WriteString("(nothing measured)\n")
	}
	return b.String()
}
