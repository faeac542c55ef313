package wasm

import (
	"fmt"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// schemaDiff lists how the schema's message mine differs from Envoy's generated
// envoy, field by field and down every message field of the schema's own.
func schemaDiff(mine, envoy protoreflect.MessageDescriptor, path string, seen map[string]bool) []string {
	if seen[path] {
		return nil
	}
	seen[path] = true
	var out []string
	if mine.Fields().Len() != envoy.Fields().Len() {
		out = append(out, fmt.Sprintf("%s: %d fields, Envoy's %d", path, mine.Fields().Len(), envoy.Fields().Len()))
	}
	for i := 0; i < envoy.Fields().Len(); i++ {
		e := envoy.Fields().Get(i)
		m := mine.Fields().ByNumber(e.Number())
		where := path + "." + string(e.Name())
		if m == nil {
			out = append(out, where+": missing")
			continue
		}
		if d := fieldDiff(m, e); d != "" {
			out = append(out, where+": "+d)
			continue
		}
		switch {
		case e.IsMap() && e.MapValue().Message() != nil:
			out = append(out, schemaDiff(m.MapValue().Message(), e.MapValue().Message(), where+"[value]", seen)...)
		case e.Message() != nil && !e.IsMap() && !strings.HasPrefix(string(e.Message().FullName()), "google.protobuf."):
			out = append(out, schemaDiff(m.Message(), e.Message(), where, seen)...)
		}
	}
	return out
}

// fieldDiff says how two fields of the same number differ; "" when they do not.
func fieldDiff(m, e protoreflect.FieldDescriptor) string {
	oneof := func(f protoreflect.FieldDescriptor) string {
		if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
			return string(o.Name())
		}
		return ""
	}
	type shape struct {
		Name, JSON, Oneof string
		Kind              protoreflect.Kind
		Card              protoreflect.Cardinality
		Map, UTF8         bool
		Ref               string
	}
	ref := func(f protoreflect.FieldDescriptor) string {
		switch {
		case f.IsMap():
			return f.MapKey().Kind().String() + "→" + f.MapValue().Kind().String()
		case f.Enum() != nil:
			var vs []string
			for i := 0; i < f.Enum().Values().Len(); i++ {
				v := f.Enum().Values().Get(i)
				vs = append(vs, fmt.Sprintf("%s=%d", strings.TrimPrefix(string(v.Name()), "FailurePolicy_"), v.Number()))
			}
			return strings.Join(vs, ",")
		case f.Message() != nil && strings.HasPrefix(string(f.Message().FullName()), "google.protobuf."):
			return string(f.Message().FullName())
		}
		return ""
	}
	of := func(f protoreflect.FieldDescriptor) shape {
		return shape{string(f.Name()), f.JSONName(), oneof(f), f.Kind(), f.Cardinality(), f.IsMap(),
			f.Kind() == protoreflect.StringKind && f.Syntax() == protoreflect.Proto3, ref(f)}
	}
	if a, b := of(m), of(e); a != b {
		return fmt.Sprintf("%+v, Envoy's %+v", a, b)
	}
	return ""
}

// TestSchemaMatchesEnvoysTypes: the descriptor the rewrite decodes with has
// Envoy's fields, numbers, kinds, JSON names, oneofs and enum values, down to
// the leaves.
func TestSchemaMatchesEnvoysTypes(t *testing.T) {
	for _, c := range []struct {
		mine  string
		envoy protoreflect.MessageDescriptor
	}{
		{"TypedExtensionConfig", (&corev3.TypedExtensionConfig{}).ProtoReflect().Descriptor()},
		{"Wasm", (&httpwasm.Wasm{}).ProtoReflect().Descriptor()},
		{"Wasm", (&netwasm.Wasm{}).ProtoReflect().Descriptor()},
	} {
		for _, d := range schemaDiff(schema()[c.mine], c.envoy, string(c.envoy.FullName()), map[string]bool{}) {
			t.Error(d)
		}
	}
}

// TestSchemaDiffCatchesADifference is the control: a message with a field of
// another number, kind or name is told apart from Envoy's.
func TestSchemaDiffCatchesADifference(t *testing.T) {
	envoy := (&corev3.TypedExtensionConfig{}).ProtoReflect().Descriptor()
	if d := schemaDiff(schema()["HttpUri"], envoy, "x", map[string]bool{}); len(d) == 0 {
		t.Fatal("HttpUri compared the same as TypedExtensionConfig")
	}
	if d := schemaDiff(schema()["RetryPriority"], (&corev3.RetryPolicy_RetryHostPredicate{}).ProtoReflect().Descriptor(), "x", map[string]bool{}); len(d) != 0 {
		t.Fatalf("two messages of the same fields differ: %v", d)
	}
	if d := schemaDiff(schema()["DataSource"], (&corev3.AsyncDataSource{}).ProtoReflect().Descriptor(), "x", map[string]bool{}); len(d) == 0 {
		t.Fatal("DataSource compared the same as AsyncDataSource")
	}
}
