package wire

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func v3Invocation(t *testing.T, sig string) map[string]any {
	t.Helper()
	return decode(t, `{"invocation_id":"inv-18ed65bd51bdc701fcd26b58","turn_id":"turn-1","executor":"echo_args",
		"manifest_sha256":"`+v3Manifest+`","code_sha256":"`+v3Code+`",
		"args":{"q":"città","n":3,"paths":["C:\\Users\\x\\Documents"]},"scope":"device","reversibility":"read_only",
		"env_injections":{"METNOS_TURN_ID":"turn-1","METNOS_LANG":"it"},"deadline_ms":30000,"server_sig":"`+sig+`"}`).(map[string]any)
}

func TestParseAndVerifyInvocation(t *testing.T) {
	const sig = "LRpJ9kJt-JzmV1Ms2feZQBRYROSag4aZgO5bJhxlwLkw1qe_9wqq9cjFFyLNmkwX7hjpKAWt0L0x6UbcpQeICg"
	inv, err := ParseInvocation(v3Invocation(t, sig))
	if err != nil {
		t.Fatal(err)
	}
	if inv.DeadlineMS != 30000 || inv.Env["METNOS_LANG"] != "it" || inv.Executor != "echo_args" {
		t.Errorf("parsed %+v", inv)
	}
	pub := testKey(t).Public().(ed25519.PublicKey)
	if err := inv.Verify(pub); err != nil {
		t.Errorf("V3 does not verify: %v", err)
	}
	// A tampered argument, or another key, fails.
	inv.Raw["args"].(map[string]any)["q"] = "roma"
	if err := inv.Verify(pub); !errors.Is(err, ErrBadSignature) {
		t.Errorf("tampered args verified: %v", err)
	}
	other := ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey)
	inv2, _ := ParseInvocation(v3Invocation(t, sig))
	if err := inv2.Verify(other); !errors.Is(err, ErrBadSignature) {
		t.Errorf("another key verified: %v", err)
	}
}

func TestParseInvocationRejects(t *testing.T) {
	for name, mutate := range map[string]func(m map[string]any){
		"no id":                func(m map[string]any) { delete(m, "invocation_id") },
		"numeric executor":     func(m map[string]any) { m["executor"] = 3 },
		"env value not string": func(m map[string]any) { m["env_injections"] = map[string]any{"A": true} },
		"float deadline":       func(m map[string]any) { m["deadline_ms"] = decode(t, `1.5`) },
		"no signature":         func(m map[string]any) { delete(m, "server_sig") },
	} {
		m := v3Invocation(t, "x")
		mutate(m)
		if _, err := ParseInvocation(m); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", name, err)
		}
	}
}

func timedIDAt(at time.Time) string { return fmt.Sprintf("inv-%016x%s", at.UnixNano(), "5c6a9839") }

func TestCheckID(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		id string
		ok bool
	}{
		{timedIDAt(now.Add(-time.Hour)), true},
		{timedIDAt(now.Add(-49 * time.Hour)), false},
		{timedIDAt(now.Add(time.Minute)), true},
		{timedIDAt(now.Add(10 * time.Minute)), false},
		// Durable ids carry no time: accepted, never stalling later work.
		{"inv-durable-" + strings.Repeat("ab", 16), true},
		{"short", false},
		{"inv/../../etc", false},
		{strings.Repeat("a", 257), false},
	} {
		if err := CheckID(c.id, now); (err == nil) != c.ok {
			t.Errorf("CheckID(%q) = %v, want ok=%v", c.id, err, c.ok)
		}
	}
}
