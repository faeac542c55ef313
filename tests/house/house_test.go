// Package house checks the shape the repository keeps (docs/architecture.md, "The
// house"): short files and functions, one clock, one retry. It reads the tree's Go
// source as text and syntax; it builds and runs nothing of it.
package house

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The limits (issue 34).
const (
	maxFileLines   = 500
	maxFuncLines   = 100
	longFuncLines  = 80
	maxLongFuncs   = 5
	repoRelToHouse = "../.."
)

// wallClock are the time package's reads of the wall clock and its timers: in
// services/ and pkg/ only pkg/clock may call them (everything else takes a
// clock.Clock, so that a fake one moves it in tests).
var wallClock = map[string]bool{"Now": true, "Since": true, "Until": true, "After": true, "AfterFunc": true,
	"NewTimer": true, "NewTicker": true, "Tick": true, "Sleep": true}

// finding is one place that breaks a rule.
type finding struct{ rule, where string }

// sourceFiles lists the non-test Go files below root, skipping testdata and
// the test harness module (tests/).
func sourceFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules", ".meshagent", "bin":
				return filepath.SkipDir
			}
			if rel == "tests" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// inspect returns what breaks the rules in the Go file at path (rel is its path
// from the repository's root) and its functions' lengths over longFuncLines.
func inspect(path, rel string) ([]finding, []string, error) {
	fset := token.NewFileSet()
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		return nil, nil, err
	}
	var out []finding
	var long []string
	if n := strings.Count(string(src), "\n"); n > maxFileLines {
		out = append(out, finding{"file over 500 lines", fmt.Sprintf("%s (%d)", rel, n)})
	}
	timeName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"time"` {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	decls := map[*ast.FuncType]bool{} // a method's own signature is no func value
	clockRule := (strings.HasPrefix(rel, "services/") || strings.HasPrefix(rel, "pkg/")) && !strings.HasPrefix(rel, "pkg/clock/")
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			decls[n.Type] = true
			if n.Body == nil {
				return true
			}
			lines := fset.Position(n.End()).Line - fset.Position(n.Pos()).Line + 1
			where := fmt.Sprintf("%s:%d %s (%d lines)", rel, fset.Position(n.Pos()).Line, n.Name.Name, lines)
			if lines > maxFuncLines {
				out = append(out, finding{"function over 100 lines", where})
			}
			if lines > longFuncLines {
				long = append(long, where)
			}
		case *ast.FuncType:
			if !decls[n] && isNowFunc(n, timeName) {
				out = append(out, finding{"func() time.Time (inject a clock.Clock)", fmt.Sprintf("%s:%d", rel, fset.Position(n.Pos()).Line)})
			}
		case *ast.InterfaceType:
			for _, m := range n.Methods.List {
				if ft, ok := m.Type.(*ast.FuncType); ok {
					decls[ft] = true // a method of an interface is no func value either
				}
			}
		case *ast.AssignStmt:
			if !strings.HasPrefix(rel, "pkg/backoff/") && isDoubling(n) {
				out = append(out, finding{"doubling loop outside pkg/backoff", fmt.Sprintf("%s:%d", rel, fset.Position(n.Pos()).Line)})
			}
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && clockRule && timeName != "" && id.Name == timeName && wallClock[n.Sel.Name] {
				out = append(out, finding{"wall-clock read outside pkg/clock", fmt.Sprintf("%s:%d time.%s", rel, fset.Position(n.Pos()).Line, n.Sel.Name)})
			}
		}
		return true
	})
	return out, long, nil
}

// isDoubling reports whether a is x *= 2, x <<= 1, or x = x*2 (also inside
// min(...)): the step of a hand-written doubling backoff.
func isDoubling(a *ast.AssignStmt) bool {
	if len(a.Lhs) != 1 || len(a.Rhs) != 1 {
		return false
	}
	lit := func(e ast.Expr, v string) bool { b, ok := e.(*ast.BasicLit); return ok && b.Value == v }
	switch a.Tok {
	case token.MUL_ASSIGN:
		return lit(a.Rhs[0], "2")
	case token.SHL_ASSIGN:
		return lit(a.Rhs[0], "1")
	case token.ASSIGN, token.DEFINE:
	default:
		return false
	}
	lhs := types(a.Lhs[0])
	var doubled func(e ast.Expr) bool
	doubled = func(e ast.Expr) bool {
		switch e := e.(type) {
		case *ast.BinaryExpr:
			return e.Op == token.MUL && ((lit(e.Y, "2") && types(e.X) == lhs) || (lit(e.X, "2") && types(e.Y) == lhs))
		case *ast.CallExpr:
			if id, ok := e.Fun.(*ast.Ident); ok && id.Name == "min" {
				for _, arg := range e.Args {
					if doubled(arg) {
						return true
					}
				}
			}
		case *ast.ParenExpr:
			return doubled(e.X)
		}
		return false
	}
	return lhs != "" && doubled(a.Rhs[0])
}

// types is an expression's source form for the simple ones (x, x.y), "" otherwise.
func types(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		if x := types(e.X); x != "" {
			return x + "." + e.Sel.Name
		}
	}
	return ""
}

// isNowFunc reports whether ft is func() time.Time.
func isNowFunc(ft *ast.FuncType, timeName string) bool {
	if timeName == "" || (ft.Params != nil && len(ft.Params.List) > 0) || ft.Results == nil || len(ft.Results.List) != 1 {
		return false
	}
	sel, ok := ft.Results.List[0].Type.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == timeName && sel.Sel.Name == "Time"
}

func check(t *testing.T, root string) ([]finding, []string) {
	t.Helper()
	var all []finding
	var long []string
	for _, p := range sourceFiles(t, root) {
		rel, _ := filepath.Rel(root, p)
		fs, l, err := inspect(p, filepath.ToSlash(rel))
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		all, long = append(all, fs...), append(long, l...)
	}
	return all, long
}

// TestHouseRules: no non-test Go file over 500 lines, no function over 100 lines
// and at most 5 over 80, no func() time.Time, and no wall-clock read in
// services/ or pkg/ outside pkg/clock.
func TestHouseRules(t *testing.T) {
	findings, long := check(t, repoRelToHouse)
	sort.Slice(findings, func(i, j int) bool { return findings[i].where < findings[j].where })
	for _, f := range findings {
		t.Errorf("%s: %s", f.rule, f.where)
	}
	if len(long) > maxLongFuncs {
		sort.Strings(long)
		t.Errorf("%d functions over %d lines, at most %d:\n  %s", len(long), longFuncLines, maxLongFuncs, strings.Join(long, "\n  "))
	}
}

// TestHouseRulesCatchWhatTheyForbid is the positive control: a tree made to
// break each rule is caught on each.
func TestHouseRulesCatchWhatTheyForbid(t *testing.T) {
	root := t.TempDir()
	var long strings.Builder
	long.WriteString("package bad\n\nimport \"time\"\n\nfunc Long() {\n")
	for i := 0; i < 120; i++ {
		long.WriteString("\t_ = 1\n")
	}
	long.WriteString("}\n\ntype S struct{ now func() time.Time }\n\nfunc Wall() time.Time { return time.Now() }\n")
	for i := 0; i < 400; i++ {
		long.WriteString("\n")
	}
	write := func(rel, body string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("services/bad/bad.go", long.String())
	write("pkg/clock/clock.go", "package clock\n\nimport \"time\"\n\nfunc Now() time.Time { return time.Now() }\n")
	write("cmd/tool/tool.go", "package main\n\nimport \"time\"\n\nfunc main() { _ = time.Now() }\n")
	write("pkg/retry/retry.go", "package retry\n\nimport \"time\"\n\nfunc Do(wait time.Duration) {\n\tfor {\n\t\twait = min(wait*2, time.Minute)\n\t}\n}\n")
	write("pkg/backoff/backoff.go", "package backoff\n\nfunc next(d int) int {\n\td *= 2\n\treturn d\n}\n")
	findings, longs := check(t, root)
	got := map[string]int{}
	for _, f := range findings {
		got[f.rule]++
	}
	want := map[string]int{"file over 500 lines": 1, "function over 100 lines": 1, "func() time.Time (inject a clock.Clock)": 1, "wall-clock read outside pkg/clock": 1, "doubling loop outside pkg/backoff": 1}
	for rule, n := range want {
		if got[rule] != n {
			t.Errorf("rule %q: %d findings, want %d (all: %v)", rule, got[rule], n, findings)
		}
	}
	if len(longs) != 1 {
		t.Errorf("long functions: %v, want the one", longs)
	}
}
