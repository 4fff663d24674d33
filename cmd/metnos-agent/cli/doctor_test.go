package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// TestDoctorCapabilities: doctor --capabilities prints what each
// capability means on this device, system:admin refused with its
// reason, and --json gives the same table as data.
func TestDoctorCapabilities(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	var out, errb bytes.Buffer
	if code := run(stdio{in: os.Stdin, out: &out, err: &errb}, []string{"doctor", "--capabilities"}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"any other capability or hint is refused", "network_interfaces", "service_status"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("doctor --capabilities lacks %q:\n%s", want, out.String())
		}
	}
	var admin, netif bool
	for _, l := range strings.Split(out.String(), "\n") {
		admin = admin || strings.HasPrefix(l, "system:admin") && strings.Contains(l, "refused") && strings.Contains(l, "does not give administrative rights to executors")
		netif = netif || strings.HasPrefix(l, "system:read") && strings.Contains(l, "network_interfaces") && strings.Contains(l, " grant ") && strings.Contains(l, "sends no traffic")
	}
	if !admin {
		t.Errorf("no system:admin refused line:\n%s", out.String())
	}
	if !netif {
		t.Errorf("no system:read network_interfaces grant line saying it sends no traffic:\n%s", out.String())
	}
	out.Reset()
	if code := run(stdio{in: os.Stdin, out: &out, err: &errb}, []string{"doctor", "--capabilities", "--json"}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var table []policy.CapabilityRule
	if err := json.Unmarshal(out.Bytes(), &table); err != nil {
		t.Fatalf("--json: %v\n%s", err, out.String())
	}
	if len(table) != len(policy.CapabilityTable(policy.Host{Home: "/"})) {
		t.Errorf("--json has %d rows, want the table's %d", len(table), len(policy.CapabilityTable(policy.Host{Home: "/"})))
	}
}

// TestDoctorWindowsRungs: on Windows doctor shows which rungs the
// machine gives and why not the others, and none of the Linux layers.
func TestDoctorWindowsRungs(t *testing.T) {
	var b strings.Builder
	r := doctorReport{Caps: sandbox.Caps{OS: "windows", LowIntegrity: true, AppContainerNote: "userenv.dll has no CreateAppContainerProfile (Windows before 8, or Wine)"}, Profiles: map[string]profileReport{}}
	printDoctor(&b, r, layout.Layout{})
	out := b.String()
	for _, want := range []string{
		"appcontainer   no: userenv.dll has no CreateAppContainerProfile",
		"low-integrity  yes",
		"job-object     yes",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor lacks %q:\n%s", want, out)
		}
	}
	for _, linux := range []string{"bwrap", "landlock", "seccomp", "cgroup"} {
		if strings.Contains(out, "\n"+linux+" ") {
			t.Errorf("doctor on Windows shows %s:\n%s", linux, out)
		}
	}
}
