package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/metnos/agent/sandbox"
)

// docPages are the pages whose command lines TestDocCommands runs,
// relative to this package's folder: the README and every page of docs/
// but the protocol and the publishing guide (a server operator's, whose
// commands run on the server).
func docPages(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..", "..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{filepath.Join(root, "README.md")}
	for _, p := range pages {
		if b := filepath.Base(p); b != "protocol.md" && b != "publishing.md" {
			out = append(out, p)
		}
	}
	if len(out) < 8 {
		t.Fatalf("only %d pages: %v", len(out), out)
	}
	return out
}

// docLine is one command line a page shows in a ```sh block.
type docLine struct {
	where string // page:line
	text  string // the line as shown, without its comment
	words []string
	// exit is the status the comment promises with "(exit N)"; 0
	// where it promises none.
	exit int
}

// exitNote is how a shown line's comment says the status it ends with.
var exitNote = regexp.MustCompile(`\(exit (\d+)`)

// docLines returns the lines of page's ```sh blocks, a continued line
// (ending in \) joined with the next.
func docLines(t *testing.T, page string) []docLine {
	t.Helper()
	f, err := os.Open(page)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []docLine
	in, n, held, heldAt := false, 0, "", 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		l := sc.Text()
		if strings.HasPrefix(l, "```") {
			in = l == "```sh"
			continue
		}
		if !in {
			continue
		}
		if held != "" {
			l = held + " " + strings.TrimSpace(l)
		} else {
			heldAt = n
		}
		if strings.HasSuffix(l, `\`) {
			held = strings.TrimSuffix(l, `\`)
			continue
		}
		held = ""
		text, comment := splitComment(l)
		if text == "" {
			continue
		}
		words, err := shellWords(text)
		if err != nil {
			t.Errorf("%s:%d: %q: %v: show a plain command line", page, heldAt, text, err)
			continue
		}
		d := docLine{where: fmt.Sprintf("%s:%d", filepath.Base(page), heldAt), text: text, words: words}
		if m := exitNote.FindStringSubmatch(comment); m != nil {
			d.exit, _ = strconv.Atoi(m[1])
		}
		out = append(out, d)
	}
	return out
}

// splitComment cuts a shell line at its comment: a # after a blank,
// outside quotes.
func splitComment(l string) (text, comment string) {
	var q rune
	for i, r := range l {
		switch {
		case q != 0:
			if r == q {
				q = 0
			}
		case r == '\'' || r == '"':
			q = r
		case r == '#' && (i == 0 || l[i-1] == ' '):
			return strings.TrimSpace(l[:i]), l[i:]
		}
	}
	return strings.TrimSpace(l), ""
}

// shellWords splits a plain command line as sh would: words at blanks,
// quotes kept together. Anything else of the shell's (pipes,
// redirections, variables, globs) is an error: a shown line is run as
// it is, without a shell.
func shellWords(l string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	var q rune
	for _, r := range l {
		switch {
		case q != 0:
			if r == q {
				q = 0
			} else {
				w.WriteRune(r)
			}
		case r == '\'' || r == '"':
			q, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case strings.ContainsRune("|&;<>$`*?", r):
			return nil, fmt.Errorf("%q is the shell's", r)
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if q != 0 {
		return nil, fmt.Errorf("an unclosed %c", q)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// placeholder is a word a reader replaces with their own: URL, HEX,
// INVOCATION_ID, FILE, N...
var placeholder = regexp.MustCompile(`^[A-Z][A-Z_]*$`)

// docWorld is what the shown lines of one page run against: a home
// folder of their own and a reference server on loopback, whose join
// link and token stand in for the ones the pages show.
type docWorld struct {
	home string
	env  map[string]string
	jw   *joinWorld
	subs map[string]string
}

func newDocWorld(t *testing.T) *docWorld {
	t.Helper()
	// Outside /tmp, which every profile but full-fs-no-net hides: a
	// user's home is not there either.
	parent := ""
	if d, err := os.MkdirTemp("/var/tmp", "metnos-doc-test-"); err == nil {
		parent = d
		t.Cleanup(func() { os.RemoveAll(d) })
	} else {
		parent = t.TempDir()
	}
	w := &docWorld{home: filepath.Join(parent, "home"), jw: newJoinWorld(t, false)}
	if err := os.Mkdir(w.home, 0o755); err != nil {
		t.Fatal(err)
	}
	// A secret where the nucleus hides it: no shown line may print it.
	if err := os.MkdirAll(filepath.Join(w.home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.home, ".ssh", "id_rsa"), []byte(plantedSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	w.env = map[string]string{"HOME": w.home, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
	j := w.jw.join(t)
	tok, err := w.jw.srv.IssueToken("laptop", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	w.subs = map[string]string{
		"http://metnos.your-tailnet:8765/agent/client/join/3f9c0d2a41be7e55": j.Link(w.jw.url),
		"http://metnos.your-tailnet:8765":                                    w.jw.url,
		"DEV.ID.SECRET":                                                      tok,
	}
	return w
}

// plantedSecret is the content of every doc world's ~/.ssh/id_rsa.
const plantedSecret = "planted-secret-4c1e"

// word is a shown word as this world reads it: the page's server,
// link and token replaced by its own, ~ by its home.
func (w *docWorld) word(s string) string {
	if r, ok := w.subs[s]; ok {
		return r
	}
	if s == "~" || strings.HasPrefix(s, "~/") {
		return w.home + strings.TrimPrefix(s, "~")
	}
	return s
}

// run runs the agent's command args in this world, in-process.
func (w *docWorld) run(t *testing.T, args []string) (int, string) {
	t.Helper()
	e, err := readEnvironment(func(k string) string { return w.env[k] })
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code := run(stdio{out: &out, err: &out, env: &envResult{e: e}}, args)
	return code, out.String()
}

// notRun are the commands a test does not run as shown, and why; their
// lines are checked against the command's help instead: the command
// exists and takes every flag shown.
var notRun = map[string]string{
	"demo":      "run as shown by .ci/run (the README's first command)",
	"run":       "serves until it is stopped (test/e2e runs it)",
	"install":   "changes this machine's user services (but --dry-run)",
	"uninstall": "changes this machine's user services",
	"update":    "needs a newer signed build on the server (test/e2e runs it)",
	"fetch":     "downloads from the network",
}

// TestDocCommands: every metnos-agent command line the README and the
// pages of docs/ show works as shown. Each page's lines run in order
// in a home of their own, against a reference server on loopback whose
// link and token stand in for the page's: each ends with the status its
// comment promises ("(exit N)"), else 0. A line that needs what a test
// cannot give (the internet, this machine's services, a placeholder
// such as URL or INVOCATION_ID, a sandbox this machine lacks) is
// checked against its command's help: the command exists and takes
// every flag the line shows.
func TestDocCommands(t *testing.T) {
	full := false
	if e, err := readEnvironment(os.Getenv); err == nil {
		c := sandbox.Probe(sandboxOptions(e))
		full = c.BwrapUsable && c.LandlockABI > 0 && c.Seccomp && c.Disabled == ""
	}
	ran, checked := 0, 0
	for _, page := range docPages(t) {
		t.Run(filepath.Base(page), func(t *testing.T) {
			w := newDocWorld(t)
			for _, d := range docLines(t, page) {
				args, ok := agentArgs(d.words)
				if !ok {
					if d.words[0] == "mkdir" && len(d.words) == 3 && d.words[1] == "-p" {
						os.MkdirAll(w.word(d.words[2]), 0o755)
					}
					continue // another program's line (go test, the reference server)
				}
				if why := w.cannotRun(args, full); why != "" {
					checked++
					w.checkSyntax(t, d, args, why)
					continue
				}
				for i := range args {
					args[i] = w.word(args[i])
				}
				ran++
				code, out := w.run(t, args)
				if code != d.exit {
					t.Errorf("%s: %s: exit %d, want %d:\n%s", d.where, d.text, code, d.exit, out)
				}
				if strings.Contains(out, plantedSecret) {
					t.Errorf("%s: %s printed the secret planted in ~/.ssh:\n%s", d.where, d.text, out)
				}
			}
		})
	}
	t.Logf("ran %d shown command lines; checked %d against their command's help", ran, checked)
	if ran < 15 {
		t.Errorf("only %d shown lines ran", ran)
	}
}

// agentArgs returns the agent's arguments of a shown line that runs
// metnos-agent (or go run ./cmd/metnos-agent).
func agentArgs(words []string) ([]string, bool) {
	switch {
	case len(words) > 0 && words[0] == "metnos-agent":
		return words[1:], true
	case len(words) > 2 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/metnos-agent":
		return words[3:], true
	}
	return nil, false
}

// cannotRun says why a test does not run the agent's command args as
// shown ("" when it does).
func (w *docWorld) cannotRun(args []string, fullSandbox bool) string {
	if len(args) == 0 {
		return ""
	}
	if why, ok := notRun[args[0]]; ok && !(args[0] == "install" && hasWord(args, "--dry-run")) {
		return why
	}
	for _, a := range args {
		if _, known := w.subs[a]; !known && placeholder.MatchString(a) && len(a) > 1 {
			return "it names a placeholder (" + a + ")"
		}
		if strings.HasPrefix(a, "--tailnet") {
			return "it joins a tailnet (test/tailnet runs it)"
		}
	}
	switch {
	case args[0] == "pair" && hasWord(args, "--install"):
		return notRun["install"]
	case args[0] == "runtime" && len(args) > 1 && args[1] == "install":
		return "downloads a Python runtime"
	case args[0] == "limits" && len(args) > 1 && args[1] == "edit":
		return "opens an editor (testdata/limits.txtar runs it with one of its own)"
	case args[0] == "exec" && hasWord(args, "--allow-net"):
		return "reaches hosts on the internet"
	case args[0] == "exec" && !fullSandbox:
		return "this machine gives no full sandbox (bwrap, Landlock, seccomp)"
	}
	return ""
}

func hasWord(args []string, w string) bool {
	for _, a := range args {
		if a == w {
			return true
		}
	}
	return false
}

// checkSyntax checks a shown line the test does not run: its command
// prints its help, which names every flag the line shows before "--".
func (w *docWorld) checkSyntax(t *testing.T, d docLine, args []string, why string) {
	t.Helper()
	cmd := []string{args[0]}
	if len(args) > 1 && (args[0] == "runtime" || args[0] == "audit" || args[0] == "limits") && !strings.HasPrefix(args[1], "-") {
		cmd = append(cmd, args[1])
	}
	code, help := w.run(t, append(cmd, "--help"))
	if code != exitOK {
		t.Errorf("%s: %s (not run: %s): %s --help: exit %d:\n%s", d.where, d.text, why, strings.Join(cmd, " "), code, help)
		return
	}
	for _, a := range args[len(cmd):] {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !regexp.MustCompile(`(?m)^\s+--?` + regexp.QuoteMeta(name) + `\b`).MatchString(help) {
			t.Errorf("%s: %s (not run: %s): %s takes no flag %s:\n%s", d.where, d.text, why, strings.Join(cmd, " "), a, help)
		}
	}
	t.Logf("%s: not run (%s); its flags are in its help: %s", d.where, why, d.text)
}
