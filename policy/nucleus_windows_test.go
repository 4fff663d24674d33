package policy

import (
	"slices"
	"testing"
)

// TestWindowsNucleus: on Windows the nucleus also holds what Windows
// keeps in the profile folders (browser profiles, the DPAPI master keys,
// the credential stores), as Windows paths; ~/.ssh stays, where Windows'
// OpenSSH keeps its keys.
func TestWindowsNucleus(t *testing.T) {
	home := `C:\Users\u`
	var paths []string
	for _, m := range Nucleus(Host{Home: home, AgentDataDirs: []string{`C:\Users\u\AppData\Local\metnos`}}) {
		paths = append(paths, m.Path)
	}
	for _, want := range []string{
		home + `\.ssh`,
		home + `\AppData\Local\Google\Chrome\User Data`,
		home + `\AppData\Local\Microsoft\Edge\User Data`,
		home + `\AppData\Roaming\Mozilla`,
		home + `\AppData\Roaming\Microsoft\Protect`,
		home + `\AppData\Roaming\Microsoft\Credentials`,
		home + `\AppData\Local\metnos`,
	} {
		if !slices.Contains(paths, want) {
			t.Errorf("the nucleus lacks %s: %v", want, paths)
		}
	}
}
