package pairing

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testToken = "DEV.eyJ0aWQiOiJhYmMxMjMiLCJuIjoibGFwdG9wIn0.c2lnbmF0dXJlX2J5dGVz-_"

func TestParseInviteJoinLink(t *testing.T) {
	const want = "http://metnos.tail1234.ts.net:8765/agent/client/join/0123456789abcdef"
	for _, in := range []string{
		want,
		want + "/",
		"  " + want + "\n",
		"<" + want + ">",
		`"` + want + `"`,
		"'" + want + "/'",
		"`" + want + "`",
		"\t<\"" + want + "\">\r\n",
	} {
		inv, err := ParseInvite(in)
		if err != nil {
			t.Errorf("ParseInvite(%q): %v", in, err)
			continue
		}
		if inv.JoinURL != want || inv.Server != "" || inv.Token != "" {
			t.Errorf("ParseInvite(%q) = %+v, want the join link %s", in, inv, want)
		}
	}
	// A server behind a path prefix, over https, keeps its prefix.
	inv, err := ParseInvite("https://home.example/metnos/agent/client/join/abcdef0123456789abcdef0123456789")
	if err != nil || inv.JoinURL != "https://home.example/metnos/agent/client/join/abcdef0123456789abcdef0123456789" {
		t.Errorf("prefixed link: %+v, %v", inv, err)
	}
}

func TestParseInviteRefused(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "the link is empty"},
		{"   \n", "the link is empty"},
		{"metnos:8765/agent/client/join/0123456789abcdef", "not a URL"},
		{"ftp://metnos/agent/client/join/0123456789abcdef", "does not start with http:// or https://"},
		{"http://metnos:8765/agent/client/join/0123456789abcdef/installer", `has /installer after the join id`},
		{"http://metnos:8765/agent/client/join/0123456789abcdef/status", `has /status after the join id`},
		{"http://metnos:8765/agent/client/join/0123456789abcdef?platform=linux", "has something after the join id"},
		{"http://metnos:8765/agent/client/join/0123456789abcdef#x", "has something after the join id"},
		{"http://metnos:8765/agent/client/join/0123456", "not 8 to 32 lowercase hex digits"},
		{"http://metnos:8765/agent/client/join/0123456789ABCDEF", "not 8 to 32 lowercase hex digits"},
		{"http://metnos:8765/agent/client/join/0123456789abcdef0123456789abcdef0", "not 8 to 32 lowercase hex digits"},
		{"http://metnos:8765/agent/client/join/", "not 8 to 32 lowercase hex digits"},
		{"http://metnos:8765/admin/devices", "is not a join link"},
		{"http://user:pw@metnos:8765/agent/client/join/0123456789abcdef", "user name or password"},
		{"http://metnos:8765/agent/client/join/0123456789abcdef\x1b[2J", "U+001B (ESC)"},
		{"http://metnos:8765/agent/client/join/0123456789abcdef and more", "holds spaces"},
		// One-liners that are not whole or not sane.
		{"METNOS_TOKEN=" + testToken + " sh", "sets METNOS_TOKEN but not METNOS_SERVER"},
		{"METNOS_SERVER=http://metnos:8765 sh", "sets METNOS_SERVER but not METNOS_TOKEN"},
		{"METNOS_SERVER= METNOS_TOKEN= sh", "sets neither"},
		{"METNOS_SERVER=http://a:1 METNOS_SERVER=http://b:1 METNOS_TOKEN=" + testToken, "set twice, to different values"},
		{"METNOS_SERVER='http://a:1 METNOS_TOKEN=" + testToken, "not closed by its quote"},
		{"METNOS_SERVER=metnos:8765 METNOS_TOKEN=" + testToken, "METNOS_SERVER: the server URL"},
		{"METNOS_SERVER=http://a:1/?x=1 METNOS_TOKEN=" + testToken, "holds characters no server URL of Metnos has"},
		{"METNOS_SERVER='http://a:1/$(id)' METNOS_TOKEN=" + testToken, "holds characters no server URL of Metnos has"},
		{"METNOS_SERVER=http://a:1 METNOS_TOKEN=TOKEN", "is not a device token"},
		{"METNOS_SERVER=http://a:1 METNOS_TOKEN='DEV.a.b;rm -rf ~'", "is not a device token"},
	} {
		inv, err := ParseInvite(tc.in)
		if err == nil {
			t.Errorf("ParseInvite(%q) = %+v, want an error", tc.in, inv)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseInvite(%q): %v, want it to say %q", tc.in, err, tc.want)
		}
		if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "\x1b") {
			t.Errorf("ParseInvite(%q): error %q is not one clean line", tc.in, err)
		}
	}
}

func TestParseInviteOneLiners(t *testing.T) {
	const server = "http://metnos.tail1234.ts.net:8765"
	for _, in := range []string{
		// The Linux one-liner of the Devices page, as shown (three lines)...
		"curl -fsSL " + server + "/agent/client/install.sh | \\\n  METNOS_SERVER=" + server + " \\\n  METNOS_TOKEN=" + testToken + " sh",
		// ...with CRLF, as pasted from some chats...
		"curl -fsSL " + server + "/agent/client/install.sh | \\\r\n  METNOS_SERVER=" + server + " \\\r\n  METNOS_TOKEN=" + testToken + " sh\r\n",
		// ...and joined on one line.
		"curl -fsSL " + server + "/agent/client/install.sh | METNOS_SERVER=" + server + " METNOS_TOKEN=" + testToken + " sh",
		// The PowerShell one, on two lines and on one.
		"$env:METNOS_SERVER='" + server + "'; $env:METNOS_TOKEN='" + testToken + "'; `\niwr " + server + "/agent/client/install.ps1 -UseBasicParsing | iex",
		"$env:METNOS_SERVER = '" + server + "'; $env:METNOS_TOKEN = '" + testToken + "'; iwr " + server + "/agent/client/install.ps1 -UseBasicParsing | iex",
		// export, cmd's set, double and no quotes.
		"export METNOS_SERVER=\"" + server + "\"\nexport METNOS_TOKEN=\"" + testToken + "\"",
		"export METNOS_SERVER=" + server + "; export METNOS_TOKEN=" + testToken,
		"set \"METNOS_SERVER=" + server + "\"\r\nset \"METNOS_TOKEN=" + testToken + "\"\r\n",
		"set METNOS_SERVER=" + server + "\nset METNOS_TOKEN=" + testToken,
		// The same value twice is no conflict.
		"METNOS_SERVER=" + server + " METNOS_SERVER='" + server + "' METNOS_TOKEN=" + testToken,
	} {
		inv, err := ParseInvite(in)
		if err != nil {
			t.Errorf("ParseInvite(%q): %v", in, err)
			continue
		}
		if inv.Server != server || inv.Token != testToken || inv.JoinURL != "" {
			t.Errorf("ParseInvite(%q) = %+v, want server %s and the token", in, inv, server)
		}
	}
}

func TestParseInstallerRealShapes(t *testing.T) {
	for _, tc := range []struct{ file, server string }{
		{"linux.sh", "http://metnos.tail1234.ts.net:8765"},
		{"linux-noshebang.sh", "http://127.0.0.1:8765"},
		{"windows.cmd", "http://192.168.1.10:8765"},
	} {
		b, err := os.ReadFile(filepath.Join("testdata", "installer", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		server, token, err := ParseInstaller(b)
		if err != nil {
			t.Errorf("%s: %v", tc.file, err)
			continue
		}
		if server != tc.server || token != testToken {
			t.Errorf("%s: got %q, %q; want %q and the token", tc.file, server, token, tc.server)
		}
	}
	// A Host header with a quote: _sh_squote quoted it, it is read back
	// as it was, and refused as no server URL.
	b, err := os.ReadFile(filepath.Join("testdata", "installer", "linux-quote.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ParseInstaller(b); err == nil || !strings.Contains(err.Error(), `"http://evil'host:8765" holds characters`) {
		t.Errorf("linux-quote.sh: %v, want the quote read back and refused", err)
	}
}

func TestParseInstallerRefused(t *testing.T) {
	sh := func(server, token string) string {
		return "#!/bin/sh\nMETNOS_SERVER=" + server + "; export METNOS_SERVER\nMETNOS_TOKEN=" + token + "; export METNOS_TOKEN\nrest\n"
	}
	for _, tc := range []struct{ name, body, want string }{
		{"html", "<!DOCTYPE html><html><body>hello</body></html>", "not a Metnos installer"},
		{"empty", "", "not a Metnos installer"},
		{"no token", "#!/bin/sh\nMETNOS_SERVER='http://a:1'; export METNOS_SERVER\n", "sets no METNOS_TOKEN"},
		{"no server", "set \"METNOS_TOKEN=" + testToken + "\"\r\n", "sets no METNOS_SERVER"},
		{"twice", sh("'http://a:1'", "'"+testToken+"'") + "METNOS_SERVER='http://b:1'; export METNOS_SERVER\n", "sets METNOS_SERVER twice"},
		{"mixed twice", sh("'http://a:1'", "'"+testToken+"'") + "set \"METNOS_TOKEN=DEV.x.y\"\r\n", "sets METNOS_TOKEN twice"},
		{"not http", sh("'file:///etc/passwd'", "'"+testToken+"'"), "does not start with http:// or https://"},
		{"bad token", sh("'http://a:1'", "'DEV.x'"), "is not a device token"},
		{"token with spaces", sh("'http://a:1'", "'DEV.a.b c'"), "is not a device token"},
		{"command substitution", sh("'http://a:1/$(id)'", "'"+testToken+"'"), "holds characters"},
		// Unquoted values are not the real prelude's shape: ignored.
		{"unquoted", sh("http://a:1", testToken), "not a Metnos installer"},
		// An assignment that exports another name is not the prelude.
		{"other export", "METNOS_SERVER='http://a:1'; export METNOS_TOKEN\nMETNOS_TOKEN='" + testToken + "'; export METNOS_TOKEN\n", "sets no METNOS_SERVER"},
	} {
		s, tok, err := ParseInstaller([]byte(tc.body))
		if err == nil {
			t.Errorf("%s: accepted %q %q", tc.name, s, tok)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line saying %q", tc.name, err, tc.want)
		}
	}
}

func FuzzParseInvite(f *testing.F) {
	f.Add("http://metnos:8765/agent/client/join/0123456789abcdef")
	f.Add("curl -fsSL http://m:1/agent/client/install.sh | \\\n METNOS_SERVER=http://m:1 \\\n METNOS_TOKEN=" + testToken + " sh")
	f.Add("$env:METNOS_SERVER='http://m:1'; $env:METNOS_TOKEN='" + testToken + "'; `\niwr x | iex")
	f.Add("set \"METNOS_SERVER=http://m:1\"\r\nset \"METNOS_TOKEN=DEV.a.b\"")
	f.Fuzz(func(t *testing.T, s string) {
		inv, err := ParseInvite(s)
		if err != nil {
			if inv != (Invite{}) {
				t.Fatalf("error %v with a non-zero invite %+v", err, inv)
			}
			return
		}
		if inv.JoinURL != "" {
			if inv.Server != "" || inv.Token != "" {
				t.Fatalf("both a join link and a one-liner: %+v", inv)
			}
			again, err := ParseInvite(inv.JoinURL)
			if err != nil || again != inv {
				t.Fatalf("the join link %q does not read back as itself: %+v, %v", inv.JoinURL, again, err)
			}
			return
		}
		checkAccepted(t, inv.Server, inv.Token)
	})
}

func FuzzParseInstaller(f *testing.F) {
	for _, name := range []string{"linux.sh", "windows.cmd", "linux-quote.sh"} {
		b, err := os.ReadFile(filepath.Join("testdata", "installer", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		server, token, err := ParseInstaller(b)
		if err != nil {
			if server != "" || token != "" {
				t.Fatalf("error %v with values %q %q", err, server, token)
			}
			return
		}
		checkAccepted(t, server, token)
	})
}

// checkAccepted fails unless server and token satisfy the rules every
// accepted invite and installer must.
func checkAccepted(t *testing.T, server, token string) {
	t.Helper()
	if err := CheckServerURL(server); err != nil {
		t.Fatalf("accepted server %q: %v", server, err)
	}
	if !tokenRe().MatchString(token) {
		t.Fatalf("accepted token %q", token)
	}
	if strings.ContainsAny(server+token, " \t\r\n'\"`$;&|<>\\%?#") {
		t.Fatalf("accepted %q %q holding shell or URL metacharacters", server, token)
	}
}
