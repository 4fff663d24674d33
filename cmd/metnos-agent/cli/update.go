package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/metnos/agent/client"
	"github.com/metnos/agent/internal/lockfile"
	"github.com/metnos/agent/internal/term"
	"github.com/metnos/agent/pairing"
	"github.com/metnos/agent/update"
)

func runUpdate(std stdio, args []string) int {
	fs := newFlagSet("update", std, "Update this agent from the paired server now, as `run` does when the server announces a new version: the build the server signed for this device's target, if it is newer than the one last applied. With --check, only say what it would do.")
	check := fs.Bool("check", false, "only say what the server offers and whether it would be applied")
	tf := addTailnetFlags(fs)
	if code, stop := parseFlags(fs, args); stop {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(std.err, "update", "update takes no arguments, only flags (got %q)", term.Sanitize(fs.Arg(0)))
	}
	if err := tf.check(); err != nil {
		return usageError(std.err, "update", "%v", err)
	}
	e, err := std.environment()
	if err != nil {
		return fail(std, err)
	}
	if err := pairing.CheckPaired(e.lay); err != nil {
		return fail(std, err)
	}
	if !*check {
		// The lock `run` holds: no agent starts during the swap, and a
		// running one is not replaced under its feet.
		lock, err := lockfile.Lock(e.lay.Lock())
		if errors.Is(err, lockfile.ErrLocked) {
			fmt.Fprintf(std.err, "metnos-agent: an agent is running (%v): it updates itself when the server announces a new version. To update now, stop it first (`systemctl --user stop metnos-agent`, or Ctrl-C in its terminal), run update, then start it again\n", err)
			return exitLocked
		}
		if err != nil {
			return fail(std, err)
		}
		defer lock.Release()
	}
	if version() == "dev" {
		// newUpdater has no updater for it, even by hand.
		return fail(std, errors.New("this is a development build (version dev), which has no release to be replaced by: install a release of metnos-agent for it to update from the server"))
	}
	exe, err := update.Executable()
	if err != nil {
		return fail(std, err)
	}
	files := update.FilesFor(exe)
	log := warnLogger(std)
	ctx := context.Background()
	c, node, err := connect(ctx, e, connectOptions{tailnet: tf}, log)
	if err != nil {
		return fail(std, err)
	}
	if node != nil {
		defer node.Close()
	}
	// METNOS_UPDATE=off turns off the run loop's updates, not this
	// command's.
	e.cfg.UpdateOff = false
	u, err := newUpdater(e, c, files, false, log)
	if err != nil {
		return fail(std, err)
	}
	st, _ := update.LoadState(e.lay.UpdateState())
	applied := st.Applied
	if applied == "" {
		applied = "none yet"
	}
	fmt.Fprintf(std.out, "this build:        %s (target %s), %s\n", version(), u.Target(), term.Sanitize(exe))
	fmt.Fprintf(std.out, "last applied:      %s\n", term.Sanitize(applied))
	if s := st.Summary(); s != "" {
		fmt.Fprintf(std.out, "update state:      %s\n", term.Sanitize(s))
	}
	dec, err := u.Check(ctx, true)
	if client.StatusOf(err) == http.StatusNotFound {
		fmt.Fprintf(std.out, "the server offers: nothing for %s (%s)\n", u.Target(), term.Sanitize(err.Error()))
		return exitOK
	}
	if err != nil {
		return fail(std, err)
	}
	fmt.Fprintf(std.out, "the server offers: %s (sha256 %s)\n", term.Sanitize(dec.Descriptor.Version), dec.Descriptor.SHA256)
	if !dec.Apply {
		fmt.Fprintf(std.out, "up to date: %s\n", term.Sanitize(dec.Why))
		return exitOK
	}
	if *check {
		fmt.Fprintf(std.out, "an update is available: `metnos-agent update` applies it\n")
		return exitOK
	}
	err = u.Apply(ctx, dec.Descriptor)
	if !errors.Is(err, update.ErrRestart) {
		if err == nil {
			err = errors.New("the update ended without putting the new build in place")
		}
		return fail(std, err)
	}
	fmt.Fprintf(std.out, "updated to %s: the new build is at %s, the previous one kept as %s until the new one's first successful poll (start the agent: `metnos-agent run`, or `systemctl --user start metnos-agent`)\n",
		term.Sanitize(dec.Descriptor.Version), term.Sanitize(files.Exe), term.Sanitize(files.Old))
	return exitOK
}
