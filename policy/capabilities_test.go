package policy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// upstreamVocabulary is every capability the upstream Metnos executors
// declare, with the hints they declare it with (executors/*/manifest.toml).
var upstreamVocabulary = []struct {
	name  string
	hints []string
	want  Meaning
}{
	{"auth.password_storage", []string{"sites.read", "~/.config/metnos/credentials/*"}, MeaningRefused},
	{"channel:out", []string{"api.telegram.org"}, MeaningRefused},
	{"code:exec", []string{"winget", "dpkg-query", "rpm", "pacman"}, MeaningGrant},
	{"compute:pure", nil, MeaningNothing},
	{"compute:pure", []string{}, MeaningNothing},
	{"compute:pure", []string{"signature"}, MeaningNothing},
	{"dialog.user_input", []string{}, MeaningRefused},
	{"drive:permissions", []string{"drive:share"}, MeaningRefused},
	{"fs:read", []string{"~/**", "/tmp/**", "**/*", "$HOME/**", "arg:path", "~/.config/metnos/mail/<account>.env"}, MeaningGrant},
	{"fs:write", []string{"~/notes/**", "/tmp/**"}, MeaningGrant},
	{"index:read", []string{"image"}, MeaningRefused},
	{"llm:local", []string{"bounded_ocr_fallback"}, MeaningRefused},
	{"llm:online", []string{}, MeaningRefused},
	{"mail:read", []string{"imap.example.com"}, MeaningRefused},
	{"mail:send", []string{"smtp.example.com"}, MeaningRefused},
	{"mail:write", []string{"imap:move", "gmail:labels.modify"}, MeaningRefused},
	{"metnos:cache", []string{"file_hash_cache:local"}, MeaningNothing},
	{"metnos:create", []string{"spreadsheet:local"}, MeaningNothing},
	{"metnos:create", []string{"doc:remote"}, MeaningRefused},
	{"metnos:credentials_metadata_only", []string{}, MeaningRefused},
	{"metnos:read", []string{"persons_registry:local"}, MeaningRefused},
	{"metnos:write", []string{"spreadsheet:local"}, MeaningRefused},
	{"network:http", []string{"api.github.com", "https://*"}, MeaningGrant},
	{"network:sites", []string{"*"}, MeaningGrant},
	{"provider:access", []string{"google-workspace"}, MeaningRefused},
	{"system:admin", []string{"winget", "apt-get"}, MeaningRefused},
	{"system:admin", []string{"managed-package-start"}, MeaningRefused},
	{"system:read", []string{"installed_software", "package_database"}, MeaningGrant},
	{"system:read", []string{"processes", "health"}, MeaningGrant},
	{"system:read", []string{"service_status"}, MeaningNothing},
	{"system:read", []string{"network_interfaces"}, MeaningGrant},
	{"system:read", []string{"processes", "health", "network_interfaces", "service_status"}, MeaningGrant},
	{"system:undo", []string{"latest_owned_turn"}, MeaningRefused},
	{"time:read", []string{}, MeaningNothing},
}

// TestCapabilityVocabulary: every capability an upstream executor
// declares means something on the device, the one the table says:
// something granted, nothing at all, or a refusal naming it.
func TestCapabilityVocabulary(t *testing.T) {
	h, root := testHost(t)
	bin := root + "/sbin"
	mkdirs(t, bin, root+"/db/dpkg", h.Home+"/notes")
	writeExec(t, bin+"/dpkg-query")
	h.ProgramDirs = []string{bin}
	h.PackageDBs = []string{root + "/db/dpkg", root + "/db/rpm"}
	base, err := Derive(DeriveInput{Host: h})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range upstreamVocabulary {
		p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: c.name, Hints: c.hints}})})
		switch c.want {
		case MeaningRefused:
			var ce *CapabilityError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCapabilityRefused) {
				t.Errorf("%s %q: err %v, want a refusal", c.name, c.hints, err)
				continue
			}
			if !strings.Contains(err.Error(), c.name) || ce.Reason == "" || strings.Contains(ce.Reason, "does not know") {
				t.Errorf("%s %q: refusal %q does not name it with the table's reason", c.name, c.hints, err)
			}
		case MeaningNothing:
			if err != nil {
				t.Errorf("%s %q: %v", c.name, c.hints, err)
				continue
			}
			if p.Fingerprint() != base.Fingerprint() {
				t.Errorf("%s %q: changed the policy: %+v", c.name, c.hints, p)
			}
		case MeaningGrant:
			if err != nil {
				t.Errorf("%s %q: %v", c.name, c.hints, err)
				continue
			}
			if p.Fingerprint() == base.Fingerprint() {
				t.Errorf("%s %q: granted nothing", c.name, c.hints)
			}
		}
	}
	// The table has a row for each of them, and doctor prints it.
	table := CapabilityTable(h)
	for _, c := range upstreamVocabulary {
		if !slices.ContainsFunc(table, func(r CapabilityRule) bool { return r.Capability == c.name && r.Detail != "" }) {
			t.Errorf("%s: no row in the capability table", c.name)
		}
	}
	i := slices.IndexFunc(table, func(r CapabilityRule) bool { return r.Hint == "installed_software" })
	if i < 0 || !strings.HasSuffix(table[i].Detail, "on this device: "+root+"/db/dpkg") {
		t.Errorf("installed_software row does not say which databases this device has: %+v", table[i])
	}
}

// TestCapabilityGrants: what the granting rows grant.
func TestCapabilityGrants(t *testing.T) {
	h, root := testHost(t)
	sbin, local := root+"/sbin", root+"/local/bin"
	mkdirs(t, sbin, local, root+"/db/dpkg", root+"/db/apt")
	writeExec(t, sbin+"/ip")
	writeExec(t, local+"/ps")
	writeFile(t, sbin+"/notexec")
	h.ProgramDirs = []string{local, sbin}
	h.SystemPaths = []string{sbin}
	h.PackageDBs = []string{root + "/db/dpkg", root + "/db/apt", root + "/db/pacman", sbin + "/apt"}
	mkdirs(t, sbin+"/apt")

	p, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{
		{Name: "system:read", Hints: []string{"installed_software", "package_database"}},
		{Name: "code:exec", Hints: []string{"ip", "ps", "notexec", "rpm", "WMI/CIM", "subprocess Python google_api.py contacts list"}},
	})})
	if err != nil {
		t.Fatal(err)
	}
	// The package databases that exist, read-only; the program folder
	// outside the system paths readable; both program folders on PATH.
	checkGrants(t, p, []Grant{
		{Path: root + "/db/apt", Access: Read, Why: "system:read hint installed_software"},
		{Path: root + "/db/dpkg", Access: Read, Why: "system:read hint installed_software"},
		{Path: local, Access: Read, Why: "code:exec hint ps"},
	})
	if !slices.Equal(p.ExecPath, []string{sbin, local}) {
		t.Errorf("ExecPath %q, want %q", p.ExecPath, []string{sbin, local})
	}
	if p.HostPIDs || p.Network {
		t.Errorf("HostPIDs %v Network %v, want neither", p.HostPIDs, p.Network)
	}
	notes := strings.Join(p.Notes, "\n")
	for _, want := range []string{`"WMI/CIM" is not a program name: ignored`, `"subprocess Python google_api.py contacts list" is not a program name`, `"rpm": no such program`, `"notexec": no such program`} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes %q lack %q", notes, want)
		}
	}

	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "system:read", Hints: []string{"processes", "health", "service_status"}}})})
	if err != nil {
		t.Fatal(err)
	}
	if !p.HostPIDs || p.HostNetView || len(p.Grants) != 0 || p.Network {
		t.Errorf("processes/health: %+v, want HostPIDs only", p)
	}

	// network_interfaces: the host's interfaces to read, and still no
	// network; upstream get_processes' whole block gives both views.
	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "system:read", Hints: []string{"network_interfaces"}}})})
	if err != nil {
		t.Fatal(err)
	}
	if !p.HostNetView || p.HostPIDs || len(p.Grants) != 0 || p.Network {
		t.Errorf("network_interfaces: %+v, want HostNetView only", p)
	}
	p, err = Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "system:read", Hints: []string{"processes", "health", "network_interfaces", "service_status"}}})})
	if err != nil {
		t.Fatal(err)
	}
	if !p.HostNetView || !p.HostPIDs || p.Network {
		t.Errorf("get_processes' block: %+v, want HostPIDs and HostNetView, no network", p)
	}
}

// TestCapabilityUnknown: a capability, a hint or a when clause the
// table does not know is refused with its name, never ignored.
func TestCapabilityUnknown(t *testing.T) {
	h, _ := testHost(t)
	for _, c := range []struct {
		cap  Capability
		want []string
	}{
		{Capability{Name: "teleport:now", Hints: []string{"mars"}}, []string{"teleport:now", `"mars"`, "does not know the capability"}},
		{Capability{Name: "system:read", Hints: []string{"processes", "kernel_modules"}}, []string{"system:read", `hint "kernel_modules"`, "does not know the hint"}},
		{Capability{Name: "system:read"}, []string{"system:read", "declares no hint"}},
		{Capability{Name: "fs:read", Hints: []string{"$XDG_CACHE_HOME/x/**"}}, []string{"fs:read", `"$XDG_CACHE_HOME/x/**"`, "does not know the hint"}},
		{Capability{Name: "metnos:cache", Hints: []string{"somewhere"}}, []string{"metnos:cache", `"somewhere"`}},
		{Capability{Name: "fs:read", Hints: []string{"~/x"}, When: map[string]any{"arg": "a", "matches": "b.*"}}, []string{"fs:read", "arg+matches", "does not know"}},
		{Capability{Name: "fs:read", Hints: []string{"~/x"}, When: map[string]any{"arg": "a", "nonempty": false}}, []string{"fs:read", "nonempty must be true"}},
		{Capability{Name: "fs:read", Hints: []string{"~/x"}, When: map[string]any{"values": []any{"a"}}}, []string{"names no argument"}},
	} {
		_, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{{Name: "fs:read", Hints: []string{"/tmp/**"}}, c.cap})})
		if !errors.Is(err, ErrCapabilityRefused) {
			t.Errorf("%+v: err %v, want a refusal", c.cap, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %q lacks %q", c.cap, err, w)
			}
		}
	}
}

// TestCapabilityWhen: a capability whose when clause does not hold for
// the invocation's arguments (or the schema's default) is not in force.
func TestCapabilityWhen(t *testing.T) {
	h, _ := testHost(t)
	mkdirs(t, h.Home+"/local")
	google := map[string]any{"arg": "client", "values": []any{"google_workspace"}}
	caps := []Capability{
		{Name: "provider:access", Hints: []string{"google-workspace"}, When: google},
		{Name: "fs:write", Hints: []string{"~/local"}, When: map[string]any{"arg": "client", "values": []any{"local"}}},
		{Name: "network:http", Hints: []string{"x"}, When: map[string]any{"arg": "urls", "nonempty": true}},
		{Name: "mail:send", Hints: []string{"smtp.example.com"}, When: map[string]any{"arg": "messages", "any_item_has": "in_reply_to"}},
	}
	m := manifestOf("", caps).WithArgDefaults(map[string]any{"client": "local"})
	for _, c := range []struct {
		args    map[string]any
		refused string
		write   bool
		network bool
	}{
		{map[string]any{}, "", true, false},
		{map[string]any{"client": "local", "urls": []any{}}, "", true, false},
		{map[string]any{"client": "other", "urls": []any{"http://x"}}, "", false, true},
		{map[string]any{"client": "google_workspace"}, "provider:access", false, false},
		{map[string]any{"messages": []any{map[string]any{"to": "a"}}}, "", true, false},
		{map[string]any{"messages": []any{map[string]any{"to": "a"}, map[string]any{"in_reply_to": "m1"}}}, "mail:send", false, false},
	} {
		p, err := Derive(DeriveInput{Host: h, Manifest: m, Args: c.args})
		if c.refused != "" {
			if !errors.Is(err, ErrCapabilityRefused) || !strings.Contains(err.Error(), c.refused) {
				t.Errorf("%v: err %v, want %s refused", c.args, err, c.refused)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", c.args, err)
			continue
		}
		if got := len(p.Grants) == 1 && p.Grants[0].Access == Write; got != c.write {
			t.Errorf("%v: grants %v, want fs:write in force %v", c.args, p.Grants, c.write)
		}
		if p.Network || (p.Egress != nil) != c.network {
			t.Errorf("%v: network %v, egress %v, want the network narrowed: %v", c.args, p.Network, p.Egress, c.network)
		}
	}
	// Without the schema's default, an absent argument matches no value.
	if _, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", caps[:1])}); err != nil {
		t.Errorf("provider:access with client absent and no default: %v", err)
	}
}

// TestCapabilityRefusalMessages: the refusals the issue names say why
// in the user's words.
func TestCapabilityRefusalMessages(t *testing.T) {
	h, _ := testHost(t)
	for _, c := range []struct {
		cap  Capability
		want string
	}{
		{Capability{Name: "system:admin", Hints: []string{"winget", "apt-get"}}, `capability system:admin hint ["winget","apt-get"]: refused on this device: this device does not give administrative rights to executors`},
		{Capability{Name: "provider:access", Hints: []string{"google-workspace"}}, "provider credentials"},
	} {
		_, err := Derive(DeriveInput{Host: h, Manifest: manifestOf("", []Capability{c.cap})})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.cap.Name, err, c.want)
		}
	}
}

func writeExec(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
}
