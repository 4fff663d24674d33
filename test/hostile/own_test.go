//go:build linux

package hostile

import (
	"path/filepath"
	"testing"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// ownPolicy is the shape of an executor run: the home writable (an
// argument named it), and the agent's own user-data folder opened
// through the mask on the agent's data directory.
func ownPolicy(t *testing.T, fx *fixture) policy.Policy {
	t.Helper()
	pol, err := policy.Derive(policy.DeriveInput{
		Manifest: manifestOf("", []policy.Capability{{Name: "fs:write"}}),
		Args:     map[string]any{"path": fx.Home},
		Extra: []policy.Grant{
			{Path: fx.path(".local/share/metnos/shimdata"), Access: policy.Write, Own: true, Why: "user data"},
			{Path: fx.path(".cache/metnos/shim"), Access: policy.Read, Own: true, Why: "shim"},
		},
		Host: fx.Host,
	})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func ownSetup(t *testing.T, fx *fixture) {
	mkdir(t, fx.path(".local/share/metnos/shimdata"), 0o700)
	mkdir(t, fx.path(".cache/metnos/shim"), 0o700)
	writeFile(t, fx.path(".local/share/metnos/key"), fx.vars["DATAKEY"]+"\n", 0o600)
	writeFile(t, fx.path(".local/share/metnos/spool.json"), "SPOOL\n", 0o600)
	writeFile(t, fx.path(".cache/metnos/shim/executor_helpers.py"), "SHIM-ORIGINAL\n", 0o644)
}

// TestOwnFoldersThroughMask: the agent's user-data folder and shim open
// through the mask on the agent's directories, and nothing else of
// them does: the key beside them stays unreadable, no file appears
// beside them, the shim cannot be rewritten, and the folder itself
// cannot be moved out of the way.
func TestOwnFoldersThroughMask(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		fx.set("DATAKEY", token("METNOS-DATAKEY"))
		fx.set("DATA", fx.path(".local/share/metnos"))
		fx.set("SHIM", fx.path(".cache/metnos/shim"))

		// What the executor must be able to do.
		fx.reset(t)
		ownSetup(t, fx)
		pol := ownPolicy(t, fx)
		r := runInside(t, fx, m, pol, shArgv(fx.expand(`set -e
mkdir -p {{DATA}}/shimdata/_history/t/blob
echo BLOB > {{DATA}}/shimdata/_history/t/blob/x.bin
cat {{SHIM}}/executor_helpers.py
echo HOME-OK > {{HOME}}/work/out.txt`)), sandbox.Limits{})
		if r.exit != 0 || !fileHas(filepath.Join(fx.path(".local/share/metnos/shimdata/_history/t/blob/x.bin")), "BLOB") ||
			!fileHas(filepath.Join(fx.Work, "out.txt"), "HOME-OK") {
			t.Fatalf("the executor could not use its own folders:\n%s", r)
		}

		for _, c := range []attackCase{
			{name: "read-key-beside-shimdata", sh: "cat {{DATA}}/key", secrets: []string{"{{DATAKEY}}"}},
			{name: "read-key-via-dotdot", sh: "cat {{DATA}}/shimdata/../key", secrets: []string{"{{DATAKEY}}"}},
			{name: "plant-beside-shimdata", sh: "echo X > {{DATA}}/planted",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if exists(fx.path(".local/share/metnos/planted")) {
						return []string{"a file was created in the agent's data directory"}
					}
					return nil
				}},
			{name: "rewrite-shim", sh: "echo EVIL > {{SHIM}}/executor_helpers.py",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if fileHas(fx.path(".cache/metnos/shim/executor_helpers.py"), "EVIL") {
						return []string{"the shim was rewritten"}
					}
					return nil
				}},
			{name: "move-shimdata-away", sh: "mv {{DATA}}/shimdata {{HOME}}/work/stolen",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if !exists(fx.path(".local/share/metnos/shimdata")) {
						return []string{"the user-data folder was moved"}
					}
					return nil
				}},
		} {
			c.policy = ownPolicy
			c.setup = ownSetup
			attack(t, fx, m, c)
		}
	})
}
