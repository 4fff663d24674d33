package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/audit"
	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/refserver"
	"github.com/metnos/agent/sandbox"
	"github.com/metnos/agent/wire"
)

// limitsAgent is an agent of a paired device whose owner's limits file
// says file (none when ""), read as `run` reads it, and which reads it
// again as `run` does.
func limitsAgent(t *testing.T, file string) *deviceAgent {
	t.Helper()
	d := newDeviceAgent(t, examples.Executors, "limits", func(d *deviceAgent, c *Config) {
		path := d.lay.Limits()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if file != "" {
			if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		c.ReloadLimits = func() (config.Limits, policy.Host, error) {
			lim, err := config.LoadLimits(path, d.dir, config.Config{})
			return lim, policy.Host{Home: d.dir, UID: os.Getuid(), AgentDataDirs: d.lay.AgentDirs(), Never: lim.Never}, err
		}
		var err error
		if c.Limits, c.Host, err = c.ReloadLimits(); err != nil {
			t.Fatal(err)
		}
	})
	return d
}

// TestOwnerRefusesBeforeRun: what the owner's limits refuse is refused
// before it runs, with a device_error result (sandbox none) whose error
// says the rule and the file, a warning in the log, and an audit line
// that says who refused it; no STARTED marker is written and the
// executor never ran. What they allow is not refused by them.
func TestOwnerRefusesBeforeRun(t *testing.T) {
	for _, tt := range []struct {
		name, file, executor string
		args                 func(dir string) map[string]any
		rule                 string // "": not refused by the owner
	}{
		{name: "readonly refuses a writer", file: `mode = "readonly"`, executor: "write_files",
			rule: `mode = "readonly" refuses executors that write`},
		{name: "readonly lets a reader be", file: `mode = "readonly"`, executor: "echo_args"},
		{name: "preview lets a writer run dry", file: `mode = "preview"`, executor: "write_files"},
		{name: "supervised lets a writer be", file: `mode = "supervised"`, executor: "write_files"},
		{name: "deny", file: "[executors]\ndeny = [\"write_files\"]", executor: "write_files",
			rule: `[executors] deny lists "write_files"`},
		{name: "deny wins over allow", file: "[executors]\nallow = [\"write_files\"]\ndeny = [\"write_files\"]", executor: "write_files",
			rule: `[executors] deny lists "write_files"`},
		{name: "allow others", file: "[executors]\nallow = [\"echo_args\"]", executor: "write_files",
			rule: `[executors] allow does not list "write_files"`},
		{name: "allow it", file: "[executors]\nallow = [\"echo_args\"]", executor: "echo_args"},
		{name: "never", file: `never = ["~/Private"]`, executor: "echo_args",
			args: func(dir string) map[string]any { return map[string]any{"p": filepath.Join(dir, "Private", "x.txt")} },
			rule: `never lists "~/Private", which holds`},
		{name: "never by ~", file: `never = ["~/Private"]`, executor: "echo_args",
			args: func(string) map[string]any { return map[string]any{"p": "~/Private"} }, rule: `never lists "~/Private"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := limitsAgent(t, tt.file)
			srv, reg, lay, dir, logs := a.srv, a.reg, a.lay, a.dir, a.logs
			out := filepath.Join(dir, "out.txt")
			args := map[string]any{"files": []any{map[string]any{"path": out, "content": "made\n"}}}
			if tt.args != nil {
				args = tt.args(dir)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- a.Run(ctx) }()
			id, err := srv.Enqueue(reg.DeviceID, tt.executor, args, refserver.EnqueueOptions{})
			if err != nil {
				t.Fatal(err)
			}
			info, err := srv.Wait(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			var r struct {
				OK         bool   `json:"ok"`
				Error      string `json:"error"`
				ErrorClass string `json:"error_class"`
				Sandbox    string `json:"sandbox"`
			}
			if err := json.Unmarshal(info.ResultBody, &r); err != nil {
				t.Fatal(err)
			}
			if tt.rule == "" {
				if strings.Contains(r.Error, "owner's limits") {
					t.Fatalf("refused by the owner's limits, which allow it: %s", info.ResultBody)
				}
				if _, err := os.Lstat(out); err == nil && strings.Contains(tt.file, "preview") {
					t.Errorf("preview mode wrote the file: %s", info.ResultBody)
				}
				return
			}
			want := "executor " + tt.executor + ": not run on this device: refused by the owner's limits (" + lay.Limits() + "): " + tt.rule
			if r.OK || r.ErrorClass != wire.ClassDeviceError || r.Sandbox != "none" || !strings.HasPrefix(r.Error, want) {
				t.Errorf("result %s\nwant ok false, device_error, sandbox none, error starting %q", info.ResultBody, want)
			}
			if _, err := os.Lstat(out); err == nil {
				t.Error("the executor ran: its file was written")
			}
			if ents, _ := os.ReadDir(lay.SpoolStarted()); len(ents) != 0 {
				t.Errorf("a STARTED marker was written: %v", ents)
			}
			if !strings.Contains(logs.String(), "level=WARN msg=\"refused by the owner's limits; not run\"") {
				t.Errorf("no warning in the log:\n%s", logs.String())
			}
			ev, err := audit.OwnerEvents(lay.Audit(), time.Time{}, 0)
			if err != nil || len(ev) == 0 || ev[0].Event != audit.EventRefused || ev[0].InvocationID != id || !strings.Contains(ev[0].RefusedBy, tt.rule) {
				t.Errorf("the audit log's owner events: %+v, %v", ev, err)
			}
		})
	}
}

// TestLimitsChangesRecorded: the limits file found at the start is
// recorded in the audit log (against the copy of the last one in force:
// none); a change while the agent runs is put in force and recorded
// with its old and new values; a broken file is recorded, refused, and
// leaves the limits in force as they were; a touch without a change is
// not recorded; the log still verifies.
func TestLimitsChangesRecorded(t *testing.T) {
	a := limitsAgent(t, "mode = \"full\"\n")
	lay, logs := a.lay, a.logs
	path := lay.Limits()
	write := func(s string) {
		t.Helper()
		// A new time for the file, as an edit gives it.
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Duration(len(s)) * time.Second)
		os.Chtimes(path, later, later)
	}
	events := func() []audit.OwnerEvent {
		t.Helper()
		ev, err := audit.OwnerEvents(lay.Audit(), time.Time{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := events(); len(ev) != 1 || ev[0].Seen != "start" || !ev[0].InForce || ev[0].OldSHA256 != "" || ev[0].NewSHA256 != a.lim.SHA256 {
		t.Fatalf("at the start: %+v", ev)
	}
	if b, err := os.ReadFile(lay.LimitsSeen()); err != nil || string(b) != "mode = \"full\"\n" {
		t.Fatalf("the copy kept: %q, %v", b, err)
	}

	write("mode = \"readonly\"\n[executors]\ndeny = [\"delete_files\"]\n[priority]\ncpu = \"background\"\n")
	a.watchLimits()
	ev := events()
	if len(ev) != 2 || ev[0].Seen != "run" || !ev[0].InForce || len(ev[0].Changes) != 3 ||
		ev[0].Changes[0] != (audit.Change{Key: "mode", Old: `"full"`, New: `"readonly"`}) ||
		ev[0].Changes[1] != (audit.Change{Key: "executors.deny", Old: `[]`, New: `["delete_files"]`}) ||
		ev[0].Changes[2] != (audit.Change{Key: "priority.cpu", Old: `"low"`, New: `"background"`}) {
		t.Fatalf("after the change: %+v", ev)
	}
	if a.lim.InForce() != config.ModeReadonly {
		t.Errorf("mode in force %s, want readonly", a.lim.InForce())
	}
	if p := PriorityOf(a.lim); p.CPU != sandbox.CPUBackground || p.IO != sandbox.IOLow {
		t.Errorf("priority in force %v, want the edited file's: cpu background, io low", p)
	}

	os.Chtimes(path, time.Now().Add(time.Hour), time.Now().Add(time.Hour))
	a.watchLimits()
	if ev := events(); len(ev) != 2 {
		t.Errorf("a touch was recorded: %+v", ev[0])
	}

	write("moed = \"full\"\n")
	a.watchLimits()
	ev = events()
	if len(ev) != 3 || ev[0].InForce || !strings.Contains(ev[0].Error, `limits.toml:1:1: unknown key "moed"`) {
		t.Fatalf("after a broken file: %+v", ev[0])
	}
	if a.lim.InForce() != config.ModeReadonly {
		t.Errorf("a broken file changed the mode in force to %s", a.lim.InForce())
	}
	if !strings.Contains(logs.String(), "level=ERROR msg=\"the owner's limits file changed, and is refused") {
		t.Errorf("no error logged:\n%s", logs.String())
	}
	if b, _ := os.ReadFile(lay.LimitsSeen()); !strings.Contains(string(b), "readonly") {
		t.Errorf("the copy kept is not the file in force: %q", b)
	}

	os.Remove(path)
	a.watchLimits()
	ev = events()
	if len(ev) != 4 || !ev[0].InForce || ev[0].NewSHA256 != "" || a.lim.InForce() != config.ModeFull {
		t.Fatalf("after the file was removed: %+v, mode %s", ev[0], a.lim.InForce())
	}
	if _, err := os.Lstat(lay.LimitsSeen()); err == nil {
		t.Error("the copy of a removed file is still kept")
	}
	if rep, err := audit.Verify(lay.Audit()); err != nil || !rep.OK() {
		t.Errorf("audit verify: %+v, %v", rep, err)
	}
}
