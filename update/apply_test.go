//go:build unix

package update

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/wire"
)

// TestApplyAndConfirm is the cycle the faults below break: Apply puts
// the new build in place and asks for a restart; the new build's first
// start is on probation, its first successful poll confirms it, the
// previous build is deleted and its version recorded as applied.
func TestApplyAndConfirm(t *testing.T) {
	a := agents(t)
	s := newServer(t)
	d := install(t, a.old)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.new))
	u := d.updater(t, s, false)
	if err := u.Apply(context.Background(), desc); !errors.Is(err, ErrRestart) {
		t.Fatalf("Apply: %v, want ErrRestart", err)
	}
	if got := version(t, d.Exe); got != "metnos-agent 2.0.0" {
		t.Fatalf("after the swap the executable says %q", got)
	}
	if fileSum(t, d.Old) != sum(read(t, a.old)) {
		t.Fatal("the previous build is not kept as .old")
	}
	if st := d.load(t); st.Phase != PhaseProbation || st.Version != "2.0.0" || !strings.Contains(u.Summary(), "on probation: 2.0.0") {
		t.Fatalf("record %+v, summary %q: want 2.0.0 on probation", st, u.Summary())
	}
	out, err := exec.Command(d.Exe, "run", d.state).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "running 2.0.0" {
		t.Fatalf("the new build's start: %v\n%s", err, out)
	}
	assertConfirmed(t, d, "2.0.0")
}

// assertConfirmed checks the end of a cycle: version v runs at Exe, is
// recorded as applied, and no previous build or download is left.
func assertConfirmed(t *testing.T, d device, v string) {
	t.Helper()
	if got := version(t, d.Exe); got != "metnos-agent "+v {
		t.Fatalf("the executable says %q, want %s", got, v)
	}
	st := d.load(t)
	if st.Phase != PhaseNone || st.Applied != v || st.Boots != 0 {
		t.Fatalf("record after the confirmation: %+v", st)
	}
	for _, p := range []string{d.Old, d.New, d.Failed, d.New + ".part"} {
		if exists(p) {
			t.Errorf("%s is left after the confirmation", p)
		}
	}
}

// assertUntouched checks that a failed Apply left the running build
// alone, installed nothing, and recorded the failure for the heartbeat.
func assertUntouched(t *testing.T, d device, u *Updater, old []byte, why string) {
	t.Helper()
	if fileSum(t, d.Exe) != sum(old) {
		t.Fatal("the executable was changed by a failed update")
	}
	if got := version(t, d.Exe); got != "metnos-agent 1.0.0" {
		t.Fatalf("the executable says %q", got)
	}
	for _, p := range []string{d.New, d.Old} {
		if exists(p) {
			t.Errorf("%s exists after a failed update", p)
		}
	}
	st := d.load(t)
	if st.Phase != PhaseNone || st.Failed == nil || st.Failed.Version != "2.0.0" || st.Failed.RolledBack {
		t.Fatalf("record %+v: want the failure of 2.0.0 recorded, no probation", st)
	}
	if got := u.Summary(); !strings.Contains(got, "update to 2.0.0 failed") || !strings.Contains(got, why) {
		t.Errorf("summary %q, want it to say the update to 2.0.0 failed: %s", got, why)
	}
	if got := New(Config{StatePath: d.state}).Summary(); got != u.Summary() {
		t.Errorf("the next start's summary %q, want %q", got, u.Summary())
	}
}

// TestApplyPinMismatch: a server that serves other bytes than the
// signed sha256 gets nothing put in place.
func TestApplyPinMismatch(t *testing.T) {
	a := agents(t)
	s := newServer(t)
	d := install(t, a.old)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0", SHA256: sum(read(t, a.new))}, read(t, a.crash))
	u := d.updater(t, s, false)
	err := u.Apply(context.Background(), desc)
	if err == nil || errors.Is(err, ErrRestart) || !strings.Contains(err.Error(), "pin") {
		t.Fatalf("Apply: %v, want the sha256 mismatch", err)
	}
	assertUntouched(t, d, u, read(t, a.old), "sha256")
}

// TestApplyResumesCutDownload: the server drops the connection in the
// middle of the build; Apply resumes with a Range request for what is
// missing, not from the start, and puts in place the whole, verified
// build.
func TestApplyResumesCutDownload(t *testing.T) {
	a := agents(t)
	s := newServer(t)
	s.cutReq, s.cut = 3, 300_000
	d := install(t, a.old)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.new))
	if err := d.updater(t, s, false).Apply(context.Background(), desc); !errors.Is(err, ErrRestart) {
		t.Fatalf("Apply: %v, want ErrRestart", err)
	}
	if len(s.ranges) <= s.cutReq {
		t.Fatalf("requests %q: want the cut one (number %d) and the rest after it", s.ranges, s.cutReq)
	}
	cut, next := s.ranges[s.cutReq-1], s.ranges[s.cutReq]
	if !strings.HasPrefix(next, "bytes=") || strings.HasPrefix(next, "bytes=0-") || next != cut {
		t.Fatalf("after the cut request (%q) came %q: want the cut chunk asked for again (requests %q)", cut, next, s.ranges)
	}
	for _, r := range s.ranges[1:] {
		if strings.HasPrefix(r, "bytes=0-") {
			t.Fatalf("the download started over (requests %q)", s.ranges)
		}
	}
	if fileSum(t, d.Exe) != sum(read(t, a.new)) || version(t, d.Exe) != "metnos-agent 2.0.0" {
		t.Fatal("the build in place is not the published one")
	}
}

// TestApplyBuildThatDoesNotRun: a build that matches its sha256 but
// does not run here (`version` fails) is refused and deleted.
func TestApplyBuildThatDoesNotRun(t *testing.T) {
	a := agents(t)
	for _, c := range []struct{ name, content string }{
		{"junk bytes", "\x7fELF\x02\x01\x01junk that is no program"},
		{"a program that fails", "#!/bin/sh\necho 'cannot start' >&2\nexit 3\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			d := install(t, a.old)
			desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, []byte(c.content))
			u := d.updater(t, s, false)
			err := u.Apply(context.Background(), desc)
			if err == nil || errors.Is(err, ErrRestart) || !strings.Contains(err.Error(), "does not run on this machine") {
				t.Fatalf("Apply: %v, want the build refused", err)
			}
			assertUntouched(t, d, u, read(t, a.old), "does not run")
			// Not downloaded again by the run loop; by hand it is.
			dec, err := u.Check(context.Background(), false)
			if err != nil || dec.Apply || !strings.Contains(dec.Why, "failed here") {
				t.Fatalf("Check after the refusal: %+v, %v; want it declined", dec, err)
			}
			if dec, err := u.Check(context.Background(), true); err != nil || !dec.Apply {
				t.Fatalf("Check by hand after the refusal: %+v, %v; want it applied", dec, err)
			}
		})
	}
}

// TestSummaryDuringApply: the heartbeat's Summary and the run loop's
// Probation answer while a download is under way, however long it
// takes (they are read by the heartbeat's own goroutine).
func TestSummaryDuringApply(t *testing.T) {
	a := agents(t)
	s := newServer(t)
	s.hold, s.held = make(chan struct{}), make(chan struct{}, 1)
	d := install(t, a.old)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.new))
	u := d.updater(t, s, false)
	applied := make(chan error, 1)
	go func() { applied <- u.Apply(context.Background(), desc) }()
	<-s.held // the download is under way, and stays so
	answered := make(chan string, 1)
	go func() {
		u.Probation()
		answered <- u.Summary()
	}()
	select {
	case got := <-answered:
		if got != "" {
			t.Errorf("summary during the download: %q", got)
		}
	case <-time.After(10 * time.Second): // a safety net: it answers at once, or never
		t.Error("Summary waited for the download")
	}
	close(s.hold)
	if err := <-applied; !errors.Is(err, ErrRestart) {
		t.Fatalf("Apply: %v", err)
	}
	if got := u.Summary(); !strings.Contains(got, "on probation: 2.0.0") {
		t.Errorf("summary after the swap: %q", got)
	}
}

// TestApplyStopped: an agent stopped in the middle of a download
// (its context canceled) records no failed update for the heartbeat:
// the download is kept and resumed by the next check.
func TestApplyStopped(t *testing.T) {
	a := agents(t)
	s := newServer(t)
	s.hold, s.held = make(chan struct{}), make(chan struct{}, 1)
	defer close(s.hold)
	d := install(t, a.old)
	desc := s.publish(t, wire.ComponentDescriptor{Version: "2.0.0"}, read(t, a.new))
	u := d.updater(t, s, false)
	ctx, cancel := context.WithCancel(context.Background())
	applied := make(chan error, 1)
	go func() { applied <- u.Apply(ctx, desc) }()
	<-s.held
	cancel()
	if err := <-applied; err == nil || errors.Is(err, ErrRestart) {
		t.Fatalf("Apply: %v, want the stop", err)
	}
	if st := d.load(t); st.Failed != nil || st.Phase != PhaseNone {
		t.Fatalf("record after a stop: %+v (failed %+v)", st, st.Failed)
	}
	if got := u.Summary(); got != "" {
		t.Errorf("summary after a stop: %q", got)
	}
	if fileSum(t, d.Exe) != sum(read(t, a.old)) || exists(d.New) {
		t.Fatal("a stopped update changed the executable or installed a build")
	}
}
