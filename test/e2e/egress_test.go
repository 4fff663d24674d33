//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/metnos/agent/refserver"
)

// TestEgressRun: an executor whose manifest's network:http hint names
// 127.0.0.1, run by the agent against the reference server, reaches a
// server on 127.0.0.1 through the agent's proxy, is refused the same
// server by the name localhost (not named) and cannot reach it past the
// proxy; the result's reason says what was refused and which hint named
// nothing, and the run's audit line lists both connections.
func TestEgressRun(t *testing.T) {
	needFull(t, "a run narrowed to named hosts needs a network namespace of its own (bubblewrap)")
	var hits atomic.Int64
	token := fmt.Sprintf("egress-%d", os.Getpid())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, token)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	// Outside the sandbox, both names reach it.
	for _, u := range []string{srv.URL, "http://localhost:" + port + "/"} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatalf("the test server is not reachable from the host as %s: %v", u, err)
		}
		resp.Body.Close()
	}
	outside := hits.Swap(0)

	w := newWorld(t)
	w.pair()
	w.start()
	allowed, named := srv.URL+"/a", "http://localhost:"+port+"/b"
	info := w.wait(w.enqueue("fetch_url", map[string]any{"urls": []string{allowed, named}, "direct": true}, refserver.EnqueueOptions{}))
	r := result(t, info)
	if r["ok"] != true || r["sandbox"] != fullSandbox {
		t.Fatalf("fetch_url: %s", info.ResultBody)
	}
	es := capsEntries(t, r)
	if len(es) != 2 {
		t.Fatalf("fetch_url gave %d entries: %s", len(es), info.ResultBody)
	}
	if es[0]["status"] != float64(200) || es[0]["body"] != token {
		t.Errorf("the URL the hint names (%s) was not fetched through the proxy: %v", allowed, es[0])
	}
	if es[1]["status"] != float64(403) || !strings.Contains(fmt.Sprint(es[1]["error"]), "localhost") {
		t.Errorf("the name the hint does not name (%s) was not refused with a 403 naming it: %v", named, es[1])
	}
	for _, e := range es {
		if d := fmt.Sprint(e["direct"]); !strings.HasPrefix(d, "error:") {
			t.Errorf("a socket of the executor's own reached %s past the proxy: %v", e["url"], d)
		}
	}
	if n := hits.Load(); n != 1 || outside != 2 {
		t.Errorf("the test server saw %d requests from the run, want 1 (and %d from outside, want 2)", n, outside)
	}
	reason, _ := r["sandbox_downgrade_reason"].(string)
	for _, want := range []string{"1 connection(s) refused, the first to localhost:" + port + ": is not named by the executor's manifest network hints", `"Some Web API over HTTPS"`} {
		if !strings.Contains(reason, want) {
			t.Errorf("sandbox_downgrade_reason %q lacks %q", reason, want)
		}
	}

	files, _ := filepath.Glob(filepath.Join(w.dataDir(), "audit", "*.jsonl"))
	if len(files) != 1 {
		t.Fatalf("audit files: %v", files)
	}
	raw, _ := os.ReadFile(files[0])
	var line struct {
		InvocationID string `json:"invocation_id"`
		Network      *struct {
			Refused int `json:"refused"`
			Conns   []struct {
				Host    string `json:"host"`
				Port    int    `json:"port"`
				Addr    string `json:"addr"`
				Down    int64  `json:"down"`
				Verdict string `json:"verdict"`
			} `json:"conns"`
		} `json:"network"`
	}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if json.Unmarshal([]byte(l), &line) == nil && line.InvocationID == info.ID {
			break
		}
		line.Network = nil
	}
	if line.Network == nil {
		t.Fatalf("the run's audit line has no network record:\n%s", raw)
	}
	got := map[string]string{}
	for _, c := range line.Network.Conns {
		got[fmt.Sprintf("%s:%d", c.Host, c.Port)] = c.Verdict
		if c.Verdict == "allowed" && (c.Addr != "127.0.0.1" || c.Down <= int64(len(token))) {
			t.Errorf("the allowed connection's record: %+v", c)
		}
	}
	if got["127.0.0.1:"+port] != "allowed" || got["localhost:"+port] != "refused" || line.Network.Refused != 1 {
		t.Errorf("the audit line's connections: %+v (refused %d)", line.Network.Conns, line.Network.Refused)
	}
}
