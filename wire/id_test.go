package wire

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// TestIDRulesAreTheServers: ValidID and the issue time agree with the
// server's own patterns, on ids of every shape.
func TestIDRulesAreTheServers(t *testing.T) {
	idRule := regexp.MustCompile(`^[A-Za-z0-9._:-]{8,256}$`)
	timed := regexp.MustCompile(`^inv-([0-9a-f]{16})[0-9a-f]{8}$`)
	alphabet := "abcfgzAFZ09._:-/ é\x00inv-"
	r := rand.New(rand.NewPCG(1, 2))
	ids := []string{"", "inv-18edbda8eb29e87f789d1bfc", "inv-18EDBDA8EB29E87F789D1BFC", "inv-18edbda8eb29e87f789d1bf", "job:backup-nightly", "1234567", "12345678"}
	for range 20000 {
		n := r.IntN(40)
		if r.IntN(10) == 0 {
			n = 250 + r.IntN(10)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		if r.IntN(3) == 0 {
			b = append([]byte("inv-"), []byte("0123456789abcdef0123456789abcdef")[:24]...)
			b[4+r.IntN(24)] = "0123456789abcdefg"[r.IntN(17)]
		}
		ids = append(ids, string(b))
	}
	for _, id := range ids {
		if got, want := ValidID(id), idRule.MatchString(id); got != want {
			t.Fatalf("ValidID(%q) = %v, the server's pattern says %v", id, got, want)
		}
		hex, got := timedNS(id)
		m := timed.FindStringSubmatch(id)
		if want := m != nil; got != want || (got && hex != m[1]) {
			t.Fatalf("timedNS(%q) = %q %v, the pattern says %v", id, hex, got, m)
		}
	}
}
