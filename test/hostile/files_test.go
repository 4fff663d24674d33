//go:build linux

package hostile

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// readPolicies are the policies under which the nucleus must stay
// unreadable. link marks those whose attack goes through host-planted
// symlinks in ~/work pointing at the secrets.
type readPolicy struct {
	name      string
	policy    policyFunc
	link      bool
	bwrapOnly bool
}

var readPolicies = []readPolicy{
	{name: "plain", policy: supervised(nil, nil)},
	{name: "home-read-grant", policy: supervised([]string{"{{HOME}}"}, nil)},
	{name: "home-write-grant", policy: supervised(nil, []string{"{{HOME}}"})},
	{name: "readonly-profile", policy: profileOnly(policy.ProfileReadonly)},
	{name: "full-profile", policy: func(t *testing.T, fx *fixture) policy.Policy {
		return fx.profile(t, policy.ProfileFull, nil, nil, true)
	}},
	// The one bwrap profile that shows the real /tmp, where the fixture lives.
	{name: "full-fs-no-net-profile", policy: profileOnly(policy.ProfileFullFSNoNet), bwrapOnly: true},
	{name: "symlink-in-read-grant", policy: supervised([]string{"{{WORK}}"}, nil), link: true},
	{name: "symlink-in-write-grant", policy: supervised(nil, []string{"{{WORK}}"}), link: true},
	{name: "symlink-in-home-write-grant", policy: supervised(nil, []string{"{{HOME}}"}), link: true},
}

// TestNucleusRead: no secret of the nucleus is readable, whatever the
// grant around it, directly or through a symlink the host planted.
func TestNucleusRead(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		for _, rp := range readPolicies {
			if rp.bwrapOnly && !m.bwrap {
				continue
			}
			c := attackCase{name: rp.name, policy: rp.policy}
			var script strings.Builder
			for i, s := range fx.Secrets {
				c.secrets = append(c.secrets, s.Token)
				target := filepath.Join(fx.Home, s.Rel)
				if rp.link {
					target = fmt.Sprintf("{{WORK}}/link%d", i)
				}
				fmt.Fprintf(&script, "cat %s\n", target)
			}
			if rp.link {
				// A link to a secret directory, too.
				script.WriteString("cat {{WORK}}/sshdir/id_rsa\n")
				c.setup = func(t *testing.T, fx *fixture) {
					for i, s := range fx.Secrets {
						symlink(t, filepath.Join(fx.Home, s.Rel), fmt.Sprintf("%s/link%d", fx.Work, i))
					}
					symlink(t, fx.path(".ssh"), fx.Work+"/sshdir")
				}
			}
			c.sh = script.String()
			attack(t, fx, m, c)
		}
	})
}

var shadowLine = regexp.MustCompile(`(?m)^[a-z_][a-z0-9_.-]*:[^:\n]*:`)

// TestShadowRead: /etc/shadow is masked. Outside it is readable only by
// root, so the outside half is checked only as root.
func TestShadowRead(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		var outsideFails string
		if !isRoot() {
			outsideFails = fmt.Sprintf("uid %d cannot read /etc/shadow on the host either", os.Getuid())
		}
		pols := []readPolicy{
			{name: "plain", policy: supervised(nil, nil)},
			{name: "readonly-profile", policy: profileOnly(policy.ProfileReadonly)},
			{name: "full-profile", policy: func(t *testing.T, fx *fixture) policy.Policy {
				return fx.profile(t, policy.ProfileFull, nil, nil, true)
			}},
			{name: "full-fs-no-net-profile", policy: profileOnly(policy.ProfileFullFSNoNet), bwrapOnly: true},
		}
		for _, rp := range pols {
			if rp.bwrapOnly && !m.bwrap {
				continue
			}
			attack(t, fx, m, attackCase{
				name:   rp.name,
				policy: rp.policy,
				sh:     "cat /etc/shadow /etc/gshadow",
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if shadowLine.MatchString(r.stdout) {
						return []string{"/etc/shadow entries printed"}
					}
					return nil
				},
				outsideFails: outsideFails,
			})
		}
	})
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// hostChanged reports how the host files the write attacks aim at
// changed.
func hostChanged(fx *fixture) []string {
	var ev []string
	for _, p := range []string{
		fx.Outside + "/new.txt", fx.Home + "/new.txt", fx.Docs + "/new.txt", fx.Root + "/new.txt",
	} {
		if exists(p) {
			ev = append(ev, "host file created: "+p)
		}
	}
	if fileHas(fx.Outside+"/target.txt", "PWNED") || !exists(fx.Outside+"/target.txt") {
		ev = append(ev, "host file outside every grant changed or removed: "+fx.Outside+"/target.txt")
	}
	if fileHas(fx.Docs+"/readme.txt", "PWNED") || !exists(fx.Docs+"/readme.txt") {
		ev = append(ev, "file in a read-only grant changed or removed: "+fx.Docs+"/readme.txt")
	}
	return ev
}

// TestWriteEscape: nothing outside the write grants changes.
func TestWriteEscape(t *testing.T) {
	hostWrote := func(t *testing.T, fx *fixture, r result) []string { return hostChanged(fx) }
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		for _, c := range []attackCase{
			{
				name:   "outside-grants",
				policy: supervised(nil, []string{"{{WORK}}"}),
				sh:     "echo PWNED > {{OUTSIDE}}/new.txt; echo PWNED >> {{OUTSIDE}}/target.txt; echo PWNED > {{HOME}}/new.txt; echo PWNED > {{ROOT}}/new.txt",
			},
			{
				name:   "outside-grants-readonly-profile",
				policy: profileOnly(policy.ProfileReadonly),
				sh:     "echo PWNED > {{OUTSIDE}}/new.txt; echo PWNED >> {{OUTSIDE}}/target.txt; rm -f {{OUTSIDE}}/target.txt",
			},
			{
				name:   "into-read-only-grant",
				policy: supervised([]string{"{{DOCS}}"}, []string{"{{WORK}}"}),
				sh:     "echo PWNED > {{DOCS}}/new.txt; echo PWNED >> {{DOCS}}/readme.txt; mv {{DOCS}}/readme.txt {{WORK}}/",
			},
			{
				name:   "into-read-only-grant-nested-in-write-grant",
				policy: supervised([]string{"{{DOCS}}"}, []string{"{{HOME}}"}),
				sh:     "echo PWNED > {{DOCS}}/new.txt; echo PWNED >> {{DOCS}}/readme.txt; mv {{DOCS}} {{HOME}}/docs2; mv {{DOCS}}/readme.txt {{HOME}}/",
			},
			{
				// Renames and links between directories are allowed
				// beneath a write grant (Landlock's refer right), but
				// never so that a file gains rights it did not have.
				name:   "hardlink-read-only-file-into-write-grant",
				policy: supervised([]string{"{{DOCS}}"}, []string{"{{WORK}}"}),
				sh:     "ln {{DOCS}}/readme.txt {{WORK}}/hl; echo PWNED >> {{WORK}}/hl",
			},
			{
				name:   "hardlink-read-only-file-nested-in-write-grant",
				policy: supervised([]string{"{{DOCS}}"}, []string{"{{HOME}}"}),
				sh:     "ln {{DOCS}}/readme.txt {{HOME}}/hl; echo PWNED >> {{HOME}}/hl; mkdir -p {{HOME}}/d; ln {{DOCS}}/readme.txt {{HOME}}/d/hl2; echo PWNED >> {{HOME}}/d/hl2",
			},
			{
				name:   "host-planted-symlink-to-outside-dir",
				policy: supervised(nil, []string{"{{WORK}}"}),
				setup:  func(t *testing.T, fx *fixture) { symlink(t, fx.Outside, fx.Work+"/link") },
				sh:     "echo PWNED > {{WORK}}/link/new.txt; echo PWNED >> {{WORK}}/link/target.txt",
			},
			{
				name:   "sandbox-planted-symlink-to-outside-file",
				policy: supervised(nil, []string{"{{WORK}}"}),
				sh:     "ln -s {{OUTSIDE}}/target.txt {{WORK}}/l2; echo PWNED >> {{WORK}}/l2; ln -s {{OUTSIDE}} {{WORK}}/l3; echo PWNED > {{WORK}}/l3/new.txt",
			},
		} {
			c.landed = hostWrote
			attack(t, fx, m, c)
		}

		// A set-user-ID or set-group-ID file made by the command: run by
		// a root agent, it would give root to any local user.
		attack(t, fx, m, attackCase{
			name:   "setuid-file-in-write-grant",
			policy: supervised(nil, []string{"{{WORK}}"}),
			sh:     "cp /bin/sh {{WORK}}/suid; chmod 4755 {{WORK}}/suid; chmod g+s {{WORK}}/suid; python3 -c 'import os; os.close(os.open(\"{{WORK}}/suid2\", os.O_CREAT|os.O_WRONLY, 0o6755))'",
			landed: func(t *testing.T, fx *fixture, r result) []string {
				var ev []string
				for _, f := range []string{"suid", "suid2"} {
					if fi, err := os.Stat(fx.Work + "/" + f); err == nil && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
						ev = append(ev, "a set-id file landed on the host: "+fx.Work+"/"+f+" "+fi.Mode().String())
					}
				}
				return ev
			},
		})

		// Write grants that the profile or the autonomy level demote to
		// read-only.
		workWritten := func(t *testing.T, fx *fixture, r result) []string {
			if exists(fx.Work + "/new.txt") {
				return []string{"wrote " + fx.Work + "/new.txt through a grant that must be read-only"}
			}
			return nil
		}
		attack(t, fx, m, attackCase{
			name: "write-grant-under-readonly-profile",
			policy: func(t *testing.T, fx *fixture) policy.Policy {
				return fx.profile(t, policy.ProfileReadonly, nil, []string{fx.Work}, false)
			},
			sh:     "echo PWNED > {{WORK}}/new.txt",
			landed: workWritten,
		})
		attack(t, fx, m, attackCase{
			name: "fs:write-under-readonly-autonomy",
			policy: func(t *testing.T, fx *fixture) policy.Policy {
				p, err := policy.Derive(policy.DeriveInput{
					Manifest: manifestOf("", []policy.Capability{{Name: "fs:write", Hints: []string{"~/work/**"}}}),
					Autonomy: policy.AutonomyReadonly, Host: fx.Host,
				})
				if err != nil {
					t.Fatal(err)
				}
				return p
			},
			sh:     "echo PWNED > {{WORK}}/new.txt",
			landed: workWritten,
		})

		// Hard links of a nucleus file into a write grant.
		for _, grant := range []string{"{{WORK}}", "{{HOME}}"} {
			attack(t, fx, m, attackCase{
				name:    "hard-link-of-nucleus-file/write-grant-" + strings.ToLower(strings.Trim(grant, "{}")),
				policy:  supervised(nil, []string{grant}),
				sh:      "ln {{HOME}}/.ssh/id_rsa {{WORK}}/x; cat {{WORK}}/x",
				secrets: []string{fx.Secrets[0].Token},
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if fileHas(fx.Work+"/x", fx.Secrets[0].Token) {
						return []string{"~/.ssh/id_rsa hard-linked into the write grant: " + fx.Work + "/x"}
					}
					return nil
				},
			})
		}

		// Moving a masked directory (or its parent) out of the way.
		attack(t, fx, m, attackCase{
			name:    "rename-masked-dir",
			policy:  supervised(nil, []string{"{{HOME}}"}),
			sh:      "mv {{HOME}}/.ssh {{HOME}}/ssh2; cat {{HOME}}/ssh2/id_rsa",
			secrets: []string{fx.Secrets[0].Token},
		})
		attack(t, fx, m, attackCase{
			name:    "rename-parent-of-masked-dir",
			policy:  supervised(nil, []string{"{{HOME}}"}),
			sh:      "mv {{HOME}}/.config {{HOME}}/cfg2; cat {{HOME}}/cfg2/gh/hosts.yml {{HOME}}/cfg2/metnos/key",
			secrets: []string{fx.Secrets[4].Token, fx.Secrets[7].Token},
		})
		// The rename must not land on the host either: a later run would
		// find the secrets at the new name, outside every mask.
		attack(t, fx, m, attackCase{
			name:   "rename-parent-of-masked-dir-for-a-later-run",
			policy: supervised(nil, []string{"{{HOME}}"}),
			sh:     "mv {{HOME}}/.config {{HOME}}/cfg2 && echo PWNED",
			landed: func(t *testing.T, fx *fixture, r result) []string {
				if exists(fx.path("cfg2/gh/hosts.yml")) {
					return []string{"a masked directory's parent was renamed on the host: " + fx.path("cfg2")}
				}
				return nil
			},
		})

		// Changing a secret's mode, times or attributes needs no read
		// access, and Landlock has no hook for it.
		attack(t, fx, m, attackCase{
			name:   "chmod-and-touch-a-secret",
			policy: supervised(nil, []string{"{{HOME}}"}),
			sh:     "chmod 666 {{HOME}}/.ssh/id_rsa; touch -d 2000-01-01 {{HOME}}/.ssh/id_rsa",
			landed: func(t *testing.T, fx *fixture, r result) []string {
				fi, err := os.Stat(fx.path(".ssh/id_rsa"))
				if err != nil {
					return nil
				}
				var ev []string
				if fi.Mode().Perm()&0o066 != 0 {
					ev = append(ev, "a secret was made readable by others: "+fi.Mode().String())
				}
				if fi.ModTime().Year() == 2000 {
					ev = append(ev, "a secret's time was changed")
				}
				return ev
			},
		})

		// A nucleus entry that is a symbolic link (dotfile managers make
		// them): the mask covers its target, and the link itself must
		// not be replaceable by a directory of the command's.
		attack(t, fx, m, attackCase{
			name:   "replace-symlinked-nucleus-entry",
			policy: supervised(nil, []string{"{{HOME}}"}),
			setup: func(t *testing.T, fx *fixture) {
				if err := os.Rename(fx.path(".ssh"), fx.Outside+"/ssh-real"); err != nil {
					t.Fatal(err)
				}
				symlink(t, fx.Outside+"/ssh-real", fx.path(".ssh"))
			},
			sh: "rm {{HOME}}/.ssh; mkdir {{HOME}}/.ssh; echo PWNED > {{HOME}}/.ssh/authorized_keys",
			landed: func(t *testing.T, fx *fixture, r result) []string {
				if fileHas(fx.path(".ssh/authorized_keys"), "PWNED") {
					return []string{"the command replaced ~/.ssh and planted authorized_keys on the host"}
				}
				return nil
			},
			cleanup: func(t *testing.T, fx *fixture) {
				os.RemoveAll(fx.path(".ssh"))
				os.RemoveAll(fx.Outside + "/ssh-real")
			},
		})

		// Creating an absent nucleus path must fail and leave nothing.
		for _, c := range []struct {
			name, rel, sh string
			gone          []string
		}{
			{"absent-dir-~/.kube", ".kube/config", "mkdir {{HOME}}/.kube; echo PWNED > {{HOME}}/.kube/config; cat {{HOME}}/.kube/config", []string{".kube"}},
			{"absent-file-~/.npmrc", ".npmrc", "echo PWNED > {{HOME}}/.npmrc; cat {{HOME}}/.npmrc", []string{".npmrc"}},
			{"absent-deep-~/.local/share/keyrings", ".local/share/keyrings/login", "mkdir -p {{HOME}}/.local/share/keyrings; echo PWNED > {{HOME}}/.local/share/keyrings/login; cat {{HOME}}/.local/share/keyrings/login", []string{".local"}},
		} {
			attack(t, fx, m, attackCase{
				name:   c.name,
				policy: supervised(nil, []string{"{{HOME}}"}),
				sh:     c.sh,
				landed: func(t *testing.T, fx *fixture, r result) []string {
					if fileHas(fx.path(c.rel), "PWNED") {
						return []string{"absent nucleus path created on the host: " + fx.path(c.rel)}
					}
					return nil
				},
				afterInside: func(t *testing.T, fx *fixture) {
					for _, g := range c.gone {
						if exists(fx.path(g)) {
							t.Errorf("placeholder left on the host after the run: %s (the sandbox must remove the mount points it creates)", fx.path(g))
						}
					}
				},
			})
		}
	})
}

// TestPlantedSymlinkAcrossRuns: a symlink one run plants in its write
// grant must not open the nucleus to a later run whose policy is
// derived from arguments naming it.
func TestPlantedSymlinkAcrossRuns(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		plant := func(t *testing.T, fx *fixture) {
			r := runInside(t, fx, m, supervised(nil, []string{"{{HOME}}"})(t, fx),
				shArgv(fx.expand("ln -s {{HOME}}/.ssh {{WORK}}/evil && ln -s {{HOME}}/.ssh/id_rsa {{WORK}}/evilfile && ln -s {{HOME}} {{WORK}}/evilhome")), sandbox.Limits{})
			for _, l := range []string{"evil", "evilfile", "evilhome"} {
				if _, err := os.Readlink(fx.Work + "/" + l); err != nil {
					t.Fatalf("run 1 could not plant ~/work/%s (a sandbox may create symlinks in its write grant): %v\n%s", l, err, r)
				}
			}
		}
		derived := func(caps []policy.Capability, args any) policyFunc {
			return func(t *testing.T, fx *fixture) policy.Policy {
				p, err := policy.Derive(policy.DeriveInput{Manifest: manifestOf("", caps), Args: fx.expandArgs(args), Host: fx.Host})
				if err != nil {
					t.Fatalf("Derive: %v", err)
				}
				return p
			}
		}
		read := []policy.Capability{{Name: "fs:read"}}
		for _, c := range []struct {
			name string
			caps []policy.Capability
			args any
		}{
			{"fs:read-arg-dir-link", read, map[string]any{"path": "{{WORK}}/evil"}},
			{"fs:read-arg-file-in-dir-link", read, map[string]any{"path": "{{WORK}}/evil/id_rsa"}},
			{"fs:read-arg-file-link", read, map[string]any{"path": "{{WORK}}/evilfile"}},
			{"fs:read-arg-home-link", read, map[string]any{"path": "{{WORK}}/evilhome"}},
			{"fs:read-hint-work", []policy.Capability{{Name: "fs:read", Hints: []string{"~/work/**"}}}, map[string]any{"path": "{{WORK}}/evil"}},
			{"fs:read-hint-home", []policy.Capability{{Name: "fs:read", Hints: []string{"~/**"}}}, map[string]any{"path": "{{WORK}}/evil"}},
			{"fs:write-arg-dir-link", []policy.Capability{{Name: "fs:write"}}, map[string]any{"paths": []any{"{{WORK}}/evil", "{{WORK}}"}}},
		} {
			attack(t, fx, m, attackCase{
				name:    c.name,
				policy:  derived(c.caps, c.args),
				setup:   plant,
				sh:      "cat {{WORK}}/evil/id_rsa; cat {{WORK}}/evilfile; cat {{WORK}}/evilhome/.ssh/id_rsa",
				secrets: []string{fx.Secrets[0].Token},
			})
		}
	})
}

// expandArgs expands fixture templates in the strings of JSON-like args.
func (fx *fixture) expandArgs(v any) any {
	switch v := v.(type) {
	case string:
		return fx.expand(v)
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			out[k] = fx.expandArgs(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = fx.expandArgs(x)
		}
		return out
	}
	return v
}

// TestPrivateTmp: the host's /tmp and /dev/shm are not visible inside,
// and what the command leaves in /tmp does not reach the host.
func TestPrivateTmp(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		tok := token("METNOS-TMP")
		hostTmp := filepath.Join(os.TempDir(), token("metnos-hostile-tmp"))
		hostShm := "/dev/shm/" + token("metnos-hostile-shm")
		writeFile(t, hostTmp, tok+"\n", 0o644)
		writeFile(t, hostShm, tok+"\n", 0o644)
		t.Cleanup(func() { os.Remove(hostTmp); os.Remove(hostShm) })
		fx.set("HOSTTMP", hostTmp)
		fx.set("HOSTSHM", hostShm)
		pols := []readPolicy{
			{name: "supervised", policy: supervised(nil, []string{"{{WORK}}"})},
			{name: "readonly-profile", policy: profileOnly(policy.ProfileReadonly)},
		}
		for _, rp := range pols {
			attack(t, fx, m, attackCase{
				name:    "read-host-tmp/" + rp.name,
				policy:  rp.policy,
				sh:      "cat {{HOSTTMP}}; cat {{HOSTSHM}}; ls /tmp /dev/shm",
				secrets: []string{tok},
			})
			leftTmp := filepath.Join(os.TempDir(), token("metnos-hostile-left"))
			leftShm := "/dev/shm/" + token("metnos-hostile-left")
			fx.set("LEFTTMP", leftTmp)
			fx.set("LEFTSHM", leftShm)
			attack(t, fx, m, attackCase{
				name:   "leave-file-in-host-tmp/" + rp.name,
				policy: rp.policy,
				sh:     `echo PWNED > {{LEFTTMP}}; echo PWNED > {{LEFTSHM}}; echo PWNED > "${TMPDIR:-/tmp}/x"`,
				landed: func(t *testing.T, fx *fixture, r result) []string {
					var ev []string
					for _, p := range []string{leftTmp, leftShm} {
						if exists(p) {
							ev = append(ev, "file written inside is on the host: "+p)
						}
					}
					return ev
				},
				cleanup: func(t *testing.T, fx *fixture) { os.Remove(leftTmp); os.Remove(leftShm) },
			})
		}
	})
}

// physicalBlock finds where the file's first byte lies on its block
// device (FIEMAP), and the device node: what a raw read of the disk
// would need.
func physicalBlock(t *testing.T, path string) (dev string, block int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// struct fiemap (32 bytes) + one struct fiemap_extent (56 bytes).
	var buf [32 + 56]byte
	binary.NativeEndian.PutUint64(buf[8:], ^uint64(0)) // fm_length
	binary.NativeEndian.PutUint32(buf[16:], 1)         // FIEMAP_FLAG_SYNC
	binary.NativeEndian.PutUint32(buf[24:], 1)         // fm_extent_count
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), 0xC020660B, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		t.Skipf("FIEMAP on %s: %v (the filesystem cannot tell where the file lies)", path, e)
	}
	if binary.NativeEndian.Uint32(buf[20:]) == 0 {
		t.Skipf("FIEMAP on %s: no extent", path)
	}
	phys := int64(binary.NativeEndian.Uint64(buf[32+8:]))
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	ue, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		t.Skipf("the fixture is not on a block device: %v", err)
	}
	for _, line := range strings.Split(string(ue), "\n") {
		if name, ok := strings.CutPrefix(line, "DEVNAME="); ok {
			dev = "/dev/" + name
		}
	}
	if dev == "" || phys%4096 != 0 {
		t.Skipf("cannot locate %s on its device (dev %q, offset %d)", path, dev, phys)
	}
	return dev, phys / 4096
}

// TestRawDisk: the nucleus cannot be read around its masks through the
// raw block device of the filesystem holding it. Only root can open the
// device on the host, so the outside half runs only as root.
func TestRawDisk(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		tok := token("METNOS-RAW-SECRET")
		// Not the full profiles: as root they may write what root owns
		// (cron, /etc), which no mask can survive anyway.
		pols := []readPolicy{
			{name: "readonly-profile", policy: profileOnly(policy.ProfileReadonly)},
			{name: "supervised", policy: supervised([]string{"{{HOME}}"}, []string{"{{WORK}}"})},
		}
		// Any block device the host user can read gives every file on
		// it, masked or not.
		if bdev := openableBlockDevice(); bdev != "" {
			fx.set("BDEV", bdev)
			for _, rp := range pols {
				if rp.bwrapOnly && !m.bwrap {
					continue
				}
				attack(t, fx, m, attackCase{
					name:   "open-block-device/" + rp.name,
					policy: rp.policy,
					py: `
fd = os.open("{{BDEV}}", os.O_RDONLY)
print("opened {{BDEV}}, read", len(os.read(fd, 4096)), "bytes")
`,
					landed: func(t *testing.T, fx *fixture, r result) []string {
						if r.exit == 0 && strings.Contains(r.stdout, "opened ") {
							return []string{"raw block device " + fx.vars["BDEV"] + " opened for reading (every file on it is readable, masks included)"}
						}
						return nil
					},
				})
			}
		} else {
			t.Logf("no block device is readable by uid %d on the host; the block-device attack is not tried", os.Getuid())
		}

		// The fixture's own disk, read where the key lies.
		t.Run("read-nucleus-file-from-raw-device", func(t *testing.T) {
			var outsideFails string
			dev, _ := physicalBlock(t, fx.path("notes.txt"))
			if f, err := os.Open(dev); err != nil {
				if isRoot() {
					t.Skipf("even root cannot open %s on this host (%v; a device cgroup?), so a raw read cannot be shown to work outside", dev, err)
				}
				outsideFails = fmt.Sprintf("uid %d cannot open %s on the host either", os.Getuid(), dev)
			} else {
				f.Close()
			}
			plant := func(t *testing.T, fx *fixture) {
				p := fx.path(".ssh/raw_key")
				writeFile(t, p, strings.Repeat(tok+"\n", 8192/(len(tok)+1)+1), 0o600)
				dev, blk := physicalBlock(t, p)
				fx.set("DEV", dev)
				fx.set("BLK", strconv.FormatInt(blk, 10))
			}
			for _, rp := range pols {
				attack(t, fx, m, attackCase{
					name:         rp.name,
					policy:       rp.policy,
					setup:        plant,
					sh:           "dd if={{DEV}} bs=4096 skip={{BLK}} count=1 iflag=direct 2>&1 | head -c 200",
					secrets:      []string{tok},
					outsideFails: outsideFails,
				})
			}
		})
	})
}

// openableBlockDevice returns a block device in /dev this process can
// open for reading, or "".
func openableBlockDevice() string {
	ents, _ := os.ReadDir("/dev")
	for _, e := range ents {
		if e.Type()&os.ModeDevice == 0 || e.Type()&os.ModeCharDevice != 0 {
			continue
		}
		p := "/dev/" + e.Name()
		if f, err := os.Open(p); err == nil {
			f.Close()
			return p
		}
	}
	return ""
}
