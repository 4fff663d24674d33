package cli

import (
	"strings"
	"testing"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/sandbox"
)

// TestDoctorPriority: doctor shows the executors' priority in force and,
// a row each, what this machine gives of it; the report of this machine
// has every Linux mechanism, each said yes or no.
func TestDoctorPriority(t *testing.T) {
	var b strings.Builder
	r := doctorReport{Caps: sandbox.Caps{OS: "linux"}, Profiles: map[string]profileReport{},
		Priority: priorityReport{InForce: sandbox.DefaultPriority().String(), PriorityCaps: sandbox.PriorityCaps{
			Nice: "yes: nice 10", IOClass: "yes: best-effort 7; vda: mq-deadline", Autogroup: "on",
			CgroupCPU: "no: the agent may create no cgroup", CgroupIO: "no: the agent may create no cgroup", CPUTime: "yes: RLIMIT_CPU"}}}
	printDoctor(&b, r, layout.Layout{})
	out := b.String()
	for _, want := range []string{
		"priority      cpu low, io low\n",
		"  nice        yes: nice 10\n",
		"  io class    yes: best-effort 7; vda: mq-deadline\n",
		"  autogroup   on\n",
		"  cgroup cpu  no: the agent may create no cgroup\n",
		"  cgroup io   no: the agent may create no cgroup\n",
		"  cpu time    yes: RLIMIT_CPU\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor lacks %q:\n%s", want, out)
		}
	}
	if p := sandbox.ProbePriority(sandbox.Options{}); r.Caps.OS == "linux" && (p.Nice == "" || p.CPUTime == "") {
		t.Errorf("this machine's priority caps: %+v", p)
	}
}
