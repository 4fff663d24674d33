package wire

import (
	"crypto/ed25519"
	"encoding/hex"
	"strings"
	"testing"
)

func TestRuntimeDescriptorVectorV4(t *testing.T) {
	const (
		name  = "cpython-3.12.13+20260623-x86_64-pc-windows-msvc-install_only.tar.gz"
		sum   = "22c27b021752596140145a93194d9cdf33b0b1b454f50fd1b430491eb3eb3cb9"
		canon = `{"archive_sha256":"` + sum + `","archive_size":25600,"filename":"` + name + `","version":1}`
		sig   = "bGnriNvpflq6k6vr28uxDE8dDfHsw_8EzD9d8LDcRern3i6uLWyoWfzLWRMXQNPEBo55ySVeA0AnHeDWOUAxAg"
	)
	env, err := SignRuntimeDescriptor(testKey(t), name, sum, 25600)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := Canonical(env["descriptor"]); string(got) != canon {
		t.Errorf("canonical descriptor %s", got)
	}
	if env["sig"] != sig {
		t.Errorf("sig %s, want V4 %s", env["sig"], sig)
	}
	if err := VerifyBytes(testKey(t).Public().(ed25519.PublicKey), []byte(canon), sig); err != nil {
		t.Error(err)
	}
}

func TestValidRuntimeName(t *testing.T) {
	cases := map[string]bool{
		"cpython-3.12+x.tar.gz": true, "a.tar.gz": true, "": false, ".tar.gz": true, "x.tgz": false,
		"a/b.tar.gz": false, `a\b.tar.gz`: false, "a..tar.gz": false, "a b.tar.gz": false,
		string(make([]byte, 241)): false,
	}
	for in, want := range cases {
		if got := ValidRuntimeName(in); got != want {
			t.Errorf("ValidRuntimeName(%q) = %v", in, got)
		}
	}
}

// TestDescriptorVector: the protocol's V4 vector verifies; a changed
// field, another name or another key does not.
func TestDescriptorVector(t *testing.T) {
	seed, _ := hex.DecodeString("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	key := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	const name = "cpython-3.12.13+20260623-x86_64-pc-windows-msvc-install_only.tar.gz"
	env := `{"descriptor": {"version": 1, "filename": "` + name + `", "archive_sha256": "22c27b021752596140145a93194d9cdf33b0b1b454f50fd1b430491eb3eb3cb9", "archive_size": 25600}, "sig": "bGnriNvpflq6k6vr28uxDE8dDfHsw_8EzD9d8LDcRern3i6uLWyoWfzLWRMXQNPEBo55ySVeA0AnHeDWOUAxAg"}`
	d, err := VerifyRuntimeDescriptor([]byte(env), key, name)
	if err != nil || d.ArchiveSize != 25600 {
		t.Fatalf("V4: %+v %v", d, err)
	}
	for what, body := range map[string]string{
		"size changed": strings.Replace(env, "25600", "25601", 1),
		"other name":   env,
	} {
		n := name
		if what == "other name" {
			n = "other.tar.gz"
		}
		if _, err := VerifyRuntimeDescriptor([]byte(body), key, n); err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
	other, _, _ := ed25519.GenerateKey(nil)
	if _, err := VerifyRuntimeDescriptor([]byte(env), other, name); err == nil {
		t.Error("another key: accepted")
	}
}

func TestSafePath(t *testing.T) {
	for p, want := range map[string]bool{
		"a.py": true, "lib/b.py": true, "": false, "/etc/x": false, "a/": false, "a//b": false,
		"./a": false, "a/../b": false, `a\b`: false, "C:x": false, "..": false,
	} {
		if SafePath(p) != want {
			t.Errorf("SafePath(%q) = %v", p, !want)
		}
	}
}
