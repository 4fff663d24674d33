//go:build linux

package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/metnos/agent/refserver"
)

// capsEntries is the probe's entries: one per program it ran.
func capsEntries(t *testing.T, r map[string]any) []map[string]any {
	t.Helper()
	es, _ := r["entries"].([]any)
	var out []map[string]any
	for _, e := range es {
		m, _ := e.(map[string]any)
		out = append(out, m)
	}
	return out
}

// TestCapsRefused: an executor declaring a capability the agent does
// not know or system:admin (upstream install_packages' block) is
// refused before anything runs, with a device_error that names the
// executor, the capability and its hint; a conditional provider:access
// is refused only when its when clause holds.
func TestCapsRefused(t *testing.T) {
	w := newWorld(t)
	w.pair()
	w.start()
	for _, c := range []struct {
		executor string
		args     map[string]any
		want     []string
	}{
		{"unknown_caps", map[string]any{}, []string{"executor unknown_caps", `capability teleport:now hint ["mars"]`, "does not know the capability"}},
		{"install_packages", map[string]any{"run": [][]string{{"apt-get", "download", "--print-uris", "bash"}}},
			[]string{"executor install_packages", `capability system:admin hint ["winget","apt-get"]`, "this device does not give administrative rights to executors"}},
		{"provider_when", map[string]any{"client": "google_workspace"},
			[]string{"executor provider_when", `capability provider:access hint ["google-workspace"]`, "provider credentials"}},
	} {
		info := w.wait(w.enqueue(c.executor, c.args, refserver.EnqueueOptions{}))
		r := result(t, info)
		msg, _ := r["error"].(string)
		if r["ok"] != false || r["error_class"] != "device_error" || r["sandbox"] != "none" {
			t.Errorf("%s: ok %v error_class %v sandbox %v, want a device_error refusal; error %q", c.executor, r["ok"], r["error_class"], r["sandbox"], msg)
		}
		for _, want := range c.want {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error %q lacks %q", c.executor, msg, want)
			}
		}
		if _, err := os.Stat(filepath.Join(w.dataDir(), "shimdata", "ran-"+c.executor)); !os.IsNotExist(err) {
			t.Errorf("%s: the executor ran", c.executor)
		}
	}
}

// TestCapsFindPackages: upstream find_packages' capability block gives
// the package database to the run: dpkg-query finds libc6 installed
// (before, it said "no packages found" for it), and where the host's
// apt answers `apt-get download --print-uris bash` (what upstream
// install_packages' approval card is made of), so does the run.
func TestCapsFindPackages(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("dpkg-query is not on this machine: no dpkg database to find a package in")
	}
	runs := [][]string{{"dpkg-query", "-W", "-f=${Package}\t${db:Status-Status}\n", "libc6"}}
	apt := exec.Command("apt-get", "download", "--print-uris", "bash")
	apt.Env = []string{"PATH=/usr/bin:/bin"}
	hostURI, _ := apt.Output()
	if strings.Contains(string(hostURI), "SHA256:") {
		runs = append(runs, []string{"apt-get", "download", "--print-uris", "bash"})
	} else {
		t.Log("apt-get download --print-uris bash gives no URI on the host: not checked in the sandbox")
	}
	w := newWorld(t)
	w.pair()
	w.start()
	info := w.wait(w.enqueue("find_packages", map[string]any{"run": runs}, refserver.EnqueueOptions{}))
	r := result(t, info)
	if r["ok"] != true || r["sandbox"] != bestSandbox() {
		t.Fatalf("find_packages: ok %v sandbox %v (want %s), error %v", r["ok"], r["sandbox"], bestSandbox(), r["error"])
	}
	es := capsEntries(t, r)
	if len(es) != len(runs) {
		t.Fatalf("entries %v", r["entries"])
	}
	if out, _ := es[0]["stdout"].(string); es[0]["rc"] != 0.0 || !strings.Contains(out, "libc6\tinstalled") {
		t.Errorf("dpkg-query -W libc6 in the sandbox: %v", es[0])
	}
	if len(es) > 1 {
		if out, _ := es[1]["stdout"].(string); es[1]["rc"] != 0.0 || out != string(hostURI) {
			t.Errorf("apt-get download --print-uris bash in the sandbox: %v\nthe host's: %s", es[1], hostURI)
		}
	}
	if _, err := os.Stat(filepath.Join(w.dataDir(), "shimdata", "ran-find_packages")); err != nil {
		t.Errorf("the probe did not note its run: %v", err)
	}
}

// TestCapsProgramPath: a program code:exec names outside the
// executor's own PATH (/usr/sbin/bridge, of iproute2, with the agent's
// PATH /usr/bin:/bin) is found and runs in the sandbox; a conditional
// provider:access whose clause does not hold (client left to its
// default, local) does not refuse the run.
func TestCapsProgramPath(t *testing.T) {
	if fi, err := os.Stat("/usr/sbin/bridge"); err != nil || fi.Mode()&0o111 == 0 {
		t.Skip("this machine has no /usr/sbin/bridge to look for")
	}
	if _, err := os.Stat("/usr/bin/bridge"); err == nil {
		t.Skip("this machine has bridge in /usr/bin too: the executor's own PATH finds it")
	}
	t.Setenv("PATH", "/usr/bin:/bin")
	w := newWorld(t)
	w.pair()
	w.start()
	info := w.wait(w.enqueue("provider_when", map[string]any{"run": [][]string{{"bridge", "-V"}}}, refserver.EnqueueOptions{}))
	r := result(t, info)
	if r["ok"] != true {
		t.Fatalf("provider_when with client local: ok %v, error %v", r["ok"], r["error"])
	}
	es := capsEntries(t, r)
	if len(es) != 1 {
		t.Fatalf("entries %v", r["entries"])
	}
	if out, _ := es[0]["stdout"].(string); es[0]["which"] != "/usr/sbin/bridge" || es[0]["rc"] != 0.0 || !strings.Contains(out, "bridge utility") {
		t.Errorf("bridge -V in the sandbox: %v", es)
	}
}

// TestCapsGetProcessesHostView: upstream get_processes' capability
// block (system:read processes, health, network_interfaces,
// service_status) runs, through the agent and the server, in the
// host's PID namespace and the host's network view: the probe finds,
// by its argv in `ps -eo pid,args`, a process the test started (before,
// the run had a PID namespace of its own, and the block was refused
// for network_interfaces), cannot read its environment nor stop it
// (checked from outside: it is still alive and not stopped), and lists
// the host's interfaces; sandbox_downgrade_reason says what it shares.
func TestCapsGetProcessesHostView(t *testing.T) {
	argv := []string{"sleep", "4242.5"}
	target := exec.Command(argv[0], argv[1:]...)
	target.Env = append(os.Environ(), "METNOS_E2E_SECRET=host-view-secret")
	if err := target.Start(); err != nil {
		t.Fatalf("starting %q: %v", argv, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- target.Wait() }()
	t.Cleanup(func() {
		target.Process.Kill()
		<-exited
	})
	var host [][2]any
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		host = append(host, [2]any{float64(i.Index), i.Name})
	}

	w := newWorld(t)
	w.pair()
	w.start()
	info := w.wait(w.enqueue("get_processes", map[string]any{"find": argv, "ifaces": true}, refserver.EnqueueOptions{}))
	r := result(t, info)
	if r["ok"] != true || r["sandbox"] != bestSandbox() {
		t.Fatalf("get_processes: ok %v sandbox %v (want %s), error %v", r["ok"], r["sandbox"], bestSandbox(), r["error"])
	}
	// What the probe printed beyond the result's own fields.
	p, _ := r["payload"].(map[string]any)
	reason, _ := r["sandbox_downgrade_reason"].(string)
	for _, want := range []string{"shares the host's PID namespace", "shares the host's network namespace read-only"} {
		if !strings.Contains(reason, want) {
			t.Errorf("sandbox_downgrade_reason %q lacks %q", reason, want)
		}
	}
	if found, _ := p["found"].([]any); len(found) != 1 || found[0] != float64(target.Process.Pid) {
		t.Errorf("ps -eo pid,args in the sandbox found %q at %v, want pid %d (ps: %v)", argv, p["found"], target.Process.Pid, p["ps"])
	}
	if env, ok := p["environ"].(string); ok {
		t.Errorf("the sandbox read /proc/%d/environ: %q", target.Process.Pid, env)
	} else if e, _ := p["environ_error"].(string); e == "" {
		t.Errorf("no attempt to read /proc/%d/environ: %v", target.Process.Pid, p)
	}
	if p["stop"] != nil {
		t.Errorf("the sandbox sent SIGSTOP to pid %d: %v", target.Process.Pid, p["stop"])
	} else if e, _ := p["stop_error"].(string); e == "" {
		t.Errorf("no attempt to stop pid %d: %v", target.Process.Pid, p)
	}
	// From outside: the process still runs and is not stopped.
	select {
	case err := <-exited:
		exited <- err
		t.Errorf("%q exited during the run: %v", argv, err)
	default:
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", target.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if _, after, _ := strings.Cut(string(stat), ") "); !strings.HasPrefix(after, "S ") && !strings.HasPrefix(after, "R ") {
		t.Errorf("%q is in state %.1s after the run, want running or sleeping", argv, after)
	}
	got, _ := p["ifaces"].([]any)
	var inside [][2]any
	for _, g := range got {
		if p, _ := g.([]any); len(p) == 2 {
			inside = append(inside, [2]any{p[0], p[1]})
		}
	}
	if !slices.Equal(inside, host) {
		t.Errorf("socket.if_nameindex() in the sandbox: %v (error %v), the host's: %v", p["ifaces"], p["ifaces_error"], host)
	}
}
