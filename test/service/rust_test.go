//go:build linux

package service

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/refserver"
)

// rustUnit is the unit the Rust client's installer writes
// (client-rs/install/install.sh.in of the Metnos repository), for its
// binary at dest and the server at server.
func rustUnit(dest, server string) string {
	return `[Unit]
Description=Metnos remote executor client
After=network-online.target
StartLimitIntervalSec=0

[Service]
ExecStartPre=-/bin/sh -c '[ -x "` + dest + `" ] || { [ -f "` + dest + `.old" ] && mv -f "` + dest + `.old" "` + dest + `"; }'
ExecStart=` + dest + ` run --server ` + server + `
Restart=always
RestartSec=5

[Install]
WantedBy=default.target
`
}

// TestTakeOverFromRustClient: the Rust client installed and running as
// its installer leaves it (its unit, its binary in ~/.local/bin, its
// pairing, linger), then `metnos-agent install`: the Rust client's unit
// is stopped and disabled, the pairing is kept, and from then on exactly
// one client polls for the device: the server sees one device and
// delivers each invocation once. uninstall says how to give the device
// back; uninstall --restore-rust-client does it.
//
// The Rust client itself is not built here: its binary is stood in for
// by metnos-agent (which speaks its protocol and shares its data folder
// and lock) under the Rust client's name and unit.
func TestTakeOverFromRustClient(t *testing.T) {
	c := newContainer(t)
	w := newWorld(t)
	c.installAgent(binDir)
	dest := home + "/.local/bin/metnos-client"
	c.put(filepath.Join(binDir, "metnos-agent"), dest, 0o755)
	c.must(dest, "register", "--server", w.url, "--token", w.token())
	w.paired()
	c.write(home+"/.config/systemd/user/metnos-client.service", []byte(rustUnit(dest, w.url)), 0o644)
	c.must("systemctl", "--user", "daemon-reload")
	c.must("systemctl", "--user", "enable", "--now", "metnos-client.service")
	c.must("loginctl", "enable-linger", user)
	id := w.enqueue("echo_args", map[string]any{"by": "rust"}, refserver.EnqueueOptions{})
	if _, res := w.wait(id, 90*time.Second); res["ok"] != true {
		t.Fatalf("the Rust client's echo: %v", res)
	}

	out := c.must("metnos-agent", "install")
	t.Logf("$ metnos-agent install\n%s", out)
	if !strings.Contains(out, "taking over from the Rust client") {
		t.Error("install does not say it takes over from the Rust client")
	}
	rustActive, _ := c.as("systemctl", "--user", "is-active", "metnos-client")
	rustEnabled, _ := c.as("systemctl", "--user", "is-enabled", "metnos-client")
	if strings.TrimSpace(rustActive) == "active" || strings.TrimSpace(rustEnabled) != "disabled" {
		t.Fatalf("after install the Rust client's unit is %s and %s, want stopped and disabled", strings.TrimSpace(rustActive), strings.TrimSpace(rustEnabled))
	}
	if c.active() != "active" {
		t.Fatal("after install metnos-agent does not run")
	}
	for _, p := range c.processes() {
		if strings.Contains(p, "metnos-client") {
			t.Fatalf("after install the Rust client still runs: %s", p)
		}
	}
	status := c.must("metnos-agent", "status")
	t.Logf("$ metnos-agent status\n%s", status)
	if !strings.Contains(status, "metnos-client.service (enabled: no)") {
		t.Error("status does not show the Rust client's unit, disabled")
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, w.enqueue("echo_args", map[string]any{"n": i}, refserver.EnqueueOptions{}))
	}
	for _, id := range ids {
		info, res := w.wait(id, 90*time.Second)
		if res["ok"] != true || info.Deliveries != 1 || info.ResultPosts != 1 {
			t.Fatalf("after the takeover %s: ok=%v, delivered %d times, answered %d, want once each", id, res["ok"], info.Deliveries, info.ResultPosts)
		}
	}
	if devs := w.srv.Devices(); len(devs) != 1 || devs[0].ID != w.device {
		t.Fatalf("after the takeover the server knows %d devices, want the one paired by the Rust client", len(devs))
	}

	if out, err := c.as("metnos-agent", "uninstall", "--purge"); err == nil || !strings.Contains(out, "Rust client") {
		t.Fatalf("uninstall --purge with the Rust client installed: %v\n%s", err, out)
	}
	out = c.must("metnos-agent", "uninstall", "--restore-rust-client")
	t.Logf("$ metnos-agent uninstall --restore-rust-client\n%s", out)
	if _, err := c.readFile(home + "/.config/systemd/user/metnos-agent.service"); err == nil {
		t.Error("uninstall --restore-rust-client left metnos-agent's unit")
	}
	if got, _ := c.as("systemctl", "--user", "is-active", "metnos-client"); strings.TrimSpace(got) != "active" {
		t.Fatalf("after uninstall --restore-rust-client the Rust client is %q", strings.TrimSpace(got))
	}
	id = w.enqueue("echo_args", map[string]any{"back": "rust"}, refserver.EnqueueOptions{})
	if _, res := w.wait(id, 90*time.Second); res["ok"] != true {
		t.Fatalf("the Rust client's echo after getting the device back: %v", res)
	}
	for _, p := range c.processes() {
		if strings.Contains(p, "metnos-agent run") {
			t.Fatalf("after uninstall metnos-agent still runs: %s", p)
		}
	}
}
