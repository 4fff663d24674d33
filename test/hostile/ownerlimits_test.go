//go:build linux

package hostile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// ownerLimitsSetup plants the owner's limits file where the layout puts
// it (with a token in a comment, for the reads), and a never folder
// with a secret in it.
func ownerLimitsSetup(t *testing.T, fx *fixture) {
	mkdir(t, filepath.Dir(fx.vars["LIMITS"]), 0o700)
	writeFile(t, fx.vars["LIMITS"], "# "+fx.vars["LIMITSTOKEN"]+"\nmode = \"readonly\"\nnever = [\"~/Private\"]\n", 0o600)
	mkdir(t, fx.vars["PRIVATE"], 0o700)
	writeFile(t, filepath.Join(fx.vars["PRIVATE"], "taxes.txt"), fx.vars["PRIVATETOKEN"]+"\n", 0o600)
}

// ownerLimitsPolicy is an executor run with the whole home writable (an
// argument named it), on the Host `run` builds from the owner's limits:
// the layout's folders and the file's never list.
func ownerLimitsPolicy(t *testing.T, fx *fixture) policy.Policy {
	t.Helper()
	lim, err := config.LoadLimits(fx.vars["LIMITS"], fx.Home, config.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := fx.Host
	h.Never = lim.Never
	pol, err := policy.Derive(policy.DeriveInput{
		Manifest: manifestOf("", []policy.Capability{{Name: "fs:write"}}),
		Args:     map[string]any{"path": fx.Home},
		Host:     h,
	})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// TestOwnerLimitsOutOfReach: an executor granted the whole home, for
// writing, can neither read, list, rewrite, replace nor remove the
// owner's limits file, nor read, list or change a folder the file says
// never: every one of these works outside the sandbox.
func TestOwnerLimitsOutOfReach(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		lay, err := layout.For("linux", func(k string) string { return map[string]string{"HOME": fx.Home}[k] }, fx.Home)
		if err != nil {
			t.Fatal(err)
		}
		fx.Host.AgentDataDirs = lay.AgentDirs()
		fx.set("LIMITS", lay.Limits())
		fx.set("CONFDIR", lay.ConfigDir())
		fx.set("LIMITSTOKEN", token("METNOS-LIMITS"))
		fx.set("PRIVATE", fx.path("Private"))
		fx.set("PRIVATETOKEN", token("METNOS-PRIVATE"))
		limitsIntact := func(what string) func(t *testing.T, fx *fixture, r result) []string {
			return func(t *testing.T, fx *fixture, r result) []string {
				if !fileHas(fx.vars["LIMITS"], fx.vars["LIMITSTOKEN"]) || !fileHas(fx.vars["LIMITS"], `mode = "readonly"`) {
					return []string{what}
				}
				return nil
			}
		}
		privateIntact := func(what string) func(t *testing.T, fx *fixture, r result) []string {
			return func(t *testing.T, fx *fixture, r result) []string {
				ents, _ := os.ReadDir(fx.vars["PRIVATE"])
				if len(ents) != 1 || !fileHas(filepath.Join(fx.vars["PRIVATE"], "taxes.txt"), fx.vars["PRIVATETOKEN"]) {
					return []string{what}
				}
				return nil
			}
		}
		printed := func(name, what string) func(t *testing.T, fx *fixture, r result) []string {
			return func(t *testing.T, fx *fixture, r result) []string {
				if strings.Contains(r.stdout, name) {
					return []string{what}
				}
				return nil
			}
		}

		// What the grant gives: the rest of the home, for writing.
		fx.reset(t)
		ownerLimitsSetup(t, fx)
		pol := ownerLimitsPolicy(t, fx)
		r := runInside(t, fx, m, pol, shArgv(fx.expand(`set -e
cat {{HOME}}/notes.txt
echo HOME-OK > {{HOME}}/work/made.txt`)), sandbox.Limits{})
		if r.exit != 0 || !fileHas(fx.path("work/made.txt"), "HOME-OK") || !strings.Contains(r.stdout, "NOTES") {
			t.Fatalf("the executor could not use the home it was granted:\n%s", r)
		}

		for _, c := range []attackCase{
			{name: "read-limits", sh: "cat {{LIMITS}}", secrets: []string{"{{LIMITSTOKEN}}"}},
			{name: "list-config-folder", sh: "ls -a {{CONFDIR}}", landed: printed("limits.toml", "the configuration folder was listed")},
			{name: "rewrite-limits", sh: `echo 'mode = "full"' > {{LIMITS}}`, landed: limitsIntact("limits.toml was rewritten")},
			{name: "append-to-limits", sh: `printf '\n[executors]\nallow = ["evil"]\n' >> {{LIMITS}}`,
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if fileHas(fx.vars["LIMITS"], "evil") {
						return []string{"limits.toml was appended to"}
					}
					return nil
				}},
			{name: "replace-limits", sh: `mv {{LIMITS}} {{HOME}}/old.toml && echo 'mode = "full"' > {{LIMITS}}`,
				landed: limitsIntact("limits.toml was replaced")},
			{name: "remove-limits", sh: "rm -f {{LIMITS}}", landed: limitsIntact("limits.toml was removed")},
			{name: "move-config-folder", sh: "mv {{CONFDIR}} {{HOME}}/moved", landed: limitsIntact("the configuration folder was moved")},
			{name: "read-never", sh: "cat {{PRIVATE}}/taxes.txt", secrets: []string{"{{PRIVATETOKEN}}"}},
			{name: "list-never", sh: "ls -a {{PRIVATE}}", landed: printed("taxes.txt", "the never folder was listed")},
			{name: "write-never", sh: "echo X > {{PRIVATE}}/planted.txt", landed: privateIntact("a file was planted in the never folder")},
			{name: "rewrite-never", sh: "echo X > {{PRIVATE}}/taxes.txt", landed: privateIntact("a file of the never folder was rewritten")},
			{name: "remove-never", sh: "rm -rf {{PRIVATE}}", landed: privateIntact("the never folder was removed")},
			{name: "move-never", sh: "mv {{PRIVATE}} {{HOME}}/elsewhere", landed: privateIntact("the never folder was moved")},
		} {
			c.policy = ownerLimitsPolicy
			c.setup = ownerLimitsSetup
			attack(t, fx, m, c)
		}
	})
}
