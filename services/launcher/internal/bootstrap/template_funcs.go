package bootstrap

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// netSplit is the host or port of a host:port, "" when it is not one.
func netSplit(a string, port bool) string {
	h, p, _ := net.SplitHostPort(a)
	if port {
		return p
	}
	return h
}

// builtin calls one of the functions on evaluated arguments.
func builtin(name string, args []reflect.Value) (reflect.Value, error) {
	values := func() []any {
		out := make([]any, len(args))
		for i, a := range args {
			if a = indirectInterface(a); a.IsValid() {
				out[i] = a.Interface()
			}
		}
		return out
	}
	want := func(n int) error {
		if len(args) != n {
			return fmt.Errorf("wrong number of args for %s: want %d got %d", name, n, len(args))
		}
		return nil
	}
	switch name {
	case "host", "port":
		if err := want(1); err != nil {
			return reflect.Value{}, err
		}
		a := indirectInterface(args[0])
		if !a.IsValid() || a.Kind() != reflect.String {
			return reflect.Value{}, fmt.Errorf("wrong type for value; expected string; got %s", typeName(a))
		}
		return reflect.ValueOf(netSplit(a.String(), name == "port")), nil
	case "not":
		if err := want(1); err != nil {
			return reflect.Value{}, err
		}
		t, _ := truth(args[0])
		return reflect.ValueOf(!t), nil
	case "len":
		if err := want(1); err != nil {
			return reflect.Value{}, err
		}
		a := indirect(args[0])
		switch a.Kind() {
		case reflect.Array, reflect.Chan, reflect.Map, reflect.Slice, reflect.String:
			return reflect.ValueOf(a.Len()), nil
		}
		return reflect.Value{}, fmt.Errorf("len of type %s", typeName(a))
	case "index":
		if len(args) == 0 {
			return reflect.Value{}, errors.New("wrong number of args for index: want at least 1 got 0")
		}
		return index(args[0], args[1:])
	case "slice":
		if len(args) == 0 {
			return reflect.Value{}, errors.New("wrong number of args for slice: want at least 1 got 0")
		}
		return slice(args[0], args[1:])
	case "print":
		return reflect.ValueOf(fmt.Sprint(values()...)), nil
	case "println":
		return reflect.ValueOf(fmt.Sprintln(values()...)), nil
	case "printf":
		if len(args) == 0 {
			return reflect.Value{}, errors.New("wrong number of args for printf: want at least 1 got 0")
		}
		f := indirectInterface(args[0])
		if !f.IsValid() || f.Kind() != reflect.String {
			return reflect.Value{}, fmt.Errorf("wrong type for value; expected string; got %s", typeName(f))
		}
		return reflect.ValueOf(fmt.Sprintf(f.String(), values()[1:]...)), nil
	case "html":
		return reflect.ValueOf(htmlEscape(evalArgs(values()))), nil
	case "js":
		return reflect.ValueOf(jsEscape(evalArgs(values()))), nil
	case "urlquery":
		return reflect.ValueOf(url.QueryEscape(evalArgs(values()))), nil
	case "eq", "ne", "lt", "le", "gt", "ge":
		return compare(name, args)
	}
	return reflect.Value{}, fmt.Errorf("%q is not a defined function", name)
}

// evalArgs is what html and urlquery escape: a lone string as is, else fmt.Sprint.
func evalArgs(vs []any) string {
	if len(vs) == 1 {
		if s, ok := vs[0].(string); ok {
			return s
		}
	}
	return fmt.Sprint(vs...)
}

// htmlEscape is text/template's HTMLEscapeString.
func htmlEscape(s string) string {
	return strings.NewReplacer("\000", "\uFFFD", `"`, "&#34;", "'", "&#39;", "&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// jsEscape is text/template's JSEscapeString.
func jsEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\\' || r == '\'' || r == '"':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '<' || r == '>' || r == '&' || r == '=' || r < ' ':
			fmt.Fprintf(&b, `\u%04X`, r)
		case r < utf8.RuneSelf || unicode.IsPrint(r):
			b.WriteString(s[i : i+size])
		default:
			fmt.Fprintf(&b, `\u%04X`, r)
		}
		i += size
	}
	return b.String()
}

func indirectInterface(v reflect.Value) reflect.Value {
	if v.IsValid() && v.Kind() == reflect.Interface {
		if v.IsNil() {
			return reflect.Value{}
		}
		return v.Elem()
	}
	return v
}

func typeName(v reflect.Value) string {
	if !v.IsValid() {
		return "<nil>"
	}
	return v.Type().String()
}

// index is text/template's index: item indexed by each of indexes in turn (a
// missing map key is the zero value).
func index(item reflect.Value, indexes []reflect.Value) (reflect.Value, error) {
	item = indirectInterface(item)
	if !item.IsValid() {
		return reflect.Value{}, errors.New("index of untyped nil")
	}
	for _, i := range indexes {
		i = indirectInterface(i)
		for item.Kind() == reflect.Pointer || item.Kind() == reflect.Interface {
			if item.IsNil() {
				return reflect.Value{}, errors.New("index of nil pointer")
			}
			item = item.Elem()
		}
		switch item.Kind() {
		case reflect.Array, reflect.Slice, reflect.String:
			x, err := indexArg(i, item.Len()-1)
			if err != nil {
				return reflect.Value{}, err
			}
			item = item.Index(x)
		case reflect.Map:
			if !i.IsValid() || !i.Type().AssignableTo(item.Type().Key()) {
				return reflect.Value{}, fmt.Errorf("value has type %s; should be %s", typeName(i), item.Type().Key())
			}
			if x := item.MapIndex(i); x.IsValid() {
				item = x
			} else {
				item = reflect.Zero(item.Type().Elem())
			}
		default:
			return reflect.Value{}, fmt.Errorf("can't index item of type %s", item.Type())
		}
	}
	return item, nil
}

// indexArg is i as an index no greater than max.
func indexArg(i reflect.Value, max int) (int, error) {
	var x int64
	switch i.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		x = i.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		x = int64(i.Uint())
	case reflect.Invalid:
		return 0, errors.New("cannot index slice/array with nil")
	default:
		return 0, fmt.Errorf("cannot index slice/array with type %s", i.Type())
	}
	if x < 0 || x > int64(max) {
		return 0, fmt.Errorf("index out of range: %d", x)
	}
	return int(x), nil
}

// slice is text/template's slice: item[i:j] or item[i:j:k].
func slice(item reflect.Value, indexes []reflect.Value) (reflect.Value, error) {
	item = indirectInterface(item)
	if !item.IsValid() {
		return reflect.Value{}, errors.New("slice of untyped nil")
	}
	if len(indexes) > 3 {
		return reflect.Value{}, fmt.Errorf("too many slice indexes: %d", len(indexes))
	}
	var max int
	switch item.Kind() {
	case reflect.String:
		if len(indexes) == 3 {
			return reflect.Value{}, errors.New("cannot 3-index slice a string")
		}
		max = item.Len()
	case reflect.Slice:
		max = item.Cap()
	default:
		return reflect.Value{}, fmt.Errorf("can't slice item of type %s", item.Type())
	}
	idx := [3]int{0, item.Len()}
	for i, x := range indexes {
		n, err := indexArg(indirectInterface(x), max)
		if err != nil {
			return reflect.Value{}, err
		}
		idx[i] = n
	}
	if idx[0] > idx[1] {
		return reflect.Value{}, fmt.Errorf("invalid slice index: %d > %d", idx[0], idx[1])
	}
	if len(indexes) < 3 {
		return item.Slice(idx[0], idx[1]), nil
	}
	if idx[1] > idx[2] {
		return reflect.Value{}, fmt.Errorf("invalid slice index: %d > %d", idx[1], idx[2])
	}
	return item.Slice3(idx[0], idx[1], idx[2]), nil
}

// The kinds comparisons tell apart.
const (
	otherKind = iota
	boolKind
	complexKind
	intKind
	floatKind
	stringKind
	uintKind
)

func basicKind(v reflect.Value) int {
	switch v.Kind() {
	case reflect.Bool:
		return boolKind
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return intKind
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return uintKind
	case reflect.Float32, reflect.Float64:
		return floatKind
	case reflect.Complex64, reflect.Complex128:
		return complexKind
	case reflect.String:
		return stringKind
	}
	return otherKind
}

var errBadComparison = errors.New("incompatible types for comparison")

// compare is text/template's eq, ne, lt, le, gt and ge.
func compare(name string, args []reflect.Value) (reflect.Value, error) {
	if len(args) < 2 || (name != "eq" && len(args) != 2) {
		return reflect.Value{}, fmt.Errorf("wrong number of args for %s: want 2 got %d", name, len(args))
	}
	var (
		ok  bool
		err error
	)
	switch name {
	case "eq":
		ok, err = eq(args[0], args[1:]...)
	case "ne":
		ok, err = eq(args[0], args[1])
		ok = !ok
	case "lt":
		ok, err = lt(args[0], args[1])
	case "le":
		if ok, err = lt(args[0], args[1]); err == nil && !ok {
			ok, err = eq(args[0], args[1])
		}
	case "gt":
		if ok, err = lt(args[0], args[1]); err == nil && !ok {
			ok, err = eq(args[0], args[1])
		}
		ok = !ok
	case "ge":
		ok, err = lt(args[0], args[1])
		ok = !ok
	}
	if err != nil {
		return reflect.Value{}, err
	}
	return reflect.ValueOf(ok), nil
}

func eq(a reflect.Value, bs ...reflect.Value) (bool, error) {
	a = indirectInterface(a)
	ka := basicKind(a)
	for _, b := range bs {
		b = indirectInterface(b)
		kb := basicKind(b)
		var same bool
		switch {
		case ka == intKind && kb == uintKind:
			same = a.Int() >= 0 && uint64(a.Int()) == b.Uint()
		case ka == uintKind && kb == intKind:
			same = b.Int() >= 0 && a.Uint() == uint64(b.Int())
		case ka != kb:
			if a.IsValid() && b.IsValid() {
				return false, errBadComparison
			}
		case ka == boolKind:
			same = a.Bool() == b.Bool()
		case ka == complexKind:
			same = a.Complex() == b.Complex()
		case ka == floatKind:
			same = a.Float() == b.Float()
		case ka == intKind:
			same = a.Int() == b.Int()
		case ka == stringKind:
			same = a.String() == b.String()
		case ka == uintKind:
			same = a.Uint() == b.Uint()
		default:
			if !a.IsValid() || !b.IsValid() {
				same = a.IsValid() == b.IsValid()
			} else if !a.Type().Comparable() || !b.Type().Comparable() {
				return false, fmt.Errorf("non-comparable types %s and %s", a.Type(), b.Type())
			} else {
				same = a.Interface() == b.Interface()
			}
		}
		if same {
			return true, nil
		}
	}
	return false, nil
}

func lt(a, b reflect.Value) (bool, error) {
	a, b = indirectInterface(a), indirectInterface(b)
	ka, kb := basicKind(a), basicKind(b)
	switch {
	case ka == intKind && kb == uintKind:
		return a.Int() < 0 || uint64(a.Int()) < b.Uint(), nil
	case ka == uintKind && kb == intKind:
		return b.Int() >= 0 && a.Uint() < uint64(b.Int()), nil
	case ka != kb:
		return false, errBadComparison
	case ka == floatKind:
		return a.Float() < b.Float(), nil
	case ka == intKind:
		return a.Int() < b.Int(), nil
	case ka == stringKind:
		return a.String() < b.String(), nil
	case ka == uintKind:
		return a.Uint() < b.Uint(), nil
	}
	return false, errors.New("invalid type for comparison")
}
