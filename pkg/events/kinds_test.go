package events

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestEveryPodEventKindIsListed: every PodEvent* constant of this package is in
// PodEventKinds, the list a pod's bus permission is built from — a kind left out
// would be refused by nats-server for every pod.
func TestEveryPodEventKindIsListed(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "subjects.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seen int
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			if !strings.HasPrefix(name.Name, "PodEvent") || i >= len(vs.Values) {
				continue
			}
			lit, ok := vs.Values[i].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				continue
			}
			kind, _ := strconv.Unquote(lit.Value)
			seen++
			if !slices.Contains(PodEventKinds, kind) {
				t.Errorf("%s (%q) is not in PodEventKinds: no pod may publish it", name.Name, kind)
			}
		}
		return true
	})
	if seen != len(PodEventKinds) {
		t.Errorf("%d PodEvent* kinds declared, %d listed", seen, len(PodEventKinds))
	}
}
