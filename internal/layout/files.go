package layout

import (
	"fmt"
	"strings"
)

// In the data folder (docs/protocol.md §14).

// Key is the device's Ed25519 seed, 32 raw bytes: <data>/key.
func (l Layout) Key() string { return l.join(l.Data, "key") }

// State is the pairing, state.json: <data>/state.json.
func (l Layout) State() string { return l.join(l.Data, "state.json") }

// Lock is the single-instance lock a running agent (or Rust client)
// holds: <data>/client.lock.
func (l Layout) Lock() string { return l.join(l.Data, "client.lock") }

// SandboxGrants is the Windows sandbox's grant ledger: a record of the
// access entries each AppContainer run adds, written before it adds
// them, for the next start to remove what a killed run left:
// <data>/sandbox-grants.
func (l Layout) SandboxGrants() string { return l.join(l.Data, "sandbox-grants") }

// AgentStatus is what the running agent last heard from the server,
// for `status` to show: <data>/agent-status.json.
func (l Layout) AgentStatus() string { return l.join(l.Data, "agent-status.json") }

// Log is the agent's log, rotated to client.log.1: <data>/client.log.
func (l Layout) Log() string { return l.join(l.Data, "client.log") }

// The spool, <data>/spool, is the write-ahead state of exactly-once
// execution; these are its folders and its ledger.

// SpoolResults holds the results not yet accepted by the server, one
// <id>.json each: <data>/spool/results.
func (l Layout) SpoolResults() string { return l.join(l.Data, "spool", "results") }

// SpoolStarted holds the STARTED markers, one <id>.json each:
// <data>/spool/started.
func (l Layout) SpoolStarted() string { return l.join(l.Data, "spool", "started") }

// SpoolDeadResults holds the results the server refused for good:
// <data>/spool/dead-results.
func (l Layout) SpoolDeadResults() string { return l.join(l.Data, "spool", "dead-results") }

// Ledger is the list of executed invocation ids, one a line:
// <data>/spool/executed.log.
func (l Layout) Ledger() string { return l.join(l.Data, "spool", "executed.log") }

// UserData is the executors' METNOS_USER_DATA: <data>/shimdata.
func (l Layout) UserData() string { return l.join(l.Data, "shimdata") }

// UserState is the executors' METNOS_USER_STATE: <data>/shimdata/state.
func (l Layout) UserState() string { return l.join(l.Data, "shimdata", "state") }

// UserConfig is the executors' METNOS_USER_CONFIG:
// <data>/shimdata/config.
func (l Layout) UserConfig() string { return l.join(l.Data, "shimdata", "config") }

// Workspace is the executors' METNOS_WORKSPACE:
// <data>/shimdata/workspace.
func (l Layout) Workspace() string { return l.join(l.Data, "shimdata", "workspace") }

// Blobs is where executors write backup blobs before a destructive
// change, <turn>/blob/<sha256>.bin (the shim's default
// METNOS_HISTORY_DIR): <data>/shimdata/_history.
func (l Layout) Blobs() string { return l.join(l.Data, "shimdata", "_history") }

// Journal is the folder of the agent's history journal (the agent's
// own, not the Rust client's): <data>/history.
func (l Layout) Journal() string { return l.join(l.Data, "history") }

// Audit is the folder of the agent's audit log: <data>/audit.
func (l Layout) Audit() string { return l.join(l.Data, "audit") }

// UpdateState is the self-update's probation marker and record of
// what was applied or rolled back: <data>/agent-update.json (the Rust
// client's is update_state.json, which this never reads).
func (l Layout) UpdateState() string { return l.join(l.Data, "agent-update.json") }

// TailnetConfig is the embedded tailnet node's configuration (never its
// auth key): <data>/tailnet.json.
func (l Layout) TailnetConfig() string { return l.join(l.Data, "tailnet.json") }

// TailnetState is the embedded tailnet node's state folder:
// <data>/tailnet.
func (l Layout) TailnetState() string { return l.join(l.Data, "tailnet") }

// TailnetStatus is the node's last reported status:
// <data>/tailnet/status.json.
func (l Layout) TailnetStatus() string { return l.join(l.Data, "tailnet", "status.json") }

// In the cache folder (docs/protocol.md §14).

// Executors holds the verified executor bundles: <cache>/executors.
func (l Layout) Executors() string { return l.join(l.Cache, "executors") }

// Executor is the folder of one executor bundle, named by the executor
// and the first 16 hex digits of its manifest's sha256, lower case:
// <cache>/executors/<name>-<sha16>. The caller checks that name is a
// plain file name and manifestSHA a sha256.
func (l Layout) Executor(name, manifestSHA string) string {
	sha := strings.ToLower(manifestSHA)
	return l.join(l.Executors(), name+"-"+sha[:min(16, len(sha))])
}

// Shim is the verified shim (the executors' Python support code):
// <cache>/shim.
func (l Layout) Shim() string { return l.join(l.Cache, "shim") }

// Runtime is where the Python runtime is installed and downloaded:
// <cache>/runtime.
func (l Layout) Runtime() string { return l.join(l.Cache, "runtime") }

// RuntimePython is the installed runtime's "python" folder (on Unix a
// link into RuntimeVersions): <cache>/runtime/python.
func (l Layout) RuntimePython() string { return l.join(l.Cache, "runtime", "python") }

// Interpreter is the installed runtime's interpreter:
// <cache>/runtime/python/bin/python3, or python\python.exe on Windows.
func (l Layout) Interpreter() string {
	if l.os() == "windows" {
		return l.join(l.RuntimePython(), "python.exe")
	}
	return l.join(l.RuntimePython(), "bin", "python3")
}

// InterpreterCandidates are the interpreters of the installed runtime
// the agent looks for, in order: [Layout.Interpreter], then
// <cache>/runtime/python/bin/python.
func (l Layout) InterpreterCandidates() []string {
	return []string{l.Interpreter(), l.join(l.RuntimePython(), "bin", "python")}
}

// RuntimeVersions holds the unpacked runtimes, one folder per archive:
// <cache>/runtime/versions.
func (l Layout) RuntimeVersions() string { return l.join(l.Cache, "runtime", "versions") }

// RuntimeLock is held by the one runtime install under way:
// <cache>/runtime/.lock.
func (l Layout) RuntimeLock() string { return l.join(l.Cache, "runtime", ".lock") }

// RuntimeCurrent describes the installed runtime:
// <cache>/runtime/current.json.
func (l Layout) RuntimeCurrent() string { return l.join(l.Cache, "runtime", "current.json") }

// RuntimeDescriptor is the last verified signed runtime descriptor:
// <cache>/runtime/runtime-descriptor.json.
func (l Layout) RuntimeDescriptor() string {
	return l.join(l.Cache, "runtime", "runtime-descriptor.json")
}

// RuntimeArchive is where the runtime archive filename is downloaded
// and kept once verified (its .part files beside it while it
// downloads): <cache>/runtime/<filename>.verified. The caller checks
// that filename is a plain file name.
func (l Layout) RuntimeArchive(filename string) string {
	return l.join(l.Cache, "runtime", filename+".verified")
}

// In the configuration folder, which holds what the device's owner
// writes by hand.

// ConfigDir is the agent's configuration folder, the dirs crate's (where
// the Rust client keeps nothing): $XDG_CONFIG_HOME/metnos (else
// ~/.config/metnos) on Linux, ~/Library/Application Support/metnos (the
// data folder) on macOS, %APPDATA%\metnos (else %LOCALAPPDATA%\metnos)
// on Windows; ~/.config/metnos for a Layout built by hand. It is one of
// [Layout.AgentDirs] wherever it is, so no executor sees it. ""
// when the home folder it needs is unknown. METNOS_DATA_DIR does not
// move it.
func (l Layout) ConfigDir() string {
	switch {
	case l.config != "":
		return l.config
	case l.goos == "" && l.Home != "":
		return l.join(l.Home, ".config", "metnos")
	}
	return ""
}

// Limits is the device owner's limits file, which no invocation can
// change: <config>/limits.toml ("" without a configuration folder).
func (l Layout) Limits() string {
	if d := l.ConfigDir(); d != "" {
		return l.join(d, "limits.toml")
	}
	return ""
}

// LimitsSeen is the copy of the owner's limits file the agent last put
// in force, which the next change is compared with:
// <data>/limits-seen.toml.
func (l Layout) LimitsSeen() string { return l.join(l.Data, "limits-seen.toml") }

// Outside the agent's folders.

// ServiceDir is the folder of the agent's service definition:
// $XDG_CONFIG_HOME/systemd/user (else ~/.config/systemd/user) on Linux,
// ~/Library/LaunchAgents on macOS, the data folder (a copy of the
// task's XML) on Windows; "" when the home folder it needs is unknown.
func (l Layout) ServiceDir() string {
	switch l.os() {
	case "windows":
		return l.Data
	case "darwin":
		if l.Home == "" {
			return ""
		}
		return l.join(l.Home, "Library", "LaunchAgents")
	}
	cfg := l.configHome
	if cfg == "" {
		if l.Home == "" {
			return ""
		}
		cfg = l.join(l.Home, ".config")
	}
	return l.join(cfg, "systemd", "user")
}

// PlaceholderLocks is the Linux sandbox's folder of placeholder locks
// for the user uid, the same for every run of that uid whatever $HOME
// says: /run/metnos-agent/placeholders for root,
// $XDG_RUNTIME_DIR/metnos-agent/placeholders when that is absolute,
// else <tempDir>/metnos-placeholders-<uid>. It is "" on macOS and
// Windows, which have no placeholders.
func (l Layout) PlaceholderLocks(uid int, tempDir string) string {
	switch {
	case l.os() == "windows" || l.os() == "darwin":
		return ""
	case uid == 0:
		return "/run/metnos-agent/placeholders"
	case l.runtimeDir != "":
		return l.join(l.runtimeDir, "metnos-agent", "placeholders")
	}
	return l.join(tempDir, fmt.Sprintf("metnos-placeholders-%d", uid))
}
