package cli

import (
	"strings"
	"testing"
)

// TestUpdateDevBuild: a development build (version dev, as `go build`
// without a release's stamp makes, and as this test binary is) has no
// release to be replaced by. `metnos-agent update` and `update --check`
// say so in one sentence and exit 1, rather than crash.
func TestUpdateDevBuild(t *testing.T) {
	if v := version(); v != "dev" {
		t.Skipf("this test binary is version %q, not a development build", v)
	}
	for _, args := range [][]string{{"--check"}, nil} {
		std, e, out, errb := identityStd(t, false)
		writePaired(t, e)
		var code int
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("update %v panicked: %v", args, r)
				}
			}()
			code = runUpdate(std, args)
		}()
		if code != exitFailure || !strings.Contains(errb.String(), "development build") {
			t.Errorf("update %v: exit %d, stdout %q, stderr %q; want exit %d saying it is a development build", args, code, out, errb, exitFailure)
		}
	}
}
