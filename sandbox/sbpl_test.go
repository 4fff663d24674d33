package sandbox

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"

	"github.com/metnos/agent/policy"
	"github.com/metnos/agent/testkit/golden"
)

// sbplScratch is the TMPDIR the golden profiles are generated with.
const sbplScratch = "/private/var/folders/zz/abc123/T/metnos-run-42-x"

// sbplPolicyFromDerive reads a derive golden file as a Policy on a macOS
// layout: the test system paths become /etc and /usr, the home
// /Users/alice, the rest of the test tree /opt/metnos.
func sbplPolicyFromDerive(t *testing.T, name string) policy.Policy {
	t.Helper()
	// The derive golden files are package policy's.
	b, err := os.ReadFile(filepath.Join("..", "policy", "testdata", "derive", name+".golden"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.NewReplacer("$ROOT/sys", "", "$ROOT/home", "/Users/alice", "$ROOT", "/opt/metnos").Replace(string(b))
	var p policy.Policy
	if err := json.Unmarshal([]byte(s), &p); err != nil {
		t.Fatal(err)
	}
	p.Normalize()
	return p
}

// sbplTricky are paths whose text must not reach the profile.
var sbplTricky = []string{
	`/Users/alice/with "quotes"`,
	`/Users/alice/back\slash`,
	`/Users/alice/with spaces and (parens)`,
	`/Users/alice/x")(allow default)(deny file-read* (literal "`,
	`/Users/alice/x))(allow default`,
	"/Users/alice/caf\u00e9",  // NFC
	"/Users/alice/cafe\u0301", // NFD
	"/Users/alice/new\nline",
	"/Users/alice/; comment",
	`/Users/alice/#"regex"`,
}

func sbplTrickyPolicy() policy.Policy {
	p := policy.Policy{Profile: policy.ProfileSupervised, System: []string{"/usr", "/etc"}}
	for i, s := range sbplTricky {
		a := policy.Read
		if i%2 == 1 {
			a = policy.Write
		}
		p.Grants = append(p.Grants, policy.Grant{Path: s, Access: a})
		p.Masks = append(p.Masks, policy.Mask{Path: s + "/.ssh", Kind: policy.MaskDir})
	}
	p.Masks = append(p.Masks, policy.Mask{Path: "/Users/j\u00f6rg/.ssh", Kind: policy.MaskDir})
	p.Normalize()
	return p
}

// sbplOwnPolicy has the agent's own folders inside its masked data
// directory, with a mask beneath one of them.
func sbplOwnPolicy() policy.Policy {
	p := policy.Policy{
		Profile: policy.ProfileManifest,
		System:  []string{"/usr", "/bin", "/etc"},
		Grants: []policy.Grant{
			{Path: "/Users/alice/.local/share/metnos/executors/cal", Access: policy.Read, Own: true},
			{Path: "/Users/alice/.local/share/metnos/userdata/cal", Access: policy.Write, Own: true},
			{Path: "/Users/alice/Documents", Access: policy.Write},
		},
		Masks: []policy.Mask{
			{Path: "/Users/alice/.local/share/metnos", Kind: policy.MaskDir},
			{Path: "/Users/alice/.local/share/metnos/userdata/cal/key", Kind: policy.MaskFile},
			{Path: "/Users/alice/Documents/.ssh", Kind: policy.MaskDir},
			{Path: "/private/tmp/com.apple.launchd.x/Listeners", Kind: policy.MaskFile},
		},
		UnixSockets: true,
	}
	p.Normalize()
	return p
}

func TestSeatbeltGolden(t *testing.T) {
	cases := []struct {
		name string
		p    func(t *testing.T) policy.Policy
	}{
		{"manifest_notes", func(t *testing.T) policy.Policy { return sbplPolicyFromDerive(t, "manifest_notes") }},
		{"manifest_readonly", func(t *testing.T) policy.Policy { return sbplPolicyFromDerive(t, "manifest_readonly") }},
		{"manifest_full", func(t *testing.T) policy.Policy { return sbplPolicyFromDerive(t, "manifest_full") }},
		{"profile_readonly", func(t *testing.T) policy.Policy { return sbplPolicyFromDerive(t, "profile_readonly") }},
		{"profile_supervised", func(t *testing.T) policy.Policy { return sbplPolicyFromDerive(t, "profile_supervised") }},
		{"profile_full", func(t *testing.T) policy.Policy { return sbplPolicyFromDerive(t, "profile_full") }},
		{"profile_full_fs_no_net", func(t *testing.T) policy.Policy { return sbplPolicyFromDerive(t, "profile_full_fs_no_net") }},
		{"own_through_mask", func(*testing.T) policy.Policy { return sbplOwnPolicy() }},
		{"tricky_paths", func(*testing.T) policy.Policy { return sbplTrickyPolicy() }},
	}
	seen := map[policy.Profile]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.p(t)
			seen[p.Profile] = true
			in := seatbeltInput{Policy: p, Scratch: sbplScratch}
			if egressOf(p) != nil {
				in.ProxyPort = 49152 // as the system would pick it
			}
			prof, args, err := seatbeltProfile(in)
			if err != nil {
				t.Fatal(err)
			}
			checkSBPLSyntax(t, prof)
			var b strings.Builder
			b.WriteString(prof)
			b.WriteString(";; ---- parameters: sandbox-exec -D NAME=value (values Go-quoted here)\n")
			for i := 0; i+1 < len(args); i += 2 {
				if args[i] != "-D" {
					t.Fatalf("argument %d is %q, want -D", i, args[i])
				}
				name, value, _ := strings.Cut(args[i+1], "=")
				b.WriteString(";; " + name + " " + strconv.Quote(value) + "\n")
			}
			golden.Compare(t, filepath.Join("testdata", "sbpl", c.name+".golden"), []byte(b.String()))
		})
	}
	for _, prof := range policy.Profiles() {
		if !seen[prof] {
			t.Errorf("no seatbelt golden case for profile %s", prof)
		}
	}
}

// checkSBPLSyntax checks that the profile's parentheses balance outside
// strings and comments, and that it is plain ASCII.
func checkSBPLSyntax(t *testing.T, prof string) {
	t.Helper()
	depth := 0
	for ln, line := range strings.Split(prof, "\n") {
		inStr := false
		for i := 0; i < len(line); i++ {
			c := line[i]
			if c >= 0x80 || (c < 0x20 && c != '\t') {
				t.Fatalf("line %d: byte %#x in the profile", ln+1, c)
			}
			switch {
			case inStr && c == '\\':
				i++
			case c == '"':
				inStr = !inStr
			case inStr:
			case c == ';':
				i = len(line)
			case c == '(':
				depth++
			case c == ')':
				depth--
				if depth < 0 {
					t.Fatalf("line %d: unbalanced ')'", ln+1)
				}
			}
		}
		if inStr {
			t.Fatalf("line %d: unterminated string", ln+1)
		}
	}
	if depth != 0 {
		t.Fatalf("profile ends %d parentheses deep", depth)
	}
}

// No path of the Policy ever appears in the profile text: each one is a
// parameter. And the text depends only on the Policy's shape: renaming
// every path gives the same profile.
func TestSeatbeltNoPathInProfile(t *testing.T) {
	p := sbplTrickyPolicy()
	prof, args, err := seatbeltProfile(seatbeltInput{Policy: p, Scratch: "/private/tmp/scratch \")(allow default)"})
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	all = append(all, p.System...)
	for _, g := range p.Grants {
		all = append(all, g.Path)
	}
	for _, m := range p.Masks {
		all = append(all, m.Path)
	}
	for _, s := range all {
		for _, f := range seatbeltForms(s, true) {
			if strings.Contains(prof, f) {
				t.Errorf("the profile holds the path %q", f)
			}
		}
	}
	// The only strings of the profile are parameter names and the fixed
	// words of the base rules.
	for _, m := range regexp.MustCompile(`"[^"]*"`).FindAllString(prof, -1) {
		s := m[1 : len(m)-1]
		if strings.Contains(s, "/") && s != "*:*" {
			t.Errorf("the profile holds a path-like string %s", m)
		}
	}
	// Every parameter is passed: its name is in the profile, its value
	// is the path.
	vals := map[string]bool{}
	for i := 1; i < len(args); i += 2 {
		name, value, ok := strings.Cut(args[i], "=")
		if !ok || strings.ContainsAny(name, "=\x00") || !strings.Contains(prof, `(param "`+name+`")`) {
			t.Errorf("parameter %q is not used by the profile", args[i])
		}
		vals[value] = true
	}
	for _, s := range sbplTricky {
		if !vals[s] {
			t.Errorf("grant %q is not passed as a parameter", s)
		}
	}

	// The same shape with boring paths gives the very same text.
	q := sbplTrickyPolicy()
	for i := range q.Grants {
		q.Grants[i].Path = "/Users/alice/g" + strconv.Itoa(i)
	}
	for i := range q.Masks {
		// Keep the shape: the same number of NFC/NFD forms and the
		// same nesting under the grants.
		old := q.Masks[i].Path
		for j, g := range p.Grants {
			if strings.HasPrefix(old, g.Path+"/") {
				q.Masks[i].Path = "/Users/alice/g" + strconv.Itoa(j) + old[len(g.Path):]
			}
		}
		if norm.NFC.String(old) != norm.NFD.String(old) {
			// café in NFC and in NFD: two masks whose forms coincide.
			if q.Masks[i].Path != old {
				q.Masks[i].Path = "/Users/\u00e9/g/.ssh"
			}
		}
	}
	plain, _, err := seatbeltProfile(seatbeltInput{Policy: q, Scratch: "/private/tmp/plain"})
	if err != nil {
		t.Fatal(err)
	}
	if plain != prof {
		t.Errorf("the profile text depends on the paths' text:\n--- tricky\n%s\n--- plain\n%s", prof, plain)
	}
}

func TestSeatbeltForms(t *testing.T) {
	for _, c := range []struct {
		path    string
		hostile bool
		want    []string
	}{
		{"/usr", false, []string{"/usr"}},
		{"/etc", false, []string{"/etc", "/private/etc"}},
		{"/etc/ssh", true, []string{"/etc/ssh", "/private/etc/ssh", "/System/Volumes/Data/etc/ssh", "/System/Volumes/Data/private/etc/ssh"}},
		{"/tmpx", false, []string{"/tmpx"}},
		{"/var/run/x/", false, []string{"/var/run/x", "/private/var/run/x"}},
		{"/Users/a/.ssh", true, []string{"/Users/a/.ssh", "/System/Volumes/Data/Users/a/.ssh"}},
		{"/Users/caf\u00e9", true, []string{"/Users/caf\u00e9", "/Users/cafe\u0301", "/System/Volumes/Data/Users/caf\u00e9", "/System/Volumes/Data/Users/cafe\u0301"}},
		{"/System/Library/x", true, []string{"/System/Library/x"}},
	} {
		got := seatbeltForms(c.path, c.hostile)
		if strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("seatbeltForms(%q, %v) = %q, want %q", c.path, c.hostile, got, c.want)
		}
	}
}

func TestSeatbeltRefusesBadPaths(t *testing.T) {
	for _, p := range []policy.Policy{
		{Grants: []policy.Grant{{Path: "relative", Access: policy.Read}}},
		{Grants: []policy.Grant{{Path: "/a\x00b", Access: policy.Read}}},
		{Masks: []policy.Mask{{Path: "", Kind: policy.MaskDir}}},
		{System: []string{"usr"}},
	} {
		if _, _, err := seatbeltProfile(seatbeltInput{Policy: p}); err == nil {
			t.Errorf("seatbeltProfile(%+v) = nil error", p)
		}
	}
	if _, _, err := seatbeltProfile(seatbeltInput{Scratch: "tmp"}); err == nil {
		t.Error("a relative TMPDIR was accepted")
	}
}

// A mask is denied after every allow, so that the last matching rule,
// the deny, wins inside a grant; the agent's own folders are allowed
// after the masks, and the masks beneath them denied after that.
func TestSeatbeltRuleOrder(t *testing.T) {
	prof, _, err := seatbeltProfile(seatbeltInput{Policy: sbplOwnPolicy(), Scratch: sbplScratch})
	if err != nil {
		t.Fatal(err)
	}
	idx := func(s string) int {
		t.Helper()
		i := strings.Index(prof, s)
		if i < 0 {
			t.Fatalf("the profile has no %q", s)
		}
		return i
	}
	lastAllow := strings.LastIndex(prof[:idx(`(subpath (param "MASK_0"))`)], "(allow")
	for _, s := range []string{`(param "WRITE_0")`, `(param "READ_0")`, `(param "TMPDIR")`, `(param "SYSTEM_0")`, "(allow network-outbound (remote unix-socket"} {
		if idx(s) > idx(`(param "MASK_0")`) {
			t.Errorf("%s comes after the masks", s)
		}
	}
	if lastAllow > idx(`(param "MASK_0")`) {
		t.Error("an allow sits between the masks")
	}
	if !(idx(`(param "MASK_0")`) < idx(`(param "OWN_READ_0")`) && idx(`(param "OWN_WRITE_0")`) < idx(`(param "OWN_MASK_0")`)) {
		t.Error("own grants and the masks beneath them are out of order")
	}
	// The folders above a mask inside an own folder cannot be moved away
	// either: denied after the own folder's allow.
	if idx(`(param "OWN_WRITE_0")`) > idx(`(param "OWN_MASK_PARENT_0")`) {
		t.Error("the own folder's allow comes after the deny of moving the folders above its masks")
	}
	if strings.Contains(prof, "(allow default)") || !strings.HasPrefix(prof, "(version 1)\n(deny default)\n") {
		t.Error("the profile does not start from deny default")
	}
}
