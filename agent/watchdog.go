package agent

import (
	"sync"
	"time"
)

// watchdogGrace is how long the watchdog waits, once it finds a run
// still going, before it gives up on it: its second look. After a pause
// of the whole process (SIGSTOP, a VM pause, a debugger, heavy
// swapping) every timer comes due at once on resume, the watchdog's with
// the run's own end and the sandbox's deadline kill; the grace lets an
// ended run be collected, and a run past its deadline be killed by the
// sandbox, before the watchdog judges it.
const watchdogGrace = 5 * time.Second

// watchdog calls fire when a run has not ended 10 s after its deadline
// limit: it looks at limit+10s-watchdogGrace and, if the run has not
// ended, again watchdogGrace later (counted from that first look, so
// from the resume after a pause); only a run still going at the second
// look is reported. A run ends when [watchdog.ended] is called.
type watchdog struct {
	mu    sync.Mutex
	done  bool
	timer *time.Timer
}

// startWatchdog arms a watchdog for a run with the deadline limit.
func startWatchdog(limit time.Duration, fire func()) *watchdog {
	w := &watchdog{}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = time.AfterFunc(limit+10*time.Second-watchdogGrace, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.done {
			return
		}
		w.timer = time.AfterFunc(watchdogGrace, func() {
			w.mu.Lock()
			done := w.done
			w.mu.Unlock()
			if !done {
				fire()
			}
		})
	})
	return w
}

// ended says the run ended (or was collected): the watchdog never fires
// after it.
func (w *watchdog) ended() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	w.timer.Stop()
}
