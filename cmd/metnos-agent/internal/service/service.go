// Package service installs, removes and inspects the agent as this
// user's service: a systemd user unit on Linux (with linger, so that it
// runs without a login session), a LaunchAgent on macOS, a logon task in
// Task Scheduler on Windows. It never installs a system-wide service and
// never needs an administrator, except to enable linger, which it asks
// for and otherwise explains.
//
// What it guarantees: the service files are pure functions of a
// [Config], and a value a file cannot carry safely (a relative
// executable, a control character, an environment variable's name that
// is not one, environment on Windows) is refused rather than written
// into a file that would run something else. Files are replaced whole
// and fsynced. [Manager.Install] takes over from the Rust client by
// stopping and disabling its service, never removing it nor the key and
// pairing they share. [Manager.Uninstall] keeps the data unless asked
// to purge, and a purge refuses while an agent holds the data
// directory's lock, while the Rust client is installed, and for a folder
// not named metnos or one holding the home folder. A dry run and
// [Manager.Status] change nothing (they run read-only queries only).
//
// What it does not: it does not watch the agent once the supervisor has
// accepted it, so Install succeeding does not mean the agent stays up.
// It drives the supervisors through their command line tools on PATH and
// reads their output, of which Task Scheduler's status words are only
// understood in English. Two installs run at once are not serialised.
// launchctl needs the user's macOS login session, not only ssh.
package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/metnos/agent/internal/atomicfile"
	"github.com/metnos/agent/internal/fspath"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/internal/lockfile"
)

// Runner runs a supervisor's command line tool (systemctl, loginctl,
// launchctl, schtasks) and returns its combined output. Tests replace
// [ExecRunner] with a fake that records the command lines.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) (string, error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run runs name with args; a failure names the command line and
// carries its output.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		if o := strings.TrimSpace(string(out)); o != "" {
			return string(out), fmt.Errorf("%s: %w: %s", cmdline(name, args), err, o)
		}
		return string(out), fmt.Errorf("%s: %w", cmdline(name, args), err)
	}
	return string(out), nil
}

func cmdline(name string, args []string) string {
	q := make([]string, 0, 1+len(args))
	for _, a := range append([]string{name}, args...) {
		if a == "" || strings.ContainsAny(a, " \t\"'\\$`") {
			a = strconv.Quote(a)
		}
		q = append(q, a)
	}
	return strings.Join(q, " ")
}

// ErrNotEnabled is returned by [Manager.Install] when the service's
// file is written but its supervisor could not be asked to run it (no
// systemd user manager, as in a container or CI); the message written
// to Out says what to run.
var ErrNotEnabled = errors.New("service: the service is written but not enabled")

// Manager installs, removes and inspects the agent's per-user service
// on one OS: a systemd user unit on Linux, a LaunchAgent on macOS, a
// logon task on Windows. Everything OS-specific is in its fields, so
// each OS's commands can be checked on any OS with a fake [Runner].
type Manager struct {
	// GOOS selects the supervisor: "linux" (and other Unix), "darwin"
	// or "windows".
	GOOS string
	// Home is the user's home directory (purge never removes a folder
	// that holds it; "": unknown).
	Home string
	// Dir is the folder the service file goes in, the layout's
	// ServiceDir: the systemd user unit folder (Linux), LaunchAgents
	// (macOS), the data folder (Windows, a copy of the task's XML).
	Dir string
	// User is the login name (loginctl) or DOMAIN\name (Windows); UID
	// is the numeric user id (launchctl's gui/UID domain).
	User string
	UID  int
	// DataDir and CacheDir are the agent's directories (shared with
	// the Rust client); uninstall --purge removes them.
	DataDir, CacheDir string
	// LingerDir is where logind records lingering users
	// (/var/lib/systemd/linger).
	LingerDir string
	// Runner runs the supervisor's tools.
	Runner Runner
	// Out receives one line per step, and the advice when a step
	// cannot be done.
	Out io.Writer
	// DryRun prints what would be written and run instead of doing it.
	DryRun bool
}

// Status is what [Manager.Status] finds.
type Status struct {
	// Supervisor names the mechanism: "systemd --user", "launchd",
	// "Task Scheduler".
	Supervisor string
	// File is the unit, plist or task XML the agent's service is
	// described by.
	File string
	// Installed, Enabled: the file is there (the task is registered),
	// and the supervisor starts it at login.
	Installed, Enabled bool
	// Running: an agent holds the data directory's lock, as process
	// PID when known; it may be one started by hand.
	Running bool
	PID     int
	// Supervised is the supervisor's own word on the service ("active",
	// "running", …), or why it could not be asked.
	Supervised string
	// Failed is, on Linux, systemd's word for why the unit is failed
	// ("start-limit-hit": a crash loop stopped at the start limit;
	// "exit-code", "signal"...), and Restarts how many times systemd
	// restarted it since it was last started by hand.
	Failed   string
	Restarts int
	// RustClient names the Rust client's unit or task when present,
	// and RustEnabled whether it would start.
	RustClient  string
	RustEnabled bool
	// Linger reports, on Linux, whether the user's services run
	// without a login session ("yes", "no", or "" when unknown).
	Linger string
}

func (s *Manager) say(format string, args ...any) { fmt.Fprintf(s.Out, format+"\n", args...) }

func (s *Manager) run(ctx context.Context, name string, args ...string) (string, error) {
	if s.DryRun {
		s.say("would run: %s", cmdline(name, args))
		return "", nil
	}
	return s.Runner.Run(ctx, name, args...)
}

// probe runs a read-only command even in a dry run.
func (s *Manager) probe(ctx context.Context, name string, args ...string) (string, error) {
	return s.Runner.Run(ctx, name, args...)
}

func (s *Manager) write(path string, b []byte, mode fs.FileMode) error {
	if s.DryRun {
		s.say("would write %s:\n%s", path, b)
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("service: creating the folder of %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	s.say("wrote %s", path)
	return nil
}

func (s *Manager) remove(path string) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if s.DryRun {
		s.say("would remove %s", path)
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("service: removing %s: %w", path, err)
	}
	s.say("removed %s", path)
	return nil
}

// lock is the lock a running agent holds: the layout's Lock in DataDir.
func (s *Manager) lock() string { return layout.Layout{Data: s.DataDir}.Lock() }

func exists(path string) bool { _, err := os.Lstat(path); return err == nil }

// File is where the agent's service is described: the systemd unit,
// the LaunchAgent plist, or the copy of the task's XML.
func (s *Manager) file() string {
	switch s.GOOS {
	case "darwin":
		return filepath.Join(s.Dir, launchdLabel+".plist")
	case "windows":
		return filepath.Join(s.Dir, taskName+".xml")
	}
	return filepath.Join(s.Dir, systemdUnitName)
}

// wantsLink is the symlink "systemctl --user enable" makes for unit.
func (s *Manager) wantsLink(unit string) string {
	return filepath.Join(s.Dir, "default.target.wants", unit)
}

// Render returns the service file for c on s.GOOS, as it is written.
func (s *Manager) render(c Config) ([]byte, error) {
	switch s.GOOS {
	case "darwin":
		return launchdPlist(c)
	case "windows":
		b, err := taskXML(c)
		if err != nil {
			return nil, err
		}
		return utf16LE(b), nil
	}
	return SystemdUnit(c)
}

// Install writes the agent's service file for c and has the
// supervisor start it now and at every login, first stopping and
// disabling the Rust client's service when there is one (the key and
// pairing in the shared data directory are kept). On Linux without a
// running systemd user manager it writes the unit, says what to run,
// and returns [ErrNotEnabled].
func (s *Manager) Install(ctx context.Context, c Config) error {
	b, err := s.render(c)
	if err != nil {
		return err
	}
	if s.DryRun && s.GOOS == "windows" {
		b, _ = taskXML(c) // show it readable
	}
	switch s.GOOS {
	case "darwin":
		return s.installLaunchd(ctx, b)
	case "windows":
		return s.installTask(ctx, b)
	}
	return s.installSystemd(ctx, b)
}

// systemdUp reports whether a systemd user manager answers, and why
// not when it does not.
func (s *Manager) systemdUp(ctx context.Context) (bool, string) {
	out, err := s.probe(ctx, "systemctl", "--user", "is-system-running")
	state := strings.TrimSpace(out)
	if i := strings.IndexByte(state, '\n'); i >= 0 {
		state = state[:i]
	}
	switch state {
	case "running", "degraded", "starting", "initializing", "maintenance":
		return true, ""
	case "":
		if err != nil {
			return false, err.Error()
		}
		return false, "systemctl --user is-system-running printed nothing"
	}
	return false, "systemctl --user is-system-running says " + strconv.Quote(state)
}

func (s *Manager) installSystemd(ctx context.Context, unit []byte) error {
	path := s.file()
	rust := filepath.Join(s.Dir, rustSystemdUnitName)
	if err := s.write(path, unit, 0o644); err != nil {
		return err
	}
	up, why := s.systemdUp(ctx)
	if !up {
		s.say("The systemd user manager is not running here (%s),", why)
		if s.DryRun {
			s.say("so install would write %s but could NOT enable or start it.", systemdUnitName)
			return nil
		}
		s.say("so %s is written but NOT enabled or started.", systemdUnitName)
		if exists(rust) {
			s.say("The Rust client's unit %s is here too; it was not stopped.", rust)
		}
		s.say("To start the agent, run in your login session:")
		if exists(rust) {
			s.say("\tsystemctl --user disable --now %s", rustSystemdUnitName)
		}
		s.say("\tsystemctl --user daemon-reload")
		s.say("\tsystemctl --user enable --now %s", systemdUnitName)
		s.say("\tloginctl enable-linger %s", s.User)
		return ErrNotEnabled
	}
	if exists(rust) {
		s.say("taking over from the Rust client (%s); its key and pairing are kept", rust)
		if _, err := s.run(ctx, "systemctl", "--user", "disable", "--now", rustSystemdUnitName); err != nil {
			return fmt.Errorf("service: stopping the Rust client, so that only one agent serves this device: %w; stop it yourself and install again", err)
		}
	}
	for _, args := range [][]string{
		{"--user", "daemon-reload"},
		{"--user", "enable", systemdUnitName},
		{"--user", "restart", systemdUnitName},
	} {
		if _, err := s.run(ctx, "systemctl", args...); err != nil {
			return fmt.Errorf("service: %w; see \"journalctl --user -u %s\"", err, systemdUnitName)
		}
	}
	s.say("enabled and started %s", systemdUnitName)
	s.linger(ctx)
	return nil
}

// linger asks logind to keep the user's services running without a
// login session; failing that (it may need an administrator), it says
// what that means and what to run.
func (s *Manager) linger(ctx context.Context) {
	if s.User == "" {
		s.say("linger: unknown user name; to keep the agent running after you log out, run: sudo loginctl enable-linger $USER")
		return
	}
	if s.LingerDir != "" && exists(filepath.Join(s.LingerDir, s.User)) {
		s.say("linger is already enabled for %s: the agent runs without a login session", s.User)
		return
	}
	if _, err := s.run(ctx, "loginctl", "enable-linger", s.User); err != nil {
		s.say("could not enable linger (%v):", err)
		s.say("the agent runs only while %s is logged in; to keep it running, run: sudo loginctl enable-linger %s", s.User, s.User)
		return
	}
	if !s.DryRun {
		s.say("enabled linger for %s: the agent runs without a login session", s.User)
	}
}

func (s *Manager) launchdTarget() string { return fmt.Sprintf("gui/%d/%s", s.UID, launchdLabel) }

func (s *Manager) installLaunchd(ctx context.Context, plist []byte) error {
	path := s.file()
	if err := s.write(path, plist, 0o644); err != nil {
		return err
	}
	// Unload a previous version first; an error means none was loaded.
	s.run(ctx, "launchctl", "bootout", s.launchdTarget())
	if _, err := s.run(ctx, "launchctl", "enable", s.launchdTarget()); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	// bootout returns before launchd lets go of the label; bootstrap
	// fails meanwhile ("5: Input/output error"), so it is retried for a
	// while (reported to take up to ~5 s).
	var err error
	for wait := 0; wait < 15; wait++ {
		if _, err = s.run(ctx, "launchctl", "bootstrap", fmt.Sprintf("gui/%d", s.UID), path); err == nil || s.DryRun {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return fmt.Errorf("service: loading %s: %w; launchctl needs your macOS login session (not only ssh)", path, err)
	}
	s.say("loaded %s: it runs now and at every login", launchdLabel)
	return nil
}

// taskExists reports whether schtasks lists the task name, and whether
// it is enabled. Only a row naming the task counts: a query that
// succeeds without one (Wine's schtasks, which has no /Query, prints
// nothing and exits 0) does not show the task is there.
func (s *Manager) taskExists(ctx context.Context, name string) (exists, enabled bool) {
	out, err := s.probe(ctx, "schtasks", "/Query", "/TN", name, "/FO", "CSV", "/NH")
	if err != nil {
		return false, false
	}
	// A row as "\MetnosAgent","N/A","Disabled". Task names are not
	// case-sensitive; the status words are in the system's language,
	// and only the English one is known.
	row := strings.ToLower(`"\` + name + `",`)
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(strings.ToLower(l), row) {
			return true, !strings.Contains(l, `"Disabled"`)
		}
	}
	return false, false
}

func (s *Manager) installTask(ctx context.Context, xml []byte) error {
	path := s.file()
	if err := s.write(path, xml, 0o644); err != nil {
		return err
	}
	if ok, _ := s.taskExists(ctx, rustTaskName); ok {
		s.say("taking over from the Rust client (task %s); its key and pairing are kept", rustTaskName)
		s.run(ctx, "schtasks", "/End", "/TN", rustTaskName) // an error: it was not running
		if _, err := s.run(ctx, "schtasks", "/Change", "/TN", rustTaskName, "/DISABLE"); err != nil {
			return fmt.Errorf("service: disabling the Rust client's task, so that only one agent serves this device: %w", err)
		}
	}
	if _, err := s.run(ctx, "schtasks", "/Create", "/TN", taskName, "/XML", path, "/F"); err != nil {
		return fmt.Errorf("service: registering the task %s from %s: %w", taskName, path, err)
	}
	if _, err := s.run(ctx, "schtasks", "/Run", "/TN", taskName); err != nil {
		return fmt.Errorf("service: starting the task %s: %w", taskName, err)
	}
	s.say("registered and started the task %s: it runs at every logon", taskName)
	return nil
}

// UninstallOptions says what [Manager.Uninstall] does beyond removing
// the agent's service.
type UninstallOptions struct {
	// Purge removes the data and cache directories too (key, pairing,
	// spool, history, caches).
	Purge bool
	// RestoreRust enables and starts the Rust client's service again
	// (the one [Manager.Install] disabled), giving the device back to it
	// with the key and pairing they share.
	RestoreRust bool
}

// Uninstall stops the agent's service and removes its file. The key,
// pairing and caches stay unless o.Purge, which then removes the data
// and cache directories, refusing while an agent still runs or the Rust
// client (which shares them) is installed. The Rust client's own
// service is left as it is (disabled, after an install took over from
// it) unless o.RestoreRust, which starts it again; without it, Uninstall
// says how.
func (s *Manager) Uninstall(ctx context.Context, o UninstallOptions) error {
	if o.Purge && o.RestoreRust {
		return errors.New("service: --purge removes the key and pairing the Rust client would use: give the device back to it without --purge")
	}
	path := s.file()
	switch s.GOOS {
	case "darwin":
		if exists(path) {
			s.run(ctx, "launchctl", "bootout", s.launchdTarget()) // an error: not loaded
		}
		if err := s.remove(path); err != nil {
			return err
		}
	case "windows":
		if ok, _ := s.taskExists(ctx, taskName); ok {
			s.run(ctx, "schtasks", "/End", "/TN", taskName)
			if _, err := s.run(ctx, "schtasks", "/Delete", "/TN", taskName, "/F"); err != nil {
				return fmt.Errorf("service: deleting the task %s: %w", taskName, err)
			}
		}
		if err := s.remove(path); err != nil {
			return err
		}
	default:
		up, why := s.systemdUp(ctx)
		if up && exists(path) {
			if _, err := s.run(ctx, "systemctl", "--user", "disable", "--now", systemdUnitName); err != nil {
				return fmt.Errorf("service: %w", err)
			}
		}
		for _, p := range []string{s.wantsLink(systemdUnitName), path} {
			if err := s.remove(p); err != nil {
				return err
			}
		}
		if up {
			s.run(ctx, "systemctl", "--user", "daemon-reload")
		} else {
			s.say("The systemd user manager is not running here (%s): nothing was stopped.", why)
		}
	}
	if err := s.rustAfterUninstall(ctx, o.RestoreRust); err != nil {
		return err
	}
	if !o.Purge {
		s.say("kept the device key and pairing in %s (uninstall --purge removes them)", s.DataDir)
		return nil
	}
	return s.purge(ctx)
}

// rustAfterUninstall gives the device back to the Rust client when
// restore is set and its service is there, and otherwise says how.
func (s *Manager) rustAfterUninstall(ctx context.Context, restore bool) error {
	switch s.GOOS {
	case "darwin":
		if restore {
			return errors.New("service: the Rust client has no macOS service to give the device back to")
		}
		return nil
	case "windows":
		ok, enabled := s.taskExists(ctx, rustTaskName)
		switch {
		case !ok && restore:
			return fmt.Errorf("service: the Rust client's task %s is not registered: install the Rust client to give the device back to it", rustTaskName)
		case !ok:
			return nil
		case !restore:
			if !enabled {
				s.say("the Rust client's task %s is still registered, disabled: to give the device back to it, run: schtasks /Change /TN %s /ENABLE, then schtasks /Run /TN %s (or uninstall --restore-rust-client)", rustTaskName, rustTaskName, rustTaskName)
			}
			return nil
		}
		if _, err := s.run(ctx, "schtasks", "/Change", "/TN", rustTaskName, "/ENABLE"); err != nil {
			return fmt.Errorf("service: enabling the Rust client's task %s: %w", rustTaskName, err)
		}
		if _, err := s.run(ctx, "schtasks", "/Run", "/TN", rustTaskName); err != nil {
			return fmt.Errorf("service: starting the Rust client's task %s: %w", rustTaskName, err)
		}
		s.say("gave the device back to the Rust client: its task %s is enabled and started", rustTaskName)
		return nil
	}
	rust := filepath.Join(s.Dir, rustSystemdUnitName)
	switch {
	case !exists(rust) && restore:
		return fmt.Errorf("service: the Rust client's unit %s is not there: install the Rust client to give the device back to it", rust)
	case !exists(rust):
		return nil
	case !restore:
		if !exists(s.wantsLink(rustSystemdUnitName)) {
			s.say("the Rust client's unit %s is still installed, disabled: to give the device back to it, run: systemctl --user enable --now %s (or uninstall --restore-rust-client)", rust, rustSystemdUnitName)
		}
		return nil
	}
	if up, why := s.systemdUp(ctx); !up {
		return fmt.Errorf("service: cannot start the Rust client's unit: the systemd user manager is not running here (%s); run in your login session: systemctl --user enable --now %s", why, rustSystemdUnitName)
	}
	if _, err := s.run(ctx, "systemctl", "--user", "enable", "--now", rustSystemdUnitName); err != nil {
		return fmt.Errorf("service: giving the device back to the Rust client: %w", err)
	}
	s.say("gave the device back to the Rust client: %s is enabled and started, with the same key and pairing", rustSystemdUnitName)
	return nil
}

func (s *Manager) purge(ctx context.Context) error {
	st, err := s.Status(ctx)
	if err != nil {
		return err
	}
	if st.RustClient != "" {
		return fmt.Errorf("service: not purging: the Rust client (%s) is installed and uses the same key and pairing in %s; uninstall it first", st.RustClient, s.DataDir)
	}
	if st.Running && !s.DryRun {
		return fmt.Errorf("service: not purging: an agent (process %d) still holds %s; stop it and run uninstall --purge again", st.PID, s.lock())
	}
	for _, d := range []string{s.DataDir, s.CacheDir} {
		if d == "" || !exists(d) {
			continue
		}
		if err := purgeable(d, s.Home); err != nil {
			return err
		}
		if s.DryRun {
			s.say("would remove %s and everything in it", d)
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("service: removing %s: %w", d, err)
		}
		s.say("removed %s (the device key, pairing and caches)", d)
	}
	return nil
}

// Status reports what is installed, enabled and running; it changes
// nothing.
func (s *Manager) Status(ctx context.Context) (Status, error) {
	st := Status{File: s.file()}
	pid, held, err := lockfile.LockHolder(s.lock())
	if err != nil {
		return st, err
	}
	st.Running, st.PID = held, pid
	switch s.GOOS {
	case "darwin":
		st.Supervisor = "launchd"
		st.Installed = exists(st.File)
		if out, err := s.probe(ctx, "launchctl", "print", s.launchdTarget()); err == nil {
			st.Enabled = true
			st.Supervised = "loaded"
			for _, l := range strings.Split(out, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "state = "); ok {
					st.Supervised = v
					break
				}
			}
		} else {
			st.Supervised = "not loaded"
		}
	case "windows":
		st.Supervisor = "Task Scheduler"
		st.Installed, st.Enabled = s.taskExists(ctx, taskName)
		if ok, en := s.taskExists(ctx, rustTaskName); ok {
			st.RustClient, st.RustEnabled = "task "+rustTaskName, en
		}
	default:
		st.Supervisor = "systemd --user"
		st.Installed = exists(st.File)
		st.Enabled = exists(s.wantsLink(systemdUnitName))
		if up, why := s.systemdUp(ctx); up {
			out, _ := s.probe(ctx, "systemctl", "--user", "is-active", systemdUnitName)
			st.Supervised = strings.TrimSpace(out)
			out, _ = s.probe(ctx, "systemctl", "--user", "show", "--property=Result,NRestarts,StartLimitBurst", systemdUnitName)
			burst := 0
			for _, l := range strings.Split(out, "\n") {
				k, v, _ := strings.Cut(strings.TrimSpace(l), "=")
				switch k {
				case "Result":
					if v != "success" && st.Supervised == "failed" {
						st.Failed = v
					}
				case "NRestarts":
					st.Restarts, _ = strconv.Atoi(v)
				case "StartLimitBurst":
					burst, _ = strconv.Atoi(v)
				}
			}
			// systemd 252 keeps the last run's result ("exit-code") when
			// it refuses a restart for the start limit: a failed unit
			// restarted burst-1 times in a row has hit it.
			if st.Failed != "" && burst > 0 && st.Restarts >= burst-1 {
				st.Failed = "start-limit-hit"
			}
		} else {
			st.Supervised = "unknown: " + why
		}
		if rust := filepath.Join(s.Dir, rustSystemdUnitName); exists(rust) {
			st.RustClient, st.RustEnabled = rust, exists(s.wantsLink(rustSystemdUnitName))
		}
		if s.LingerDir != "" && s.User != "" {
			st.Linger = "no"
			if exists(filepath.Join(s.LingerDir, s.User)) {
				st.Linger = "yes"
			}
		}
	}
	return st, nil
}

// purgeable refuses to remove a folder that is not the agent's own: the
// data and cache folders may come from METNOS_DATA_DIR and
// METNOS_CACHE_DIR, and a mistyped one must not cost the user a home or
// a shared cache. The agent's folders are named "metnos" (any case);
// none holds home, the user's home folder ("": unknown).
func purgeable(d, home string) error {
	clean := filepath.Clean(d)
	if !strings.EqualFold(filepath.Base(clean), "metnos") {
		return fmt.Errorf("service: not purging %s: it is not a folder named metnos, so it may hold more than the agent's files (remove what you want of it by hand)", d)
	}
	if home != "" && fspath.Within(filepath.Clean(home), clean) {
		return fmt.Errorf("service: not purging %s: it holds your home folder", d)
	}
	return nil
}
