//go:build linux

package hostile

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/sandbox"
)

// TestGrantSwapRace: while another process of the user's keeps swapping
// a granted directory with a symbolic link to ~/.ssh (renameat2
// RENAME_EXCHANGE), runs that read the grant must never see the key. The
// swap is proven live by reading the same path on the host, which does
// see the key sometimes.
func TestGrantSwapRace(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		fx := newFixture(t)
		sub, link := filepath.Join(fx.Work, "sub"), filepath.Join(fx.Work, "sublink")
		mkdir(t, sub, 0o755)
		writeFile(t, filepath.Join(sub, "id_rsa"), "HARMLESS\n", 0o644)
		symlink(t, fx.path(".ssh"), link)
		key := fx.Secrets[0].Token

		var stop atomic.Bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			for !stop.Load() {
				_ = unix.Renameat2(unix.AT_FDCWD, sub, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE)
			}
		}()
		defer func() { stop.Store(true); <-done }()

		seenOutside := false
		for i := 0; i < 20000 && !seenOutside; i++ {
			b, _ := os.ReadFile(filepath.Join(sub, "id_rsa"))
			seenOutside = strings.Contains(string(b), key)
		}
		if !seenOutside {
			t.Fatal("the swap never exposed the key even on the host, so this test proves nothing")
		}

		// Most attempts are refused (the swap is fast); go on until a few
		// runs have started, within a bound.
		ran, tries := 0, 0
		for ; tries < 600 && ran < 10; tries++ {
			pol, err := policy.ForProfile(policy.ProfileInput{Profile: policy.ProfileSupervised, Read: []string{sub}, Host: fx.Host})
			if err != nil {
				continue // the swap made the path a link into the nucleus: refused, as it should be
			}
			r, err := tryInside(fx, pol, shArgv("cat "+sub+"/id_rsa"), sandbox.Limits{})
			if err != nil {
				continue // the grant changed before it was bound: refused
			}
			ran++
			if strings.Contains(r.stdout, key) {
				t.Fatalf("ATTACK SUCCEEDED inside the sandbox (%s): the key was read through a swapped grant\n%s", m.word(), r)
			}
		}
		if ran == 0 {
			t.Fatal("no run got as far as the command, so this test proves nothing")
		}
		t.Logf("%d of %d runs started (the others were refused); none saw the key", ran, tries)
	})
}
