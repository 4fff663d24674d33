package cli

import (
	"os"
	"path/filepath"
	"reflect"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	"github.com/metnos/agent/internal/config"
	"github.com/metnos/agent/internal/layout"
	"github.com/metnos/agent/policy"
)

// TestSamePolicyEverywhere: doctor, exec and run derive the same policy
// (its fingerprint, which the audit log and every result record) for
// the same profile, on the layout of each operating system, and the
// agent's folders are masked in it (doctor once missed the macOS
// and Windows folders that run and exec masked).
func TestSamePolicyEverywhere(t *testing.T) {
	for _, c := range []struct {
		goos, home string
		env        map[string]string
	}{
		{"linux", "/home/ada", map[string]string{"XDG_CONFIG_HOME": "/home/ada/cfg", "METNOS_DATA_DIR": "/srv/metnos-data"}},
		{"darwin", "/Users/ada", nil},
		{"windows", `C:\Users\ada`, map[string]string{"LOCALAPPDATA": `C:\Users\ada\AppData\Local`, "APPDATA": `C:\Users\ada\AppData\Roaming`}},
	} {
		t.Run(c.goos, func(t *testing.T) {
			getenv := func(k string) string { return c.env[k] }
			cfg, err := config.FromEnv(c.goos, getenv)
			if err != nil {
				t.Fatal(err)
			}
			lay, err := layout.For(c.goos, cfg.Paths.Getenv, c.home)
			if err != nil {
				t.Fatal(err)
			}
			e := environment{cfg: cfg, lay: lay}
			for _, prof := range doctorProfiles {
				net := prof == policy.ProfileFull
				// doctor: its host and its input for the profile.
				dh, err := deviceHost(e, os.Getuid())
				if err != nil {
					t.Fatal(err)
				}
				eh, err := deviceHost(e, os.Getuid())
				if err != nil {
					t.Fatal(err)
				}
				ac, err := agentConfig(e)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(dh, eh) || !reflect.DeepEqual(dh, ac.Host) {
					t.Fatalf("hosts differ:\ndoctor %+v\nexec   %+v\nrun    %+v", dh, eh, ac.Host)
				}
				for _, d := range []string{lay.Data, lay.Cache} {
					if !slices.Contains(ac.Host.AgentDataDirs, d) {
						t.Errorf("%s: the agent's folder %s is not in the host's AgentDataDirs %v", prof, d, ac.Host.AgentDataDirs)
					}
				}
				if !filepath.IsAbs(lay.Home) {
					// Another system's paths (Windows' on Unix): the
					// policy cannot be derived here; the hosts it would
					// be derived from are equal.
					continue
				}
				dp, err := policy.ForProfile(doctorInput(string(prof), dh))
				if err != nil {
					t.Fatalf("doctor %s: %v", prof, err)
				}
				// exec --profile prof (--net for full), no grants.
				ep, err := policy.ForProfile(execInput(execFlags{profile: string(prof), net: net}, eh))
				if err != nil {
					t.Fatalf("exec %s: %v", prof, err)
				}
				// run: the Host the agent is given.
				rp, err := policy.ForProfile(policy.ProfileInput{Profile: prof, Network: net, Host: ac.Host})
				if err != nil {
					t.Fatalf("run %s: %v", prof, err)
				}
				if dp.Fingerprint() != ep.Fingerprint() || dp.Fingerprint() != rp.Fingerprint() {
					t.Errorf("%s: doctor %s, exec %s, run %s", prof, dp.Fingerprint(), ep.Fingerprint(), rp.Fingerprint())
				}
				for _, d := range lay.AgentDirs() {
					if _, ok := policy.CoveredByMask(d, dp.Masks); !ok {
						t.Errorf("%s: the agent's folder %s is not masked", prof, d)
					}
				}
			}
		})
	}
}

// TestDeviceHostFromEnv is the test of the sandbox's HostFromEnv, which
// deviceHost replaced, with the same assertions: the home, uid and
// session sockets of the environment, and as the agent's folders the
// Linux ones under the home plus a moved data folder.
func TestDeviceHostFromEnv(t *testing.T) {
	if goruntime.GOOS != "linux" {
		t.Skip("the Linux folders")
	}
	tmp := t.TempDir()
	env := map[string]string{
		"HOME":                     tmp,
		"XDG_RUNTIME_DIR":          "/run/user/4242",
		"DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/4242/bus",
		"METNOS_DATA_DIR":          "~/elsewhere",
	}
	host := func() policy.Host {
		t.Helper()
		e, err := readEnvironment(func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		h, err := deviceHost(e, os.Getuid())
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := host()
	if h.Home != tmp || h.UID != os.Getuid() || h.RuntimeDir != "/run/user/4242" || h.DBusSession != "unix:path=/run/user/4242/bus" {
		t.Errorf("deviceHost = %+v", h)
	}
	want := []string{tmp + "/.config/metnos", tmp + "/.local/share/metnos", tmp + "/.cache/metnos", tmp + "/elsewhere"}
	if strings.Join(h.AgentDataDirs, " ") != strings.Join(want, " ") {
		t.Errorf("AgentDataDirs = %v, want %v", h.AgentDataDirs, want)
	}
	env["METNOS_DATA_DIR"] = ""
	if h := host(); len(h.AgentDataDirs) != 3 {
		t.Errorf("AgentDataDirs without METNOS_DATA_DIR = %v", h.AgentDataDirs)
	}
}

// TestOwnerNetLists: the owner's network lists, from limits.toml or
// from METNOS_NET_ALLOW and METNOS_NET_DENY, which override the file's,
// and the never list, reach the Host every command derives from; an
// entry that is no destination stops the command with an error naming
// the variable, or the file's row and column.
func TestOwnerNetLists(t *testing.T) {
	home := t.TempDir()
	vars := map[string]string{"HOME": home, "METNOS_NET_ALLOW": "nas.lan:5000,192.168.1.0/24", "METNOS_NET_DENY": "*:22"}
	read := func() environment {
		t.Helper()
		e, err := readEnvironment(func(k string) string { return vars[k] })
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	h, err := deviceHost(read(), os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	if len(h.NetAllow) != 2 || h.NetAllow[1].Host != "192.168.1.0/24" || len(h.NetDeny) != 1 || h.NetDeny[0].Port != 22 {
		t.Errorf("host lists: allow %+v deny %+v", h.NetAllow, h.NetDeny)
	}
	vars["METNOS_NET_ALLOW"] = "the NAS please"
	if _, err := deviceHost(read(), os.Getuid()); err == nil || !strings.HasPrefix(err.Error(), "METNOS_NET_ALLOW: ") || !strings.Contains(err.Error(), "the NAS please") {
		t.Errorf("a bad entry: %v, want an error naming METNOS_NET_ALLOW and the entry", err)
	}

	// The file's lists, the variable overriding one of them.
	dir := filepath.Join(home, ".config", "metnos")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "limits.toml")
	if err := os.WriteFile(file, []byte("never = [\"~/Private\"]\n[network]\nallow = [\"files.lan\"]\ndeny = [\"*:25\", \"evil.example\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars["METNOS_NET_ALLOW"] = ""
	h, err = deviceHost(read(), os.Getuid())
	if err != nil {
		t.Fatal(err)
	}
	if len(h.NetAllow) != 1 || h.NetAllow[0].Host != "files.lan" || len(h.NetDeny) != 1 || h.NetDeny[0].Port != 22 {
		t.Errorf("host lists from the file, deny overridden: allow %+v deny %+v", h.NetAllow, h.NetDeny)
	}
	if len(h.Never) != 1 || h.Never[0] != filepath.Join(home, "Private") {
		t.Errorf("never = %q", h.Never)
	}
	vars["METNOS_NET_DENY"] = ""
	if h, err = deviceHost(read(), os.Getuid()); err != nil || len(h.NetDeny) != 2 || !strings.Contains(h.NetDeny[0].Why, file+":4:8 [network] deny") {
		t.Errorf("deny from the file: %+v, %v", h.NetDeny, err)
	}
	if err := os.WriteFile(file, []byte("[network]\nallow = [\"the NAS please\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := deviceHost(read(), os.Getuid()); err == nil || !strings.HasPrefix(err.Error(), file+":2:9 [network] allow: ") {
		t.Errorf("a bad entry in the file: %v, want an error naming its row and column", err)
	}
	if err := os.WriteFile(file, []byte("moed = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := deviceHost(read(), os.Getuid()); err == nil || !strings.Contains(err.Error(), file+":1:1: unknown key") {
		t.Errorf("a broken file: %v, want its error", err)
	}
}
