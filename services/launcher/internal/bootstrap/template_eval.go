package bootstrap

import (
	"fmt"
	"reflect"
	"strings"
	"text/template/parse"
)

// The executor's expressions: pipelines, their commands and arguments, variables,
// field lookups, function calls and printing a value, as text/template evaluates
// them. The statements that use them (if, with, range, template) are in
// template.go, the functions themselves in template_funcs.go.

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
