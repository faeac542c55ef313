package bootstrap

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"text/template/parse"
)

// The launcher renders ISTIO_BOOTSTRAP templates with text/template's parser and
// the executor below, not with text/template itself: text/template looks methods
// up by name (reflect's MethodByName), which makes the linker keep every exported
// method of every type in the executable — 4.4 MB of the pod's 25 MB executable,
// ~2.5 MB of each pod's memory (docs/benchmarks.md, "Per-pod memory"). The
// template language is Go's: text, actions, pipelines, variables, if/else,
// with, range (over maps, slices and integers, with break and continue),
// define/template/block, comments and trim markers; the functions are host and
// port and Go's builtins and, or, not, len, index, slice, print, printf,
// println, eq, ne, lt, le, gt, ge, html, js and urlquery (not call). Params has
// no methods, so method calls, the one thing left out, could not occur. The tests
// render the same templates with text/template and compare.

// templateFuncs are the functions a template may call: the parser checks that
// each name called is a key (with a non-nil value); builtin calls them.
var templateFuncs = func() map[string]any {
	m := map[string]any{}
	for _, f := range strings.Fields("host port and or not len index slice print printf println eq ne lt le gt ge html js urlquery") {
		m[f] = true
	}
	return m
}()

// maxTemplateDepth bounds {{template}} recursion.
const maxTemplateDepth = 1000

// renderTemplate executes the template text named name with data, as text/template
// does with the functions above.
func renderTemplate(name, text string, data any) ([]byte, error) {
	trees, err := parse.Parse(name, text, "", "", templateFuncs)
	if err != nil {
		return nil, err
	}
	s := &exec{trees: trees}
	root := reflect.ValueOf(data)
	s.vars = []variable{{"$", root}}
	if t := trees[name]; t != nil && t.Root != nil {
		s.tree = t
		if err := s.walk(root, t.Root); err != nil {
			return nil, err
		}
	}
	return s.out.Bytes(), nil
}

type variable struct {
	name  string
	value reflect.Value
}

// exec is one execution: its output, variables and the template being executed.
type exec struct {
	trees map[string]*parse.Tree
	tree  *parse.Tree
	out   bytes.Buffer
	vars  []variable
	depth int
}

// errBreak and errContinue end a range iteration.
var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

func (s *exec) errorf(n parse.Node, format string, args ...any) error {
	loc, ctx := s.tree.ErrorContext(n)
	return fmt.Errorf("template: %s: executing %q at <%s>: %s", loc, s.tree.Name, ctx, fmt.Sprintf(format, args...))
}

func (s *exec) walk(dot reflect.Value, node parse.Node) error {
	switch n := node.(type) {
	case *parse.ListNode:
		for _, c := range n.Nodes {
			if err := s.walk(dot, c); err != nil {
				return err
			}
		}
	case *parse.TextNode:
		s.out.Write(n.Text)
	case *parse.CommentNode:
	case *parse.ActionNode:
		v, err := s.pipeline(dot, n.Pipe)
		if err != nil {
			return err
		}
		if len(n.Pipe.Decl) == 0 {
			return s.print(n, v)
		}
	case *parse.IfNode:
		return s.branch(dot, parse.NodeIf, &n.BranchNode)
	case *parse.WithNode:
		return s.branch(dot, parse.NodeWith, &n.BranchNode)
	case *parse.RangeNode:
		return s.rangeOver(dot, n)
	case *parse.BreakNode:
		return errBreak
	case *parse.ContinueNode:
		return errContinue
	case *parse.TemplateNode:
		return s.template(dot, n)
	default:
		return s.errorf(node, "unknown node %s", node)
	}
	return nil
}

// scope runs f and then drops the variables it declared.
func (s *exec) scope(f func() error) error {
	mark := len(s.vars)
	err := f()
	s.vars = s.vars[:mark]
	return err
}

func (s *exec) branch(dot reflect.Value, typ parse.NodeType, b *parse.BranchNode) error {
	return s.scope(func() error {
		v, err := s.pipeline(dot, b.Pipe)
		if err != nil {
			return err
		}
		ok, err := truth(v)
		if err != nil {
			return s.errorf(b, "%v", err)
		}
		switch {
		case ok && typ == parse.NodeWith:
			return s.walk(v, b.List)
		case ok:
			return s.walk(dot, b.List)
		case b.ElseList != nil:
			return s.walk(dot, b.ElseList)
		}
		return nil
	})
}

func (s *exec) rangeOver(dot reflect.Value, r *parse.RangeNode) error {
	return s.scope(func() error {
		v, err := s.pipeline(dot, r.Pipe)
		if err != nil {
			return err
		}
		v = indirect(v)
		one := func(k, e reflect.Value) (bool, error) {
			if n := len(r.Pipe.Decl); n == 1 {
				s.vars[len(s.vars)-1].value = e
			} else if n == 2 {
				s.vars[len(s.vars)-2].value, s.vars[len(s.vars)-1].value = k, e
			}
			err := s.scope(func() error { return s.walk(e, r.List) })
			switch {
			case errors.Is(err, errBreak):
				return false, nil
			case errors.Is(err, errContinue):
				return true, nil
			}
			return err == nil, err
		}
		n := 0
		switch v.Kind() {
		case reflect.Slice, reflect.Array:
			for i := 0; i < v.Len(); i++ {
				n++
				if more, err := one(reflect.ValueOf(i), v.Index(i)); err != nil || !more {
					return err
				}
			}
		case reflect.Map:
			for _, k := range sortedKeys(v) {
				n++
				if more, err := one(k, v.MapIndex(k)); err != nil || !more {
					return err
				}
			}
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			for i := int64(0); i < v.Int(); i++ {
				n++
				e := reflect.ValueOf(i).Convert(v.Type())
				if more, err := one(e, e); err != nil || !more {
					return err
				}
			}
		case reflect.Invalid:
		default:
			return s.errorf(r, "range can't iterate over %v", v)
		}
		if n == 0 && r.ElseList != nil {
			return s.walk(dot, r.ElseList)
		}
		return nil
	})
}

func (s *exec) template(dot reflect.Value, t *parse.TemplateNode) error {
	tree := s.trees[t.Name]
	if tree == nil {
		return s.errorf(t, "no such template %q", t.Name)
	}
	if s.depth >= maxTemplateDepth {
		return s.errorf(t, "exceeded maximum template depth (%d)", maxTemplateDepth)
	}
	v, err := s.pipeline(dot, t.Pipe)
	if err != nil {
		return err
	}
	saved, savedTree := s.vars, s.tree
	s.vars, s.tree = []variable{{"$", v}}, tree
	s.depth++
	err = s.walk(v, tree.Root)
	s.depth--
	s.vars, s.tree = saved, savedTree
	return err
}

// indirect looks through interfaces and pointers.
func indirect(v reflect.Value) reflect.Value {
	for v.IsValid() && (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) {
		if v.IsNil() {
			return reflect.Value{}
		}
		v = v.Elem()
	}
	return v
}

// truth is text/template's notion of true: set and not the zero value.
func truth(v reflect.Value) (bool, error) {
	v = indirect(v)
	if !v.IsValid() {
		return false, nil
	}
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() > 0, nil
	case reflect.Bool:
		return v.Bool(), nil
	case reflect.Complex64, reflect.Complex128:
		return v.Complex() != 0, nil
	case reflect.Chan, reflect.Func, reflect.Pointer, reflect.Interface:
		return !v.IsNil(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() != 0, nil
	case reflect.Float32, reflect.Float64:
		return v.Float() != 0, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() != 0, nil
	case reflect.Struct:
		return true, nil
	}
	return false, fmt.Errorf("can't evaluate truth of %s", v.Type())
}

// sortedKeys are m's keys in text/template's order: by value for strings and
// numbers, else by their printed form.
func sortedKeys(m reflect.Value) []reflect.Value {
	keys := m.MapKeys()
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		switch basicKind(a) {
		case stringKind:
			return a.String() < b.String()
		case intKind:
			return a.Int() < b.Int()
		case uintKind:
			return a.Uint() < b.Uint()
		case floatKind:
			return a.Float() < b.Float()
		}
		return fmt.Sprint(a.Interface()) < fmt.Sprint(b.Interface())
	})
	return keys
}
