//go:build linux

package hostile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// removablePolicy is delete_dirs' shape: fs:write, and arguments that
// name ~/work/album/2023 and ~/work/album/2023/05 themselves. Their
// parent ~/work/album holds a sibling the command must not touch.
func removablePolicy(t *testing.T, fx *fixture) policy.Policy {
	t.Helper()
	pol, err := policy.Derive(policy.DeriveInput{
		Manifest: manifestOf("", []policy.Capability{{Name: "fs:write"}}),
		Args:     map[string]any{"paths": []any{fx.Work + "/album/2023/05", fx.Work + "/album/2023"}},
		Host:     fx.Host,
	})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func removableSetup(t *testing.T, fx *fixture) {
	mkdir(t, fx.Work+"/album/2023/05", 0o755)
	mkdir(t, fx.Work+"/album/private", 0o755)
	mkdir(t, fx.Work+"/album/empty-sibling", 0o755)
	writeFile(t, fx.Work+"/album/private/diary.txt", fx.vars["DIARY"]+"\n", 0o644)
	writeFile(t, fx.Work+"/album/cover.jpg", "COVER\n", 0o644)
}

// TestRemovableDirs: a directory an argument names can be removed (it
// is not a mount point, docs/protocol.md §12.6), while its parent, mounted in
// its stead, gives nothing else away: its other entries stay unreadable,
// unlistable, unchangeable and in place.
func TestRemovableDirs(t *testing.T) {
	// Inside bwrap the private /tmp is writable as a whole, so the
	// parent of a removable directory is mounted only outside it.
	t.Setenv("TMPDIR", "/var/tmp")
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		fx.set("DIARY", token("METNOS-DIARY"))
		fx.set("ALBUM", fx.Work+"/album")

		fx.reset(t)
		removableSetup(t, fx)
		r := runInside(t, fx, m, removablePolicy(t, fx), shArgv(fx.expand(`set -e
rmdir {{ALBUM}}/2023/05
rmdir {{ALBUM}}/2023`)), sandbox.Limits{})
		if r.exit != 0 || exists(filepath.Join(fx.Work, "album/2023")) {
			t.Fatalf("the named directories could not be removed:\n%s", r)
		}

		gone := func(rel, what string) func(t *testing.T, fx *fixture, r result) []string {
			return func(t *testing.T, fx *fixture, r result) []string {
				if !exists(filepath.Join(fx.Work, "album", rel)) {
					return []string{what}
				}
				return nil
			}
		}
		for _, c := range []attackCase{
			{name: "read-sibling-file", sh: "cat {{ALBUM}}/private/diary.txt", secrets: []string{"{{DIARY}}"}},
			{name: "list-parent", sh: "ls {{ALBUM}} | grep -q private && echo {{DIARY}}", secrets: []string{"{{DIARY}}"}},
			{name: "move-sibling-into-grant", sh: "mv {{ALBUM}}/private {{ALBUM}}/2023/05/p && cat {{ALBUM}}/2023/05/p/diary.txt", secrets: []string{"{{DIARY}}"}},
			{name: "remove-sibling-file", sh: "rm {{ALBUM}}/cover.jpg", landed: gone("cover.jpg", "a sibling file was removed")},
			{name: "rename-sibling", sh: "mv {{ALBUM}}/private {{ALBUM}}/renamed", landed: gone("private", "a sibling was renamed")},
			{name: "create-in-parent", sh: "mkdir {{ALBUM}}/planted",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if exists(filepath.Join(fx.Work, "album/planted")) {
						return []string{"a directory was created in the parent"}
					}
					return nil
				}},
			{name: "chmod-sibling", sh: "chmod 666 {{ALBUM}}/cover.jpg",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if fi, err := os.Stat(filepath.Join(fx.Work, "album/cover.jpg")); err == nil && fi.Mode().Perm() == 0o666 {
						return []string{"a sibling's mode was changed"}
					}
					return nil
				}},
			{name: "touch-sibling", sh: "touch -d 2001-01-01 {{ALBUM}}/cover.jpg",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if fi, err := os.Stat(filepath.Join(fx.Work, "album/cover.jpg")); err == nil && fi.ModTime().Year() == 2001 {
						return []string{"a sibling's time was changed"}
					}
					return nil
				}},
			{name: "truncate-sibling", sh: "truncate -s 0 {{ALBUM}}/cover.jpg",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if fi, err := os.Stat(filepath.Join(fx.Work, "album/cover.jpg")); err == nil && fi.Size() == 0 {
						return []string{"a sibling was truncated"}
					}
					return nil
				}},
			{name: "overwrite-sibling", sh: "echo EVIL > {{ALBUM}}/cover.jpg",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if fileHas(filepath.Join(fx.Work, "album/cover.jpg"), "EVIL") {
						return []string{"a sibling file was rewritten"}
					}
					return nil
				}},
		} {
			c.policy = removablePolicy
			c.setup = removableSetup
			attack(t, fx, m, c)
		}
	})
}

// TestRenameWithinGrant: what an organiser does works in every mode:
// files move between directories beneath a write grant, by rename.
func TestRenameWithinGrant(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		pol := fx.profile(t, policy.ProfileSupervised, nil, []string{fx.Work}, false)
		r := runInside(t, fx, m, pol, pyArgv(fx.expand(`import os
os.makedirs("{{WORK}}/2024/07")
open("{{WORK}}/a.jpg", "w").write("A")
os.rename("{{WORK}}/a.jpg", "{{WORK}}/2024/07/a.jpg")
os.link("{{WORK}}/2024/07/a.jpg", "{{WORK}}/b.jpg")
os.rename("{{WORK}}/2024", "{{WORK}}/2025")`)), sandbox.Limits{})
		if r.exit != 0 || !fileHas(filepath.Join(fx.Work, "2025/07/a.jpg"), "A") || !fileHas(filepath.Join(fx.Work, "b.jpg"), "A") {
			t.Fatalf("moving files inside the write grant failed:\n%s", r)
		}
	})
}
