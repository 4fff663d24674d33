package refserver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/metnos/agent/wire"
)

// Entry is one build in the mirror's manifest, as scripts/build-client.sh
// of the real server writes it under versions[version][target][component].
type Entry struct {
	// Filename is the file's name: the component's name, with .exe on
	// windows targets.
	Filename string `json:"filename"`
	// Path is version/target/filename, what a descriptor's url_path
	// carries after /agent/client/.
	Path string `json:"path"`
	// Size is the file's length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the file's SHA-256, 64 lowercase hex digits: what the
	// descriptor signs and the device checks.
	SHA256 string `json:"sha256"`
}

// BuildFilename is the file name a component's build gets in the mirror
// for a target: metnos-agent for wire.AgentComponent (the Rust client's
// "client" is metnos-client, its "helper" metnos-helper, as
// build-client.sh names them; any other component its own name), with
// ".exe" when the target names windows.
func BuildFilename(target, component string) string {
	name := component
	switch component {
	case RustClientComponent:
		name = "metnos-client"
	case "helper":
		name = "metnos-helper"
	}
	if strings.Contains(target, "windows") {
		name += ".exe"
	}
	return name
}

// Publish copies the build read from binary into mirrorDir as
// version/target/<BuildFilename> and records it in mirrorDir's
// manifest.json under versions[version][target][component]. "latest"
// becomes version when it is absent or older (wire.CompareVersions); the
// other components and targets of version stay, and so do the entries
// of other versions (the real build script writes only one version, but
// the real server only ever reads latest's, so older ones are harmless
// and let an operator go back by editing "latest"). The file and the
// manifest are each written to a temporary file, synced and renamed, so
// a server reading the mirror meanwhile sees the old state or the new
// one. Publish is not safe against a concurrent Publish to the same
// mirror.
func Publish(mirrorDir, version, target, component string, binary io.Reader) (Entry, error) {
	switch {
	case !wire.ValidVersion(version):
		return Entry{}, fmt.Errorf("refserver: publish: %q is not a version (1 to 64 of A-Z a-z 0-9 . _ + -)", version)
	case !wire.ValidTarget(target):
		return Entry{}, fmt.Errorf("refserver: publish: %q is not a target (a-z 0-9 _ -, such as linux-amd64)", target)
	case !wire.ValidComponent(component):
		return Entry{}, fmt.Errorf("refserver: publish: %q is not a component name (such as %s)", component, wire.AgentComponent)
	case !safeMirrorName(version):
		return Entry{}, fmt.Errorf("refserver: publish: version %q cannot be a directory of the mirror", version)
	}
	man, err := loadManifest(mirrorDir)
	if err != nil {
		return Entry{}, err
	}
	name := BuildFilename(target, component)
	dir := filepath.Join(mirrorDir, version, target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Entry{}, fmt.Errorf("refserver: publish: %w", err)
	}
	h := sha256.New()
	var size int64
	err = writeAtomic(filepath.Join(dir, name), 0o755, func(f *os.File) error {
		size, err = io.Copy(io.MultiWriter(f, h), binary)
		return err
	})
	if err != nil {
		return Entry{}, fmt.Errorf("refserver: publish %s %s %s: %w", component, version, target, err)
	}
	e := Entry{Filename: name, Path: version + "/" + target + "/" + name, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}

	versions := subObject(man, "versions")
	subObject(subObject(versions, version), target)[component] = e
	if latest, _ := man["latest"].(string); latest == "" || wire.CompareVersions(version, latest) > 0 {
		man["latest"] = version
	}
	b, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return Entry{}, fmt.Errorf("refserver: publish: encoding the manifest: %w", err)
	}
	err = writeAtomic(filepath.Join(mirrorDir, ManifestName), 0o644, func(f *os.File) error {
		_, err := f.Write(append(b, '\n'))
		return err
	})
	if err != nil {
		return Entry{}, fmt.Errorf("refserver: publish: writing the manifest: %w", err)
	}
	return e, nil
}

// loadManifest reads mirrorDir's manifest, or an empty one when there is
// none yet; a manifest that is not a JSON object is an error (Publish
// will not overwrite what it cannot read).
func loadManifest(mirrorDir string) (map[string]any, error) {
	p := filepath.Join(mirrorDir, ManifestName)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(mirrorDir, 0o755); err != nil {
			return nil, fmt.Errorf("refserver: publish: %w", err)
		}
		return map[string]any{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("refserver: publish: %w", err)
	}
	m, ok := decodeObject(b)
	if !ok {
		return nil, fmt.Errorf("refserver: publish: %s is not a JSON object: fix or remove it first", p)
	}
	return m, nil
}

// subObject returns m[k] as an object, replacing anything else with a
// new empty one.
func subObject(m map[string]any, k string) map[string]any {
	o, ok := m[k].(map[string]any)
	if !ok {
		o = map[string]any{}
		m[k] = o
	}
	return o
}

// writeAtomic writes path through a temporary file in its directory,
// synced, renamed over path, and the directory synced.
func writeAtomic(path string, perm os.FileMode, write func(*os.File) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op after the rename
	err = write(f)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync() // best effort: not every system syncs a directory
		d.Close()
	}
	return nil
}

// InstallSh is the stand-in install.sh [WriteInstallers] writes. The
// real installers are the Rust client's (built by the real server's
// scripts/build-client.sh); this one only shows the shape the join
// installer endpoint works on: a shebang first, then a body that uses
// METNOS_SERVER and METNOS_TOKEN, which the endpoint sets on the lines
// right after the shebang.
const InstallSh = `#!/bin/sh
# Stand-in installer of metnos-refserver (not the Rust client's install.sh).
# The join endpoint puts METNOS_SERVER and METNOS_TOKEN right after line 1.
set -eu
: "${METNOS_SERVER:?METNOS_SERVER is not set}"
: "${METNOS_TOKEN:?METNOS_TOKEN is not set}"
exec metnos-agent register --server "$METNOS_SERVER" --token "$METNOS_TOKEN"
`

// InstallPs1 is the stand-in install.ps1 [WriteInstallers] writes (the
// real one is the Rust client's): the join endpoint appends it, intact,
// after the batch head of the .cmd it serves.
const InstallPs1 = "# Stand-in installer of metnos-refserver (not the Rust client's install.ps1).\r\n" +
	"$ErrorActionPreference = 'Stop'\r\n" +
	"& metnos-agent.exe register --server $env:METNOS_SERVER --token $env:METNOS_TOKEN\r\n" +
	"exit $LASTEXITCODE\r\n"

// WriteInstallers writes the stand-in [InstallSh] and [InstallPs1] into
// the mirror directory dir, each only when absent (an operator's real
// installers are never replaced). It returns the paths it wrote.
func WriteInstallers(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("refserver: installers: %w", err)
	}
	var wrote []string
	for _, nb := range [][2]string{{"install.sh", InstallSh}, {"install.ps1", InstallPs1}} {
		name, body := nb[0], nb[1]
		p := filepath.Join(dir, name)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return wrote, fmt.Errorf("refserver: installers: %w", err)
		}
		_, err = f.WriteString(body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return wrote, fmt.Errorf("refserver: installers: writing %s: %w", p, err)
		}
		wrote = append(wrote, p)
	}
	return wrote, nil
}
