package wire

import (
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"
)

func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"0.2.20", "0.2.18", 1},
		{"0.2.9", "0.2.10", -1},
		{"1.0.0", "1.0.0", 0},
		{"v1.2.3", "1.2.3", 0},
		{"1.2", "1.2.0", -1},
		{"1.x.3", "1.0.3", 0}, // a part that is no number counts as 0
		{"10.0", "9.99", 1},
	} {
		if got := CompareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestComponentDescriptor(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	otherPub, _, _ := ed25519.GenerateKey(nil)
	sha := strings.Repeat("ab", 32)
	good := ComponentDescriptor{Component: AgentComponent, Version: "0.9.4", Target: "linux-amd64", SHA256: sha, URLPath: "/agent/client/0.9.4/linux-amd64/metnos-agent"}
	sign := func(d ComponentDescriptor, edit func(map[string]any)) []byte {
		m, err := SignComponentDescriptor(key, d)
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(m)
		}
		b, _ := json.Marshal(m)
		return b
	}
	if d, err := VerifyComponentDescriptor(sign(good, nil), pub, AgentComponent, "linux-amd64"); err != nil || d != good {
		t.Fatalf("a good descriptor: %+v, %v", d, err)
	}
	helper := good
	helper.Component = "helper"
	badPath := good
	badPath.URLPath = "/agent/client/../../etc/passwd"
	for name, tc := range map[string]struct {
		body              []byte
		key               ed25519.PublicKey
		component, target string
		want              string
	}{
		"tampered version": {sign(good, func(m map[string]any) { m["version"] = "9.9.9" }), pub, AgentComponent, "linux-amd64", "not signed"},
		"tampered sha256":  {sign(good, func(m map[string]any) { m["sha256"] = strings.Repeat("cd", 32) }), pub, AgentComponent, "linux-amd64", "not signed"},
		"another key":      {sign(good, nil), otherPub, AgentComponent, "linux-amd64", "not signed"},
		"wrong component":  {sign(helper, nil), pub, AgentComponent, "linux-amd64", "another program"},
		"wrong target":     {sign(good, nil), pub, AgentComponent, "linux-arm64", "target"},
		"unsafe url_path":  {sign(badPath, nil), pub, AgentComponent, "linux-amd64", "url_path"},
		"not json":         {[]byte("<html>"), pub, AgentComponent, "linux-amd64", "not a JSON object"},
	} {
		if _, err := VerifyComponentDescriptor(tc.body, tc.key, tc.component, tc.target); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one saying %q", name, err, tc.want)
		}
	}
}
