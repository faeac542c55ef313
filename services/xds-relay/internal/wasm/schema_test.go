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
func schemaDiff(mine string, envoy protoreflect.MessageDescriptor, path string, seen map[string]bool) []string {
	if seen[path] {
		return nil
	}
	seen[path] = true
	fields := schema[mine]
	var out []string
	if len(fields) != envoy.Fields().Len() {
		out = append(out, fmt.Sprintf("%s: %d fields, Envoy's %d", path, len(fields), envoy.Fields().Len()))
	}
	for i := 0; i < envoy.Fields().Len(); i++ {
		e := envoy.Fields().Get(i)
		m, ok := fields[e.Number()]
		where := path + "." + string(e.Name())
		if !ok {
			out = append(out, where+": missing")
			continue
		}
		if a, b := shapeOf(m), envoyShape(e); a != b {
			out = append(out, fmt.Sprintf("%s: %+v, Envoy's %+v", where, a, b))
			continue
		}
		switch {
		case m.kind == tMap && m.ref != "":
			out = append(out, schemaDiff(m.ref, e.MapValue().Message(), where+"[value]", seen)...)
		case m.kind == tMsg:
			out = append(out, schemaDiff(m.ref, e.Message(), where, seen)...)
		}
	}
	return out
}

// shape is what a field is, compared between the schema and Envoy's types.
type shape struct {
	Name, JSON, Oneof, Kind, Ref string
	Repeated                     bool
}

func shapeOf(f fd) shape {
	kinds := map[kind]string{tString: "string", tBytes: "bytes", tBool: "bool", tInt64: "int64", tEnum: "enum", tMsg: "message", tWKT: "message", tMap: "map"}
	s := shape{Name: f.name, JSON: jsonName(f.name), Oneof: f.oneof, Kind: kinds[f.kind], Repeated: f.rep}
	switch f.kind {
	case tEnum:
		s.Ref = strings.Join(failurePolicies, ",")
	case tWKT:
		s.Ref = "google.protobuf." + f.ref
	case tMap:
		s.Ref = "string→string"
		if f.ref != "" {
			s.Ref = "string→message"
		}
	}
	return s
}

func envoyShape(e protoreflect.FieldDescriptor) shape {
	s := shape{Name: string(e.Name()), JSON: e.JSONName(), Kind: e.Kind().String(), Repeated: e.IsList() || e.IsMap()}
	if o := e.ContainingOneof(); o != nil && !o.IsSynthetic() {
		s.Oneof = string(o.Name())
	}
	switch {
	case e.IsMap():
		s.Kind, s.Ref = "map", e.MapKey().Kind().String()+"→"+e.MapValue().Kind().String()
	case e.Enum() != nil:
		var vs []string
		for i := 0; i < e.Enum().Values().Len(); i++ {
			if v := e.Enum().Values().Get(i); int(v.Number()) == i {
				vs = append(vs, string(v.Name()))
			}
		}
		s.Ref = strings.Join(vs, ",")
	case e.Message() != nil && strings.HasPrefix(string(e.Message().FullName()), "google.protobuf."):
		s.Ref = string(e.Message().FullName())
	}
	if e.Kind() == protoreflect.StringKind && e.Syntax() != protoreflect.Proto3 {
		s.Kind = "string, not checked as UTF-8"
	}
	return s
}

// TestSchemaMatchesEnvoysTypes: the descriptor the rewrite decodes with has
// Envoy's fields, numbers, kinds, JSON names, oneofs and enum values, down to
// the leaves; its strings are checked as UTF-8 as Envoy's (proto3) are.
func TestSchemaMatchesEnvoysTypes(t *testing.T) {
	for _, c := range []struct {
		mine  string
		envoy protoreflect.MessageDescriptor
	}{
		{"TypedExtensionConfig", (&corev3.TypedExtensionConfig{}).ProtoReflect().Descriptor()},
		{"Wasm", (&httpwasm.Wasm{}).ProtoReflect().Descriptor()},
		{"Wasm", (&netwasm.Wasm{}).ProtoReflect().Descriptor()},
	} {
		for _, d := range schemaDiff(c.mine, c.envoy, string(c.envoy.FullName()), map[string]bool{}) {
			t.Error(d)
		}
	}
}

// TestSchemaDiffCatchesADifference is the control: a message with a field of
// another number, kind or name is told apart from Envoy's.
func TestSchemaDiffCatchesADifference(t *testing.T) {
	envoy := (&corev3.TypedExtensionConfig{}).ProtoReflect().Descriptor()
	if d := schemaDiff("HttpUri", envoy, "x", map[string]bool{}); len(d) == 0 {
		t.Fatal("HttpUri compared the same as TypedExtensionConfig")
	}
	if d := schemaDiff("RetryPriority", (&corev3.RetryPolicy_RetryHostPredicate{}).ProtoReflect().Descriptor(), "x", map[string]bool{}); len(d) != 0 {
		t.Fatalf("two messages of the same fields differ: %v", d)
	}
	if d := schemaDiff("DataSource", (&corev3.AsyncDataSource{}).ProtoReflect().Descriptor(), "x", map[string]bool{}); len(d) == 0 {
		t.Fatal("DataSource compared the same as AsyncDataSource")
	}
}
