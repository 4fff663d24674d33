package repo

import (
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

// module is this module's import path, with its trailing slash.
const module = "github.com/metnos/agent/"

// pkgImports is one package of the module: its path relative to the
// module ("" for the root) and the module's packages it imports,
// likewise relative; with tests, those its tests import too.
type pkgImports struct {
	rel     string
	imports []string
}

// modulePackages lists the module's packages with their imports of the
// module's packages; withTests adds their tests' imports.
func modulePackages(t *testing.T, withTests bool) []pkgImports {
	t.Helper()
	format := "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"
	if withTests {
		format += "{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}"
	}
	out, err := exec.Command("go", "list", "-f", format, module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkgImports
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		rel, ok := strings.CutPrefix(f[0], module)
		if !ok {
			continue
		}
		p := pkgImports{rel: rel}
		for _, imp := range f[1:] {
			if r, ok := strings.CutPrefix(imp, module); ok && r != rel && !slices.Contains(p.imports, r) {
				p.imports = append(p.imports, r)
			}
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// room is the top-level folder of the module's package rel: the room
// it stands in, in the drawing of the tree by folder.
func room(rel string) string {
	r, _, _ := strings.Cut(rel, "/")
	return r
}

// roomGraph is the drawing of the tree by folder: for each room, the
// rooms its packages import.
func roomGraph(pkgs []pkgImports) map[string][]string {
	g := map[string][]string{}
	for _, p := range pkgs {
		from := room(p.rel)
		if _, ok := g[from]; !ok {
			g[from] = nil
		}
		for _, imp := range p.imports {
			if to := room(imp); to != from && !slices.Contains(g[from], to) {
				g[from] = append(g[from], to)
			}
		}
	}
	for _, to := range g {
		sort.Strings(to)
	}
	return g
}

// floors gives each room its floor: 0 for a room that imports no other
// room, else one above the highest room it imports. An import that runs
// back up (within a cycle) is returned in up, and ignored for floors.
func floors(g map[string][]string) (floor map[string]int, up []string) {
	floor = map[string]int{}
	state := map[string]int{} // 0 unseen, 1 on the path, 2 done
	var visit func(r string)
	visit = func(r string) {
		state[r] = 1
		f := 0
		for _, to := range g[r] {
			switch state[to] {
			case 1:
				up = append(up, r+" -> "+to)
				continue
			case 0:
				visit(to)
			}
			f = max(f, floor[to]+1)
		}
		floor[r] = f
		state[r] = 2
	}
	rooms := make([]string, 0, len(g))
	for r := range g {
		rooms = append(rooms, r)
	}
	sort.Strings(rooms)
	for _, r := range rooms {
		if state[r] == 0 {
			visit(r)
		}
	}
	return floor, up
}

// drawFloors prints the rooms floor by floor, top first, each with the
// rooms it imports.
func drawFloors(g map[string][]string, floor map[string]int) string {
	top := 0
	for _, f := range floor {
		top = max(top, f)
	}
	var b strings.Builder
	for f := top; f >= 0; f-- {
		var on []string
		for r, rf := range floor {
			if rf == f {
				on = append(on, r)
			}
		}
		sort.Strings(on)
		for _, r := range on {
			fmt.Fprintf(&b, "floor %d  %-10s -> %s\n", f, r+"/", strings.Join(g[r], " "))
		}
	}
	return b.String()
}

// TestFloors: drawn by folder, with each top-level folder a room and
// imports as arrows, the tree has cmd/ alone on its top floor and no
// import that runs back up: every room imports only rooms below it.
// With the tests' own imports (a package's tests may import the test
// helpers of testkit/, which import the packages they help test) it
// prints the drawing and the imports that run back up, for the reader.
func TestFloors(t *testing.T) {
	g := roomGraph(modulePackages(t, false))
	floor, up := floors(g)
	t.Logf("the tree by folder (non-test imports):\n%s", drawFloors(g, floor))
	for _, u := range up {
		t.Errorf("%s runs back up: a room imports only rooms below it", u)
	}
	for r, f := range floor {
		if r != "cmd" && f >= floor["cmd"] {
			t.Errorf("%s/ is on floor %d, cmd/ on %d: cmd/ stands alone on the top floor", r, f, floor["cmd"])
		}
	}
	gt := roomGraph(modulePackages(t, true))
	ft, upt := floors(gt)
	t.Logf("with the tests' imports:\n%s%d import(s) run back up: %s", drawFloors(gt, ft), len(upt), strings.Join(upt, ", "))
}

// TestInternalIsGround: the packages under internal/ are the program's
// ground: they import no package of this module but other packages of
// internal/, and neither do their tests.
func TestInternalIsGround(t *testing.T) {
	for _, p := range modulePackages(t, true) {
		if room(p.rel) != "internal" {
			continue
		}
		for _, imp := range p.imports {
			if room(imp) != "internal" {
				t.Errorf("%s imports %s: internal/ holds only ground, which imports nothing above it (move the package up, or what it needs down)", p.rel, imp)
			}
		}
	}
}

// TestTestHelpersNeverShip: the test helpers under testkit/ are imported
// only by tests (and by each other), so no command links them.
func TestTestHelpersNeverShip(t *testing.T) {
	for _, p := range modulePackages(t, false) {
		if room(p.rel) == "testkit" {
			continue
		}
		for _, imp := range p.imports {
			if room(imp) == "testkit" {
				t.Errorf("%s imports the test helper %s outside its tests", p.rel, imp)
			}
		}
	}
	cmds := goList(t, module+"cmd/...")
	if len(cmds) < 3 {
		t.Fatalf("go list cmd/...: %v", cmds)
	}
	for _, c := range cmds {
		if strings.HasPrefix(c, module+"cmd/metnos-agent/") {
			continue // the command's own packages: its main is cmd/metnos-agent
		}
		for _, dep := range goList(t, "-deps", c) {
			if strings.HasPrefix(dep, module+"testkit/") || dep == module+"testkit" {
				t.Errorf("%s links the test helper %s", c, dep)
			}
		}
	}
}
