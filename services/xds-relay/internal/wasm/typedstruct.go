package wasm

import (
	"errors"
	"fmt"
	"sort"

	"github.com/meshagent/meshagent/pkg/xdswire"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A Wasm filter in a udpa.type.v1.TypedStruct is the filter's JSON form in a
// google.protobuf.Struct. Istio's agent converts it with protojson into the
// generated type; here the schema's table (schema.go) walks the Struct and
// writes the wire form, by protojson's rules: a field is named by its JSON or
// its proto name, an unknown or repeated name or a second member of a oneof is
// an error, null leaves a field unset, and scalars are read as protojson reads
// them (the google.protobuf wrappers' JSON is their value's: an int64 is read
// as an Int64Value). The well-known types in the filter (Any, Duration, the
// wrappers) are converted by protojson itself. TestRewriteMatchesTheReference
// and FuzzWasmRewrite hold it to the generated types' conversion.

// fromTypedStruct converts the Wasm filter in the udpa.type.v1.TypedStruct b
// from its JSON form, as Istio's agent does; wasm is false when b holds
// something else.
func fromTypedStruct(name string, b []byte) (filter []byte, wasm, network bool, err error) {
	var url string
	var value []byte
	err = xdswire.Fields(b, func(f xdswire.Field) (err error) {
		switch {
		case f.Is(1, protowire.BytesType):
			url, err = f.String()
		case f.Is(2, protowire.BytesType):
			value = append(value, f.Bytes...)
		}
		return err
	})
	st := &structpb.Struct{}
	if err == nil {
		err = proto.Unmarshal(value, st)
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("failed to unmarshal typed config for wasm filter: %w", err)
	}
	if url != httpWasmType && url != networkWasmType {
		return nil, false, false, nil
	}
	if _, err = protojson.Marshal(st); err == nil { // what JSON cannot hold (NaN, a value of no kind) fails here
		filter, err = encodeJSON(nil, st.GetFields(), "Wasm")
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("failed to convert extension config struct %s to a Wasm filter: %w", name, err)
	}
	return filter, true, url == networkWasmType, nil
}

// byName is each schema message's fields by JSON name and by proto name.
var byName = func() map[string]map[string]fd {
	out := map[string]map[string]fd{}
	for _, m := range schemaMessages {
		out[m.name] = map[string]fd{}
		for _, f := range m.fields {
			out[m.name][f.name], out[m.name][jsonName(f.name)] = f, f
		}
	}
	return out
}()

// jsonName is protoc's JSON name of a field: vm_config → vmConfig.
func jsonName(name string) string {
	var b []byte
	under := false
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c != '_' {
			if under && 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			b = append(b, c)
		}
		under = c == '_'
	}
	return string(b)
}

// encodeJSON appends the wire form of the schema message msg whose JSON object is obj.
func encodeJSON(b []byte, obj map[string]*structpb.Value, msg string) ([]byte, error) {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	seen, oneofs := map[protowire.Number]bool{}, map[string]bool{}
	for _, k := range keys {
		d, ok := byName[msg][k]
		if !ok {
			return nil, fmt.Errorf("unknown field %q in %s", k, msg)
		}
		if seen[d.num] {
			return nil, fmt.Errorf("duplicate field %q in %s", k, msg)
		}
		seen[d.num] = true
		v := obj[k]
		if _, null := v.GetKind().(*structpb.Value_NullValue); null {
			continue
		}
		var err error
		switch {
		case d.kind == tMap:
			b, err = encodeMap(b, d, v)
		case d.rep:
			l, ok := v.GetKind().(*structpb.Value_ListValue)
			if !ok {
				return nil, fmt.Errorf("field %q of %s: not a list", k, msg)
			}
			for _, e := range l.ListValue.GetValues() {
				if b, err = encodeValue(b, d, e, true); err != nil {
					break
				}
			}
		default:
			if d.oneof != "" && oneofs[d.oneof] {
				return nil, fmt.Errorf("field %q of %s: oneof %s is already set", k, msg, d.oneof)
			}
			oneofs[d.oneof] = d.oneof != ""
			b, err = encodeValue(b, d, v, d.oneof != "")
		}
		if err != nil {
			return nil, fmt.Errorf("field %q of %s: %w", k, msg, err)
		}
	}
	return b, nil
}

// encodeMap appends the entries of the map field d whose JSON object is v.
func encodeMap(b []byte, d fd, v *structpb.Value) ([]byte, error) {
	st, ok := v.GetKind().(*structpb.Value_StructValue)
	if !ok {
		return nil, errors.New("not an object")
	}
	fields := st.StructValue.GetFields()
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		entry := xdswire.AppendBytes(nil, 1, []byte(k))
		var err error
		if d.ref == "" {
			entry, err = encodeValue(entry, fd{num: 2, kind: tString}, fields[k], true)
		} else {
			entry, err = encodeValue(entry, fd{num: 2, kind: tMsg, ref: d.ref}, fields[k], true)
		}
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", k, err)
		}
		b = xdswire.AppendBytes(b, d.num, entry)
	}
	return b, nil
}

// encodeValue appends field d with the value v; a zero scalar is left out
// (proto3) unless always (a oneof member, a list's or map's element).
func encodeValue(b []byte, d fd, v *structpb.Value, always bool) ([]byte, error) {
	varint := func(n uint64) []byte {
		if n == 0 && !always {
			return b
		}
		return protowire.AppendVarint(protowire.AppendTag(b, d.num, protowire.VarintType), n)
	}
	bytes := func(p []byte) []byte {
		if len(p) == 0 && !always {
			return b
		}
		return xdswire.AppendBytes(b, d.num, p)
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		switch d.kind {
		case tString:
			return bytes([]byte(k.StringValue)), nil
		case tEnum:
			for i, name := range failurePolicies {
				if name == k.StringValue {
					return varint(uint64(i)), nil
				}
			}
			return nil, fmt.Errorf("invalid value for enum field: %q", k.StringValue)
		}
	case *structpb.Value_BoolValue:
		if d.kind == tBool {
			return varint(map[bool]uint64{false: 0, true: 1}[k.BoolValue]), nil
		}
	case *structpb.Value_StructValue:
		if d.kind == tMsg {
			m, err := encodeJSON(nil, k.StructValue.GetFields(), d.ref)
			return xdswire.AppendBytes(b, d.num, m), err
		}
	case *structpb.Value_NumberValue:
		if d.kind == tEnum {
			n := &wrapperspb.Int32Value{}
			err := viaProtojson(v, n)
			return varint(uint64(int64(n.GetValue()))), err
		}
	}
	switch d.kind {
	case tInt64:
		n := &wrapperspb.Int64Value{}
		err := viaProtojson(v, n)
		return varint(uint64(n.GetValue())), err
	case tBytes:
		p := &wrapperspb.BytesValue{}
		err := viaProtojson(v, p)
		return bytes(p.GetValue()), err
	case tWKT:
		m := wellKnown(d.ref)
		if err := viaProtojson(v, m); err != nil {
			return nil, err
		}
		p, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		return xdswire.AppendBytes(b, d.num, p), err
	}
	return nil, fmt.Errorf("invalid value for %s field: %v", d.name, v)
}

// viaProtojson reads v into m as protojson reads v's JSON.
func viaProtojson(v *structpb.Value, m proto.Message) error {
	js, err := protojson.Marshal(v)
	if err == nil {
		err = protojson.Unmarshal(js, m)
	}
	return err
}

// wellKnown is a new message of the schema's well-known type name.
func wellKnown(name string) proto.Message {
	switch name {
	case "Any":
		return &anypb.Any{}
	case "Duration":
		return &durationpb.Duration{}
	case "BoolValue":
		return &wrapperspb.BoolValue{}
	}
	return &wrapperspb.UInt32Value{} // UInt32Value, the last
}
