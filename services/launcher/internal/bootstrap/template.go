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

// pipeline evaluates p, declaring or assigning its variables.
func (s *exec) pipeline(dot reflect.Value, p *parse.PipeNode) (reflect.Value, error) {
	if p == nil {
		return reflect.Value{}, nil
	}
	var v reflect.Value
	for i, c := range p.Cmds {
		var err error
		if v, err = s.command(dot, c, v, i > 0); err != nil {
			return reflect.Value{}, err
		}
	}
	for _, d := range p.Decl {
		if p.IsAssign {
			if err := s.setVar(d, v); err != nil {
				return reflect.Value{}, err
			}
		} else {
			s.vars = append(s.vars, variable{d.Ident[0], v})
		}
	}
	return v, nil
}

func (s *exec) setVar(n *parse.VariableNode, v reflect.Value) error {
	for i := len(s.vars) - 1; i >= 0; i-- {
		if s.vars[i].name == n.Ident[0] {
			s.vars[i].value = v
			return nil
		}
	}
	return s.errorf(n, "undefined variable: %s", n.Ident[0])
}

func (s *exec) varValue(n *parse.VariableNode) (reflect.Value, error) {
	for i := len(s.vars) - 1; i >= 0; i-- {
		if s.vars[i].name == n.Ident[0] {
			return s.vars[i].value, nil
		}
	}
	return reflect.Value{}, s.errorf(n, "undefined variable: %s", n.Ident[0])
}

// command evaluates one command of a pipeline; final is the previous command's
// value, passed as the last argument when piped is set.
func (s *exec) command(dot reflect.Value, c *parse.CommandNode, final reflect.Value, piped bool) (reflect.Value, error) {
	first := c.Args[0]
	hasArgs := len(c.Args) > 1 || piped
	noArgs := func(v reflect.Value, err error) (reflect.Value, error) {
		if err == nil && hasArgs {
			return reflect.Value{}, s.errorf(first, "can't give argument to non-function %s", first)
		}
		return v, err
	}
	switch n := first.(type) {
	case *parse.IdentifierNode:
		return s.call(dot, n, c.Args[1:], final, piped)
	case *parse.FieldNode:
		return s.fields(n, dot, n.Ident, hasArgs)
	case *parse.ChainNode:
		if _, ok := n.Node.(*parse.NilNode); ok {
			return reflect.Value{}, s.errorf(n, "indirection through explicit nil in %s", n)
		}
		v, err := s.arg(dot, n.Node)
		if err != nil {
			return reflect.Value{}, err
		}
		return s.fields(n, v, n.Field, hasArgs)
	case *parse.VariableNode:
		v, err := s.varValue(n)
		if err != nil || len(n.Ident) == 1 {
			return noArgs(v, err)
		}
		return s.fields(n, v, n.Ident[1:], hasArgs)
	case *parse.PipeNode:
		return noArgs(s.pipeline(dot, n))
	case *parse.NilNode:
		return reflect.Value{}, s.errorf(n, "nil is not a command")
	}
	return noArgs(s.arg(dot, first))
}

// arg is the value of one argument node.
func (s *exec) arg(dot reflect.Value, n parse.Node) (reflect.Value, error) {
	switch n := n.(type) {
	case *parse.DotNode:
		return dot, nil
	case *parse.NilNode:
		return reflect.Value{}, nil
	case *parse.BoolNode:
		return reflect.ValueOf(n.True), nil
	case *parse.StringNode:
		return reflect.ValueOf(n.Text), nil
	case *parse.NumberNode:
		switch {
		case n.IsComplex:
			return reflect.ValueOf(n.Complex128), nil
		case n.IsFloat && !strings.ContainsAny(n.Text, "xX") && strings.ContainsAny(n.Text, ".eEpP"):
			return reflect.ValueOf(n.Float64), nil
		case n.IsInt:
			return reflect.ValueOf(int(n.Int64)), nil
		case n.IsUint:
			return reflect.ValueOf(n.Uint64), nil
		case n.IsFloat:
			return reflect.ValueOf(n.Float64), nil
		}
		return reflect.Value{}, s.errorf(n, "bad number %s", n.Text)
	case *parse.FieldNode, *parse.ChainNode, *parse.VariableNode, *parse.PipeNode, *parse.IdentifierNode:
		return s.command(dot, &parse.CommandNode{NodeType: parse.NodeCommand, Pos: n.Position(), Args: []parse.Node{n}}, reflect.Value{}, false)
	}
	return reflect.Value{}, s.errorf(n, "can't handle %s", n)
}

// fields follows a chain of field names from v: struct fields and map keys. As
// in text/template, a missing key is nothing ("<no value>" when printed), and so
// is any field of nothing; a field of a nil value is an error, and so is a last
// field given arguments (hasArgs), which only a method could take.
func (s *exec) fields(n parse.Node, v reflect.Value, names []string, hasArgs bool) (reflect.Value, error) {
	for i, name := range names {
		if !v.IsValid() {
			continue
		}
		if hasArgs && i == len(names)-1 && indirect(v).IsValid() && (indirect(v).Kind() == reflect.Struct || indirect(v).Kind() == reflect.Map) {
			return reflect.Value{}, s.errorf(n, "%s has arguments but cannot be invoked as function", name)
		}
		typ := v.Type()
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
			if v.IsNil() {
				return reflect.Value{}, s.errorf(n, "nil pointer evaluating %s.%s", typ, name)
			}
			v = v.Elem()
		}
		switch v.Kind() {
		case reflect.Struct:
			f, ok := v.Type().FieldByName(name)
			if !ok || !f.IsExported() {
				return reflect.Value{}, s.errorf(n, "can't evaluate field %s in type %s", name, typ)
			}
			v = v.FieldByIndex(f.Index)
		case reflect.Map:
			if v.Type().Key().Kind() != reflect.String {
				return reflect.Value{}, s.errorf(n, "can't evaluate field %s in type %s", name, typ)
			}
			v = v.MapIndex(reflect.ValueOf(name).Convert(v.Type().Key()))
		default:
			return reflect.Value{}, s.errorf(n, "can't evaluate field %s in type %s", name, typ)
		}
	}
	return v, nil
}

// call calls the function named by id with args (and final, when piped).
func (s *exec) call(dot reflect.Value, id *parse.IdentifierNode, argNodes []parse.Node, final reflect.Value, piped bool) (reflect.Value, error) {
	if id.Ident == "and" || id.Ident == "or" { // short-circuit: arguments evaluated in order, as needed
		nodes := argNodes
		if len(nodes)+btoi(piped) == 0 {
			return reflect.Value{}, s.errorf(id, "wrong number of args for %s: want at least 1 got 0", id.Ident)
		}
		var v reflect.Value
		for i := 0; i < len(nodes)+btoi(piped); i++ {
			if i < len(nodes) {
				var err error
				if v, err = s.arg(dot, nodes[i]); err != nil {
					return reflect.Value{}, err
				}
			} else {
				v = final
			}
			t, _ := truth(v)
			if t == (id.Ident == "or") {
				return v, nil
			}
		}
		return v, nil
	}
	args := make([]reflect.Value, 0, len(argNodes)+1)
	for _, a := range argNodes {
		v, err := s.arg(dot, a)
		if err != nil {
			return reflect.Value{}, err
		}
		args = append(args, v)
	}
	if piped {
		args = append(args, final)
	}
	v, err := builtin(id.Ident, args)
	if err != nil {
		return reflect.Value{}, s.errorf(id, "error calling %s: %v", id.Ident, err)
	}
	return v, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *exec) print(n parse.Node, v reflect.Value) error {
	if !v.IsValid() {
		s.out.WriteString("<no value>")
		return nil
	}
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			if v.Kind() == reflect.Interface {
				s.out.WriteString("<no value>")
			} else {
				s.out.WriteString("<nil>")
			}
			return nil
		}
		v = v.Elem()
	}
	if k := v.Kind(); k == reflect.Chan || k == reflect.Func {
		return s.errorf(n, "can't print %s of type %s", n, v.Type())
	}
	fmt.Fprint(&s.out, v.Interface())
	return nil
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
