package service

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"

	"github.com/metnos/agent/update"
)

// Names of the agent's service, and of the Rust client's (docs/protocol.md
// §13.4), which [Manager.Install] takes over from.
const (
	// systemdUnitName is the agent's systemd user unit.
	systemdUnitName = "metnos-agent.service"
	// rustSystemdUnitName is the Rust client's systemd user unit.
	rustSystemdUnitName = "metnos-client.service"
	// launchdLabel is the agent's LaunchAgent label (the Rust client
	// has no macOS supervisor).
	launchdLabel = "org.metnos.agent"
	// taskName is the agent's Task Scheduler task.
	taskName = "MetnosAgent"
	// rustTaskName is the Rust client's Task Scheduler task.
	rustTaskName = "MetnosClient"
)

// restartSec is how long a supervisor waits before restarting the
// agent, in seconds: the Rust client's systemd unit uses 5.
const restartSec = 5

// The systemd unit's start limit: startLimitBurst starts within
// startLimitSec seconds, and the unit is left failed.
const (
	startLimitSec   = 120
	startLimitBurst = 6
)

// stopTimeoutSec is how long a supervisor gives the agent to stop
// before it kills it (systemd's TimeoutStopSec), and the agent's stop
// budget (METNOS_STOP_TIMEOUT_S).
const stopTimeoutSec = 20

// EnvVar is one environment variable given to the service.
type EnvVar struct{ Key, Value string }

// Config describes the agent's service for one user; the files a
// [Manager] writes for it (the systemd unit, [SystemdUnit]; the
// LaunchAgent plist; the task XML) are pure functions of it.
type Config struct {
	// Exe is the absolute path of the agent's binary, in the target
	// OS's syntax.
	Exe string
	// Args follow Exe, normally just "run".
	Args []string
	// Env is extra environment for the agent, in order (systemd and
	// launchd only: a scheduled task has no environment of its own).
	Env []EnvVar
	// DataDir is the agent's data directory: launchd's log file and the
	// task's working directory are there.
	DataDir string
	// User is DOMAIN\name, the account a Windows task runs as.
	User string
}

// launchdLogName is the file in the data directory that launchd sends
// the agent's stdout and stderr to. The agent's own log is client.log,
// rotated by the agent; this one catches what is printed before that
// log is open (a crash, "already running").
const launchdLogName = "launchd.log"

// check refuses values no supervisor file can carry safely.
func (c Config) check(absolute func(string) bool) error {
	if !absolute(c.Exe) {
		return fmt.Errorf("service: the agent's path %q is not absolute", c.Exe)
	}
	vals := append([]string{c.Exe, c.DataDir, c.User}, c.Args...)
	for _, e := range c.Env {
		if !validEnvKey(e.Key) {
			return fmt.Errorf("service: %q is not an environment variable name (letters, digits and _, not first a digit)", e.Key)
		}
		vals = append(vals, e.Value)
	}
	for _, v := range vals {
		for _, r := range v {
			if r == 0 || r == '\n' || r == '\r' || (unicode.IsControl(r) && r != '\t') {
				return fmt.Errorf("service: %q holds a control character, which a service file cannot carry", v)
			}
		}
	}
	return nil
}

func validEnvKey(k string) bool {
	if k == "" || ('0' <= k[0] && k[0] <= '9') {
		return false
	}
	for _, r := range k {
		if !(r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return false
		}
	}
	return true
}

func unixAbs(p string) bool { return strings.HasPrefix(p, "/") }

func winAbs(p string) bool {
	if strings.HasPrefix(p, `\\`) {
		return len(p) > 2
	}
	return len(p) >= 3 && p[1] == ':' && (p[2] == '\\' || p[2] == '/') &&
		'a' <= p[0]|0x20 && p[0]|0x20 <= 'z'
}

// SystemdUnit renders the agent's systemd user unit.
//
//   - Restart=always: the agent exits 0 to be restarted after a
//     self-update, and a crash or kill is followed by a start after
//     restartSec. The start limit (startLimitBurst starts within
//     startLimitSec) ends a crash loop with the unit failed and
//     "start-limit-hit" in its status, instead of restarting a build that
//     cannot start forever; a rolled-back update takes 4 starts, within
//     it. The service runs `run --wait`, so a start that finds another
//     agent running (a `metnos-agent run` by hand, a Rust client) waits
//     for it instead of using up starts.
//   - KillMode=mixed: a stop sends SIGTERM to the agent alone, which
//     cuts the executors' runs itself and delivers their results within
//     its stop budget, METNOS_STOP_TIMEOUT_S, set to TimeoutStopSec; what
//     is left of the unit's processes when the time is up gets SIGKILL.
//   - The hardening directives are those that leave the executors their
//     sandbox: user namespaces (bwrap), Landlock and seccomp all work
//     under no_new_privs, which the executors get anyway. Directives that
//     need a mount or user namespace of the unit's own (ProtectSystem,
//     ProtectHome, PrivateTmp, PrivateUsers...) or that filter system
//     calls by list (SystemCallFilter, RestrictNamespaces) would take
//     bwrap's namespaces or Landlock's calls from the executors, and are
//     not used.
func SystemdUnit(c Config) ([]byte, error) {
	if err := c.check(unixAbs); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("# Written by \"metnos-agent install\"; \"metnos-agent uninstall\" removes it.\n")
	b.WriteString("[Unit]\nDescription=Metnos device agent\nDocumentation=https://github.com/metnos/agent\n")
	fmt.Fprintf(&b, "# A crash loop ends here: %d starts within %d s leave the unit failed\n", startLimitBurst, startLimitSec)
	b.WriteString("# (\"start-limit-hit\"); `systemctl --user reset-failed metnos-agent` and\n# `systemctl --user start metnos-agent` try again.\n")
	fmt.Fprintf(&b, "StartLimitIntervalSec=%d\nStartLimitBurst=%d\n\n", startLimitSec, startLimitBurst)
	b.WriteString("[Service]\nType=simple\n")
	if strings.ContainsAny(c.Exe, "\"\\") {
		return nil, fmt.Errorf("service: the agent's path %q holds a quote or a backslash, which systemd refuses in an executable name: move the binary", c.Exe)
	}
	// In the executable name systemd undoes %% but not $$.
	b.WriteString("ExecStart=" + systemdQuote(c.Exe, false))
	for _, a := range c.Args {
		b.WriteString(" " + systemdQuote(a, true))
	}
	b.WriteString("\n")
	b.WriteString("# Exit 0 after a self-update is restarted too, as is a crash.\n")
	fmt.Fprintf(&b, "Restart=always\nRestartSec=%d\n", restartSec)
	b.WriteString("# A stop sends SIGTERM to the agent alone: it cuts the executors' runs at\n")
	b.WriteString("# half its stop budget, delivers their results and exits within it. Keep\n")
	b.WriteString("# METNOS_STOP_TIMEOUT_S equal to TimeoutStopSec.\n")
	fmt.Fprintf(&b, "KillMode=mixed\nTimeoutStopSec=%d\nEnvironment=METNOS_STOP_TIMEOUT_S=%d\n", stopTimeoutSec, stopTimeoutSec)
	b.WriteString("# Hardening that leaves the executors bwrap, Landlock and seccomp.\n")
	b.WriteString("NoNewPrivileges=yes\nLockPersonality=yes\nRestrictRealtime=yes\nRestrictSUIDSGID=yes\nSystemCallArchitectures=native\n")
	// Last, so that the owner's --env wins over the unit's own.
	for _, e := range c.Env {
		b.WriteString("Environment=" + systemdQuote(e.Key+"="+e.Value, false) + "\n")
	}
	b.WriteString("\n")
	b.WriteString("[Install]\nWantedBy=default.target\n")
	return b.Bytes(), nil
}

// systemdQuote quotes s as one word of a unit file setting: always in
// double quotes with C escapes for \ and ", % doubled (specifiers) and,
// in a command line, $ doubled (variable expansion).
func systemdQuote(s string, cmdline bool) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == '"':
			b.WriteString(`\"`)
		case r == '%':
			b.WriteString("%%")
		case r == '$' && cmdline:
			b.WriteString("$$")
		case r == '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// xmlText escapes s for XML character data and attribute values.
func xmlText(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// launchdPlist renders the agent's LaunchAgent: started at load and
// kept alive (launchd throttles restarts to one every restartSec),
// stdout and stderr appended to [launchdLogName] in the data directory.
func launchdPlist(c Config) ([]byte, error) {
	if err := c.check(unixAbs); err != nil {
		return nil, err
	}
	if !unixAbs(c.DataDir) {
		return nil, fmt.Errorf("service: the data directory %q is not absolute", c.DataDir)
	}
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- Written by "metnos-agent install"; "metnos-agent uninstall" removes it. -->
<plist version="1.0">
<dict>
`)
	str := func(s string) string { return "<string>" + xmlText(s) + "</string>" }
	fmt.Fprintf(&b, "\t<key>Label</key>\n\t%s\n", str(launchdLabel))
	b.WriteString("\t<key>ProgramArguments</key>\n\t<array>\n")
	for _, a := range append([]string{c.Exe}, c.Args...) {
		fmt.Fprintf(&b, "\t\t%s\n", str(a))
	}
	b.WriteString("\t</array>\n")
	// The stop budget matches ExitTimeOut (launchd's SIGKILL after
	// SIGTERM), unless the owner's --env sets it.
	env := []EnvVar{{"METNOS_STOP_TIMEOUT_S", fmt.Sprint(stopTimeoutSec)}}
	for _, e := range c.Env {
		if e.Key == env[0].Key {
			env = env[:0]
		}
	}
	b.WriteString("\t<key>EnvironmentVariables</key>\n\t<dict>\n")
	for _, e := range append(env, c.Env...) {
		fmt.Fprintf(&b, "\t\t<key>%s</key>\n\t\t%s\n", xmlText(e.Key), str(e.Value))
	}
	b.WriteString("\t</dict>\n")
	log := strings.TrimRight(c.DataDir, "/") + "/" + launchdLogName
	fmt.Fprintf(&b, "\t<key>WorkingDirectory</key>\n\t%s\n", str(c.DataDir))
	b.WriteString("\t<key>RunAtLoad</key>\n\t<true/>\n\t<key>KeepAlive</key>\n\t<true/>\n")
	fmt.Fprintf(&b, "\t<key>ThrottleInterval</key>\n\t<integer>%d</integer>\n", restartSec)
	fmt.Fprintf(&b, "\t<key>ExitTimeOut</key>\n\t<integer>%d</integer>\n", stopTimeoutSec)
	fmt.Fprintf(&b, "\t<key>StandardOutPath</key>\n\t%s\n\t<key>StandardErrorPath</key>\n\t%s\n", str(log), str(log))
	b.WriteString("</dict>\n</plist>\n")
	return b.Bytes(), nil
}

// errTaskEnv is returned by [taskXML] for a config with environment
// variables, which a scheduled task cannot carry.
var errTaskEnv = errors.New("service: a scheduled task cannot carry environment variables; set them for your user instead (setx NAME VALUE) and install again")

// taskXML renders the agent's Task Scheduler task (schema 1.2) as UTF-8
// text; [utf16LE] encodes it for "schtasks /Create /XML", which wants
// UTF-16. The task runs as the user, in their session, with least
// privilege (executors work on the user's own files, so not a service):
// started at logon, and again every minute while it is not running
// (MultipleInstancesPolicy IgnoreNew), which restarts it after a crash,
// an update (exit 0) or another instance's exit (exit 3); no time limit,
// not stopped on battery.
func taskXML(c Config) ([]byte, error) {
	if err := c.check(winAbs); err != nil {
		return nil, err
	}
	if len(c.Env) > 0 {
		return nil, errTaskEnv
	}
	if c.User == "" {
		return nil, errors.New("service: the task needs the user it runs as (DOMAIN\\name)")
	}
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = windowsArg(a)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-16"?>
<!-- Written by "metnos-agent install"; "metnos-agent uninstall" removes it. -->
<Task version="1.2" xmlns="http://schemas.microsoft.com/windows/2004/02/mit/task">
  <RegistrationInfo>
    <Description>Metnos device agent</Description>
    <URI>\%s</URI>
  </RegistrationInfo>
  <Triggers>
    <LogonTrigger>
      <Enabled>true</Enabled>
      <UserId>%s</UserId>
      <Repetition>
        <Interval>PT1M</Interval>
        <StopAtDurationEnd>false</StopAtDurationEnd>
      </Repetition>
    </LogonTrigger>
  </Triggers>
  <Principals>
    <Principal id="Author">
      <UserId>%s</UserId>
      <LogonType>InteractiveToken</LogonType>
      <RunLevel>LeastPrivilege</RunLevel>
    </Principal>
  </Principals>
  <Settings>
    <MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>
    <DisallowStartIfOnBatteries>false</DisallowStartIfOnBatteries>
    <StopIfGoingOnBatteries>false</StopIfGoingOnBatteries>
    <AllowHardTerminate>true</AllowHardTerminate>
    <StartWhenAvailable>true</StartWhenAvailable>
    <RunOnlyIfNetworkAvailable>false</RunOnlyIfNetworkAvailable>
    <IdleSettings>
      <StopOnIdleEnd>false</StopOnIdleEnd>
      <RestartOnIdle>false</RestartOnIdle>
    </IdleSettings>
    <AllowStartOnDemand>true</AllowStartOnDemand>
    <Enabled>true</Enabled>
    <Hidden>false</Hidden>
    <RunOnlyIfIdle>false</RunOnlyIfIdle>
    <WakeToRun>false</WakeToRun>
    <ExecutionTimeLimit>PT0S</ExecutionTimeLimit>
    <Priority>7</Priority>
    <RestartOnFailure>
      <Interval>PT1M</Interval>
      <Count>999</Count>
    </RestartOnFailure>
  </Settings>
  <Actions Context="Author">
    <Exec>
      <Command>%%SystemRoot%%\System32\cmd.exe</Command>
      <Arguments>%s</Arguments>
    </Exec>
    <Exec>
      <Command>%s</Command>
      <Arguments>%s</Arguments>
      <WorkingDirectory>%s</WorkingDirectory>
    </Exec>
  </Actions>
</Task>
`, xmlText(taskName), xmlText(c.User), xmlText(c.User), xmlText(restoreArgs(c.Exe)), xmlText(c.Exe), xmlText(strings.Join(args, " ")), xmlText(c.DataDir))
	return b.Bytes(), nil
}

// restoreArgs are the arguments of cmd.exe in the task's first action,
// which runs before the agent: it puts the previous build back when a
// self-update was cut short between its two renames (Windows can rename
// a running executable but not replace it, so for an instant only
// <name>.old.exe exists; see package update). It does nothing
// otherwise.
func restoreArgs(exe string) string {
	old := update.FilesFor(exe).Old
	return fmt.Sprintf(`/d /v:off /c if not exist "%s" if exist "%s" move /y "%s" "%s"`, exe, old, old, exe)
}

// windowsArg quotes one argument as CommandLineToArgvW reads it back.
func windowsArg(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"") {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	slashes := 0
	for _, r := range s {
		switch r {
		case '\\':
			slashes++
			continue
		case '"':
			b.WriteString(strings.Repeat(`\`, 2*slashes+1))
		default:
			b.WriteString(strings.Repeat(`\`, slashes))
		}
		slashes = 0
		b.WriteRune(r)
	}
	b.WriteString(strings.Repeat(`\`, 2*slashes))
	b.WriteByte('"')
	return b.String()
}

// utf16LE encodes UTF-8 text as UTF-16LE with a byte order mark, with
// CRLF line ends, as Task Scheduler's XML files are.
func utf16LE(text []byte) []byte {
	s := strings.ReplaceAll(string(text), "\r\n", "\n")
	s = strings.ReplaceAll(s, "\n", "\r\n")
	u := utf16.Encode([]rune(s))
	out := make([]byte, 2, 2+2*len(u))
	out[0], out[1] = 0xFF, 0xFE
	for _, c := range u {
		out = append(out, byte(c), byte(c>>8))
	}
	return out
}
