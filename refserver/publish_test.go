package refserver

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/metnos/agent/wire"
)

// readManifestFile decodes DIR/manifest.json.
func readManifestFile(t *testing.T, dir string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("manifest: %v\n%s", err, b)
	}
	return m
}

// manifestEntry is versions[v][target][component] of the manifest, nil
// when absent.
func manifestEntry(m map[string]any, v, target, component string) map[string]any {
	at := func(o any, k string) any {
		mo, _ := o.(map[string]any)
		return mo[k]
	}
	e, _ := at(at(at(m["versions"], v), target), component).(map[string]any)
	return e
}

func TestPublish(t *testing.T) {
	dir := t.TempDir()
	steps := []struct {
		version, target, component, data string
		wantLatest                       string
	}{
		{"1.2.0", "linux-amd64", wire.AgentComponent, "amd64 v1", "1.2.0"},
		{"1.2.0", "windows-arm64", wire.AgentComponent, "windows v1", "1.2.0"},
		{"1.2.0", "x86_64-pc-windows-gnu", RustClientComponent, "rust client", "1.2.0"},
		{"1.2.0", "linux-amd64", wire.AgentComponent, "amd64 v1, rebuilt", "1.2.0"}, // replaces
		{"1.10.0", "linux-amd64", wire.AgentComponent, "amd64 v2", "1.10.0"},        // numerically newer
		{"1.9.9", "linux-amd64", wire.AgentComponent, "amd64 older", "1.10.0"},      // older: latest stays
	}
	for _, s := range steps {
		e := publish(t, dir, s.version, s.target, s.component, []byte(s.data))
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(e.Path)))
		if err != nil || string(b) != s.data || e.Size != int64(len(s.data)) || e.SHA256 != sha([]byte(s.data)) {
			t.Errorf("%+v: file %q %v, entry %+v", s, b, err, e)
		}
		m := readManifestFile(t, dir)
		if m["latest"] != s.wantLatest {
			t.Errorf("after %s %s: latest %v, want %s", s.version, s.target, m["latest"], s.wantLatest)
		}
		got := manifestEntry(m, s.version, s.target, s.component)
		if got["sha256"] != e.SHA256 || got["path"] != e.Path || got["filename"] != e.Filename || got["size"] != float64(e.Size) {
			t.Errorf("manifest entry %v, want %+v", got, e)
		}
	}
	m := readManifestFile(t, dir)
	// Every earlier publication of 1.2.0 is still there.
	if e := manifestEntry(m, "1.2.0", "windows-arm64", wire.AgentComponent); e["filename"] != "metnos-agent.exe" || e["path"] != "1.2.0/windows-arm64/metnos-agent.exe" {
		t.Errorf("windows entry: %v", e)
	}
	if e := manifestEntry(m, "1.2.0", "x86_64-pc-windows-gnu", RustClientComponent); e["filename"] != "metnos-client.exe" {
		t.Errorf("rust client entry: %v", e)
	}
	if e := manifestEntry(m, "1.2.0", "linux-amd64", wire.AgentComponent); e["sha256"] != sha([]byte("amd64 v1, rebuilt")) {
		t.Errorf("republished entry: %v", e)
	}
	if e := manifestEntry(m, "1.9.9", "linux-amd64", wire.AgentComponent); e == nil {
		t.Error("the older version's entry was not recorded")
	}
	// No temporary file is left behind.
	for _, d := range []string{dir, filepath.Join(dir, "1.2.0", "linux-amd64")} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.Contains(e.Name(), ".tmp-") {
				t.Errorf("left over: %s", filepath.Join(d, e.Name()))
			}
		}
	}
}

func TestPublishRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ version, target, component string }{
		{"", "linux-amd64", wire.AgentComponent},
		{"../1", "linux-amd64", wire.AgentComponent},
		{"1..2", "linux-amd64", wire.AgentComponent},
		{"1.0", "linux/amd64", wire.AgentComponent},
		{"1.0", "Linux-amd64", wire.AgentComponent},
		{"1.0", "linux-amd64", "Metnos-agent"},
		{"1.0", "linux-amd64", "../x"},
	} {
		if _, err := Publish(dir, c.version, c.target, c.component, strings.NewReader("x")); err == nil {
			t.Errorf("%+v was published", c)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("refused publications left %d entries in the mirror", len(ents))
	}
	os.WriteFile(filepath.Join(dir, ManifestName), []byte("not json"), 0o644)
	if _, err := Publish(dir, "1.0", "linux-amd64", wire.AgentComponent, strings.NewReader("x")); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("over an unreadable manifest: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ManifestName)); string(b) != "not json" {
		t.Error("the unreadable manifest was overwritten")
	}
}

func TestWriteInstallers(t *testing.T) {
	dir := t.TempDir()
	own := []byte("#!/bin/sh\necho the operator's real installer\n")
	os.WriteFile(filepath.Join(dir, "install.sh"), own, 0o644)
	wrote, err := WriteInstallers(dir)
	if err != nil || len(wrote) != 1 || filepath.Base(wrote[0]) != "install.ps1" {
		t.Fatalf("wrote %v, %v", wrote, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "install.sh")); !bytes.Equal(b, own) {
		t.Error("an existing install.sh was replaced")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "install.ps1")); string(b) != InstallPs1 {
		t.Error("install.ps1 differs")
	}
	if wrote, err := WriteInstallers(dir); err != nil || len(wrote) != 0 {
		t.Errorf("second call wrote %v, %v", wrote, err)
	}
	if !strings.HasPrefix(InstallSh, "#!/bin/sh\n") || !strings.Contains(InstallSh, `metnos-agent register --server "$METNOS_SERVER" --token "$METNOS_TOKEN"`) {
		t.Error("the stand-in install.sh does not have the shape the join endpoint and pair expect")
	}
}
