package repo

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// root is the module's root folder, from this test's folder (test/repo).
const root = "../.."

// envReaders are the functions of package os that read the process's
// environment or the home folder it names.
var envReaders = map[string]bool{"Getenv": true, "LookupEnv": true, "Environ": true, "UserHomeDir": true}

// envAllowed are the folders (relative to the module root, with all
// below them) whose non-test files may read the environment, and why.
var envAllowed = map[string]string{
	// The configuration: it reads every variable once, for the CLI,
	// which passes it down.
	"internal/config": "reads the environment into a typed Config",
	// The shim's own startup: it reads its own, deliberately minimal,
	// environment (the one the sandbox built for the command) before
	// it execs the command; it is not the agent's configuration.
	"sandbox/shim": "the shim's own environment at its startup",
	// Test helpers and suites, used only by tests: they build binaries
	// with the tests' environment and read the tests' own switches.
	"testkit": "the test helpers",
	"test":    "the repository's test suites",
}

// TestNoEnvInLibraries: only internal/config reads the agent's
// environment (or the home folder from it): the CLI has it read once,
// at its start, and passes the Config down.
func TestNoEnvInLibraries(t *testing.T) {
	walkGo(t, func(rel string, f *ast.File, fset *token.FileSet) {
		for dir := range envAllowed {
			if rel == dir || strings.HasPrefix(rel, dir+"/") {
				return
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == osName(f) && envReaders[sel.Sel.Name] {
				t.Errorf("%s: os.%s in a library package: take the value from the caller (internal/config)", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	})
}

// TestNoAgentPathsInSandboxAndPolicy: the sandbox and the policy know
// none of the agent's folders: no string literal of their non-test files
// holds "metnos" as a path or a folder name (the caller passes the
// agent's folders in). Import paths are not string literals of code.
// Names that are not paths the agent keeps (a scratch folder's prefix
// fixed by the protocol, a memfd's or an argument's name) stay.
func TestNoAgentPathsInSandboxAndPolicy(t *testing.T) {
	walkStrings(t, func(rel string) bool { return strings.HasPrefix(rel, "sandbox") || rel == "policy" }, func(pos token.Position, lit, v string) {
		if agentPath(v) {
			t.Errorf("%s: %s names an agent folder: take it from the caller (internal/layout)", pos, lit)
		}
	})
}

// agentPath reports whether v spells one of the agent's folders: a path
// (it holds a separator) with "metnos" in it, or a folder named
// metnos or metnos-agent.
func agentPath(v string) bool {
	l := strings.ToLower(v)
	if !strings.Contains(l, "metnos") {
		return false
	}
	return strings.ContainsAny(l, `/\`) || l == "metnos" || l == "metnos-agent"
}

// osName is the name file f imports package os under ("" when it does
// not).
func osName(f *ast.File) string {
	for _, imp := range f.Imports {
		if imp.Path.Value != `"os"` {
			continue
		}
		if imp.Name != nil {
			return imp.Name.Name
		}
		return "os"
	}
	return ""
}

// walkGo parses every non-test Go file of the module (but testdata and
// hidden folders) and calls f with its folder relative to the root.
// walkStrings calls f with every string literal of code (import paths
// are not) in the non-test files of the packages in whose folder
// (relative to the repository) in reports true: its position, its
// literal text and its value.
func walkStrings(t *testing.T, in func(rel string) bool, f func(pos token.Position, lit, v string)) {
	t.Helper()
	walkGo(t, func(rel string, file *ast.File, fset *token.FileSet) {
		if !in(rel) {
			return
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ImportSpec:
				return false
			case *ast.BasicLit:
				if n.Kind != token.STRING {
					return true
				}
				if v, err := strconv.Unquote(n.Value); err == nil {
					f(fset.Position(n.Pos()), n.Value, v)
				}
			}
			return true
		})
	})
}

func walkGo(t *testing.T, f func(rel string, file *ast.File, fset *token.FileSet)) {
	t.Helper()
	fset := token.NewFileSet()
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || name == "docs") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		n++
		f(filepath.ToSlash(rel), file, fset)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 50 {
		t.Fatalf("only %d Go files found under %s", n, root)
	}
}

// TestRefServerImportsNoDeviceCode: the reference server and the wire
// protocol import none of the device's packages, so that the server
// side can be read, built and changed on its own.
func TestRefServerImportsNoDeviceCode(t *testing.T) {
	const mod = "github.com/metnos/agent/"
	device := []string{"agent", "client", "sandbox", "policy", "undo", "audit", "fetch", "pairing", "cmd/metnos-agent", "internal/lockfile", "tailnet"}
	for _, pkg := range []string{"./refserver", "./cmd/metnos-refserver", "./wire"} {
		deps := goList(t, "-deps", root+"/"+strings.TrimPrefix(pkg, "./"))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s: %v", pkg, deps)
		}
		for _, dep := range deps {
			rest, ok := strings.CutPrefix(dep, mod)
			if !ok {
				continue
			}
			for _, d := range device {
				if rest == d || strings.HasPrefix(rest, d+"/") {
					t.Errorf("%s imports %s (device code)", pkg, dep)
				}
			}
		}
	}
}
