package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/undo"
	"github.com/metnos/agent/wire"
)

// TestStopNowAfterTheRunEndedKeepsItsResult: a stop-now (the second
// Ctrl-C) that lands after the executor ended by itself does not throw
// its result away: the result is spooled, for the next start to
// deliver, and the run is not reported as cut short. The window is
// held open by the self-heal: the executor ends missing a shim module,
// and the agent is fetching the shim again (the server stalls it) when
// the stop-now comes.
func TestStopNowAfterTheRunEndedKeepsItsResult(t *testing.T) {
	halt := make(chan struct{})
	a := newDeviceAgent(t, examples.Executors, "stopper", func(_ *deviceAgent, c *Config) { c.Halt = halt })
	srv, reg, lay, logs := a.srv, a.reg, a.lay, a.logs
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stop, ran := a.start(t, ctx)
	defer stop()

	// A first run installs the shim.
	first, err := srv.Enqueue(reg.DeviceID, "echo_args", map[string]any{"i": 1}, refserver.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := srv.Wait(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(info.ResultBody), `"ok":true`) {
		if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
			t.Fatalf("echo_args does not run on this machine (METNOS_REQUIRE_SANDBOX=1 makes this a failure): %s", info.ResultBody)
		}
		t.Skipf("echo_args does not run on this machine: %s", info.ResultBody)
	}

	// The next run misses a shim module, and the fetch that would heal
	// it stalls.
	if err := os.Remove(filepath.Join(lay.Shim(), "executor_helpers.py")); err != nil {
		t.Fatal(err)
	}
	srv.SetShimDelay(time.Hour)
	id, err := srv.Enqueue(reg.DeviceID, "echo_args", map[string]any{"i": 2}, refserver.EnqueueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(logs.String(), "misses a shim module") {
		select {
		case err := <-ran:
			t.Fatalf("the agent stopped (%v) before the self-heal: %s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(halt) // the executor has ended: stop now
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not stop now")
	}

	if strings.Contains(logs.String(), "the run was cut short") {
		t.Error("the log says a run that ended by itself was cut short")
	}
	pending, err := a.spool.Pending()
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	for _, p := range pending {
		if p.ID == id {
			body = p.Body
		}
	}
	if body == nil {
		t.Fatalf("the finished result was dropped: spool holds %d results, none for %s; log:\n%s", len(pending), id, logs.String())
	}
	var r struct {
		ErrorClass string `json:"error_class"`
		Error      string `json:"error"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	// What the executor itself said: it missed the module.
	if r.ErrorClass != "device_error" || !strings.Contains(r.Error, "No module named 'executor_helpers'") {
		t.Errorf("spooled result: %s", body)
	}
}

// nappers are two executors that sleep the seconds they are given:
// nap_write declares fs:write, and first appends a line to ran.log in
// the folder it is given; nap declares nothing and writes nothing.
var nappers = fstest.MapFS{
	"nap_write/manifest.toml": {Data: []byte(`name = "nap_write"
description = "Test executor: notes that it ran in the folder it is given, then sleeps."

[code]
files = ["nap_write.py"]
digest = "sha256:0"

[[capabilities]]
name = "fs:write"
hint = []

[placement]
min_sandbox = "job-object"
`)},
	"nap_write/nap_write.py": {Data: []byte(`import json, os, sys, time

args = json.loads(sys.stdin.read() or "{}")
with open(os.path.join(args["folder"], "ran.log"), "a") as f:
    f.write("ran\n")
time.sleep(float(args.get("seconds", 1)))
print(json.dumps({"ok": True}))
`)},
	"nap/manifest.toml": {Data: []byte(`name = "nap"
description = "Test executor: sleeps."

[code]
files = ["nap.py"]
digest = "sha256:0"

[placement]
min_sandbox = "job-object"
`)},
	"nap/nap.py": {Data: []byte(`import json, sys, time

args = json.loads(sys.stdin.read() or "{}")
time.sleep(float(args.get("seconds", 1)))
print(json.dumps({"ok": True}))
`)},
}

// TestStopBudgetCutsRun: with a stop budget, a run still going at half
// of it after the stop request is cut short, and its result (made by
// the agent: ok false, nothing processed, an error that says why, the
// class and payload of an executor that writes or of one that does
// not) is spooled, recorded (ledger, STARTED marker, journal, audit
// line) and delivered, once, before Run returns, within the budget. A
// restart neither runs it again nor reports it unknown.
func TestStopBudgetCutsRun(t *testing.T) {
	// Half of it for the run, and the other half less StopMargin to
	// deliver its result.
	const budget = 6 * time.Second
	for _, tc := range []struct {
		executor  string
		class     string
		payload   string
		journaled bool
	}{
		{executor: "nap_write", class: wire.ClassExecutionOutcomeUnknown, payload: `{"effect_status":"unknown","recovery":"cut_at_stop"}`, journaled: true},
		{executor: "nap", class: wire.ClassInterrupted, payload: `{}`},
	} {
		t.Run(tc.executor, func(t *testing.T) {
			a := newDeviceAgent(t, nappers, "budget-"+tc.executor, func(_ *deviceAgent, c *Config) { c.StopBudget = budget })
			srv, reg, lay, dir, logs := a.srv, a.reg, a.lay, a.dir, a.logs
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			stop, ran := a.start(t, ctx)
			defer stop()

			work := filepath.Join(dir, "work")
			if err := os.MkdirAll(work, 0o700); err != nil {
				t.Fatal(err)
			}
			id, err := srv.Enqueue(reg.DeviceID, tc.executor, map[string]any{"folder": work, "seconds": 120}, refserver.EnqueueOptions{DeadlineMS: 180000})
			if err != nil {
				t.Fatal(err)
			}
			// The run has started once its STARTED marker is there.
			for {
				if ms, _ := filepath.Glob(filepath.Join(lay.SpoolStarted(), "*.json")); len(ms) > 0 {
					break
				}
				if info, _ := srv.Invocation(id); info.ResultBody != nil {
					skipUnlessRequired(t, info.ResultBody)
				}
				select {
				case err := <-ran:
					t.Fatalf("the agent stopped (%v) before the run started: %s", err, logs.String())
				case <-ctx.Done():
					t.Fatalf("the run did not start: %s", logs.String())
				case <-time.After(20 * time.Millisecond):
				}
			}
			time.Sleep(300 * time.Millisecond) // into the executor's sleep
			if info, _ := srv.Invocation(id); info.ResultBody != nil {
				skipUnlessRequired(t, info.ResultBody) // it ended at once: it did not run
			}
			stopped := time.Now()
			stop()
			select {
			case err := <-ran:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(time.Minute):
				t.Fatalf("Run did not return after the stop request: %s", logs.String())
			}
			took := time.Since(stopped)
			t.Logf("Run returned %s after the stop request (budget %s)", took.Round(10*time.Millisecond), budget)
			if took < budget/2 {
				t.Errorf("Run returned %s after the stop request, before half the budget: the run was not given its time", took)
			}
			if took >= budget {
				t.Errorf("Run returned %s after the stop request, not within the budget of %s", took, budget)
			}

			info, _ := srv.Invocation(id)
			if info.ResultBody == nil {
				t.Fatalf("the cut run's result was not delivered (state %s); log:\n%s", info.State, logs.String())
			}
			if info.ResultPosts != 1 {
				t.Errorf("the result was posted %d times, want once", info.ResultPosts)
			}
			var r struct {
				OK         *bool           `json:"ok"`
				Entries    json.RawMessage `json:"entries"`
				NProcessed *int64          `json:"n_processed"`
				ElapsedMS  int64           `json:"elapsed_ms"`
				Sandbox    string          `json:"sandbox"`
				Payload    json.RawMessage `json:"payload"`
				Error      string          `json:"error"`
				ErrorClass string          `json:"error_class"`
			}
			if err := json.Unmarshal(info.ResultBody, &r); err != nil {
				t.Fatal(err)
			}
			switch {
			case r.OK == nil || *r.OK, string(r.Entries) != "[]", r.NProcessed == nil || *r.NProcessed != 0:
				t.Errorf("want ok false, no entries, n_processed 0: %s", info.ResultBody)
			case r.ErrorClass != tc.class, string(r.Payload) != tc.payload:
				t.Errorf("want error_class %s and payload %s: %s", tc.class, tc.payload, info.ResultBody)
			case !strings.Contains(r.Error, "cut short after") || !strings.Contains(r.Error, "asked to stop"):
				t.Errorf("the error does not say the run was cut because the agent was asked to stop: %s", info.ResultBody)
			case r.Sandbox == "" || r.Sandbox == "unknown_after_restart":
				t.Errorf("want the run's sandbox word: %s", info.ResultBody)
			case r.ElapsedMS < (budget / 2).Milliseconds():
				t.Errorf("elapsed_ms %d, want the run's time, at least half the budget: %s", r.ElapsedMS, info.ResultBody)
			}
			if tc.journaled && !strings.Contains(r.Error, "may be partial") {
				t.Errorf("the error of a writer does not say its changes may be partial: %s", r.Error)
			}
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "was cut short") || !strings.Contains(logs.String(), "invocation="+id) {
				t.Errorf("the log does not say, at warn and with the invocation, that the run was cut: %s", logs.String())
			}
			if ms, _ := filepath.Glob(filepath.Join(lay.SpoolStarted(), "*.json")); len(ms) > 0 {
				t.Errorf("STARTED markers left: %v", ms)
			}
			if rs, _ := filepath.Glob(filepath.Join(lay.SpoolResults(), "*.json")); len(rs) > 0 {
				t.Errorf("delivered results left in the spool: %v", rs)
			}
			checkAuditClass(t, lay, id, tc.class)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}

			// The history journal completed the entry, as for a run its
			// deadline killed.
			j, err := undo.Load(lay.Journal())
			if err != nil {
				t.Fatal(err)
			}
			e, ok := j.Entry(id)
			switch {
			case tc.journaled && (!ok || !e.Finished || e.Interrupted || e.OK || e.ErrorClass != tc.class):
				t.Errorf("the journal entry of the cut run: found %v, %s, error class %q", ok, e.State(), e.ErrorClass)
			case !tc.journaled && ok:
				t.Errorf("a run of an executor that writes nothing is in the journal: %s", e.State())
			}

			// A restart: the run is settled, neither run again nor
			// reported unknown.
			var again syncBuffer
			cfg := a.cfg
			cfg.Logger = slog.New(slog.NewTextHandler(&again, nil))
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if !b.spool.Executed(id) {
				t.Error("after a restart, the ledger does not hold the cut run: it could run again")
			}
			if strings.Contains(again.String(), "was running when the agent stopped") {
				t.Errorf("after a restart, the cut run is reported unknown: %s", again.String())
			}
			if tc.journaled {
				if n := strings.Count(readFile(t, filepath.Join(work, "ran.log")), "ran"); n != 1 {
					t.Errorf("the executor ran %d times, want once", n)
				}
			}
		})
	}
}

// skipUnlessRequired skips a test whose executor did not run on this
// machine (body is its result), unless METNOS_REQUIRE_SANDBOX=1.
func skipUnlessRequired(t *testing.T, body []byte) {
	t.Helper()
	if os.Getenv("METNOS_REQUIRE_SANDBOX") == "1" {
		t.Fatalf("the executor does not run on this machine (METNOS_REQUIRE_SANDBOX=1 makes this a failure): %s", body)
	}
	t.Skipf("the executor does not run on this machine: %s", body)
}

// checkAuditClass checks that the audit log has one line for id, with
// ok false and error class class.
func checkAuditClass(t *testing.T, lay layout.Layout, id, class string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(lay.Audit(), "*.jsonl"))
	n := 0
	for _, f := range files {
		for l := range strings.SplitSeq(readFile(t, f), "\n") {
			var al struct {
				InvocationID string `json:"invocation_id"`
				OK           *bool  `json:"ok"`
				ErrorClass   string `json:"error_class"`
			}
			if json.Unmarshal([]byte(l), &al) != nil || al.InvocationID != id {
				continue
			}
			n++
			if al.OK == nil || *al.OK || al.ErrorClass != class {
				t.Errorf("the audit line says ok=%v error_class=%q, want ok=false error_class=%s", deref(al.OK), al.ErrorClass, class)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d audit lines for %s, want one", n, id)
	}
}

// readFile returns the contents of p, "" when it does not exist.
func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// TestDeliveryEnd: results are delivered until StopDelivery after the
// stop request or the last run's end, whichever is later, and, with a
// stop budget, no later than StopMargin before its end.
func TestDeliveryEnd(t *testing.T) {
	stop := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		budget time.Duration
		ran    time.Duration // after the stop request
		want   time.Duration // after the stop request
	}{
		{name: "no budget", want: 10 * time.Second},
		{name: "no budget, a run ended late", ran: 30 * time.Second, want: 40 * time.Second},
		{name: "a budget longer than needs be", budget: 60 * time.Second, want: 10 * time.Second},
		{name: "a budget longer than needs be, a run ended late", budget: 60 * time.Second, ran: 30 * time.Second, want: 40 * time.Second},
		{name: "the unit's budget", budget: 20 * time.Second, want: 10 * time.Second},
		{name: "the unit's budget, a run cut at half of it", budget: 20 * time.Second, ran: 10 * time.Second, want: 18 * time.Second},
		{name: "a short budget", budget: 6 * time.Second, ran: 3 * time.Second, want: 4 * time.Second},
		{name: "a budget shorter than the margin", budget: time.Second, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{cfg: Config{StopDelivery: 10 * time.Second, StopBudget: tc.budget}}
			if got := a.deliveryEnd(stop, stop.Add(tc.ran)).Sub(stop); got != tc.want {
				t.Errorf("delivery ends %s after the stop request, want %s", got, tc.want)
			}
		})
	}
}
