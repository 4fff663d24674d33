package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/lockfile"
)

// liveStatus is what the running agent last heard from the server, in
// layout.AgentStatus, for `status` to say whether the device polls.
type liveStatus struct {
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Server  string    `json:"server"`
	Started time.Time `json:"started"`
	// LastAnswered is the last heartbeat the server answered (zero:
	// none yet); Failing, the error of the heartbeats since, if any.
	LastAnswered time.Time `json:"last_answered,omitzero"`
	Failing      string    `json:"failing,omitempty"`
	// InFlight is how many invocations ran at the last heartbeat, and
	// Concurrency how many may run at once (0: an older agent's file).
	InFlight    int `json:"in_flight"`
	Concurrency int `json:"concurrency,omitempty"`
}

// liveStatusWriter returns the agent's OnBeat: it rewrites the status
// file after each heartbeat (every 30 s: a small file, replaced whole,
// not fsynced: losing it costs nothing but a line of `status`).
// inFlight, when set, says how many invocations run and may run at
// once (agent.Agent.InFlight).
func liveStatusWriter(lay layout.Layout, server string, log *slog.Logger, inFlight func() (int, int)) func(error) {
	st := liveStatus{PID: os.Getpid(), Version: version(), Server: server, Started: time.Now().UTC()}
	warned := false
	return func(err error) {
		if inFlight != nil {
			st.InFlight, st.Concurrency = inFlight()
		}
		if err == nil {
			st.LastAnswered, st.Failing = time.Now().UTC(), ""
		} else {
			st.Failing = err.Error()
		}
		b, _ := json.Marshal(st)
		tmp := lay.AgentStatus() + ".tmp"
		werr := os.WriteFile(tmp, b, 0o600)
		if werr == nil {
			werr = os.Rename(tmp, lay.AgentStatus())
		}
		if werr != nil && !warned {
			warned = true
			log.Warn("cannot write the status file that `metnos-agent status` reads", "path", lay.AgentStatus(), "err", werr)
		}
	}
}

// printLiveStatus says what the agent in process pid last heard from
// the server, from its status file.
func printLiveStatus(w io.Writer, lay layout.Layout, pid int, now time.Time) {
	st, ok := readLiveStatus(lay, pid)
	if !ok {
		return
	}
	fmt.Fprintf(w, "server:      %s (agent %s, up %s)\n", st.Server, st.Version, now.Sub(st.Started).Round(time.Second))
	switch {
	case st.Failing != "" && st.LastAnswered.IsZero():
		fmt.Fprintf(w, "polls:       not answered yet: %s\n", st.Failing)
	case st.Failing != "":
		fmt.Fprintf(w, "polls:       failing since %s ago: %s\n", now.Sub(st.LastAnswered).Round(time.Second), st.Failing)
	case st.LastAnswered.IsZero():
		fmt.Fprintf(w, "polls:       starting\n")
	default:
		fmt.Fprintf(w, "polls:       yes, the server answered %s ago\n", now.Sub(st.LastAnswered).Round(time.Second))
	}
	if st.Concurrency > 0 {
		fmt.Fprintf(w, "runs:        %d in flight (at most %d at once; at the last heartbeat)\n", st.InFlight, st.Concurrency)
	}
}

// readLiveStatus reads the status file of the agent in process pid; ok
// is false when there is none, or it is another process's.
func readLiveStatus(lay layout.Layout, pid int) (st liveStatus, ok bool) {
	b, err := os.ReadFile(lay.AgentStatus())
	if err != nil || json.Unmarshal(b, &st) != nil || st.PID != pid || pid == 0 {
		return liveStatus{}, false
	}
	return st, true
}

// printRuns says, for whoami, how many invocations the agent that holds
// the run lock ran at its last heartbeat; nothing when none runs.
func printRuns(w io.Writer, lay layout.Layout) {
	pid, held, _ := lockfile.LockHolder(lay.Lock())
	if !held {
		return
	}
	if st, ok := readLiveStatus(lay, pid); ok && st.Concurrency > 0 {
		fmt.Fprintf(w, "runs:                %d in flight, at most %d at once (agent pid %d, at its last heartbeat)\n", st.InFlight, st.Concurrency, pid)
	}
}
