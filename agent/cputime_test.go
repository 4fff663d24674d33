package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/wire"
)

// busyLoop is an executor that never stops computing.
var busyLoop = fstest.MapFS{
	"busy_loop/manifest.toml": {Data: []byte(`name = "busy_loop"
description = "Test executor: computes until it is stopped."

[code]
files = ["busy_loop.py"]
digest = "sha256:0"

[placement]
min_sandbox = "job-object"
`)},
	"busy_loop/busy_loop.py": {Data: []byte("while True:\n    pass\n")},
}

// TestCPUTimeLimitResult: an executor its CPU-time limit (the owner's
// cpu_time_s) ends long before its deadline gets a result like a
// timeout's, whose error says it was the CPU-time limit.
func TestCPUTimeLimitResult(t *testing.T) {
	// The owner's cpu_time_s: the agent puts the owner's [priority] in
	// every run's sandbox options.
	a := newDeviceAgent(t, busyLoop, "cpu-time", func(_ *deviceAgent, c *Config) {
		c.Limits = config.Limits{Priority: config.Priority{CPUTimeS: 1}}
	})
	srv, reg := a.srv, a.reg
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop, ran := a.start(t, ctx)
	id, err := srv.Enqueue(reg.DeviceID, "busy_loop", map[string]any{}, refserver.EnqueueOptions{DeadlineMS: 120_000})
	if err != nil {
		t.Fatal(err)
	}
	info, err := srv.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the agent: %v", err)
	}
	var r struct {
		OK         bool   `json:"ok"`
		Error      string `json:"error"`
		ErrorClass string `json:"error_class"`
		ElapsedMS  int64  `json:"elapsed_ms"`
	}
	if err := json.Unmarshal(info.ResultBody, &r); err != nil {
		t.Fatalf("%v: %s", err, info.ResultBody)
	}
	t.Logf("result: %s", info.ResultBody)
	if r.ErrorClass == wire.ClassDeviceError && strings.Contains(r.Error, "not run on this device") {
		t.Skipf("busy_loop did not run on this machine: %s", r.Error)
	}
	if r.OK || r.ErrorClass != wire.ClassTimeout || !strings.Contains(r.Error, "CPU time limit exceeded: executor busy_loop used the 1 s") {
		t.Fatalf("result %+v, want a timeout that names the CPU-time limit", r)
	}
}
