package wasm

import (
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	// The well-known types the schema refers to, registered in GlobalFiles.
	_ "google.golang.org/protobuf/types/known/anypb"
	_ "google.golang.org/protobuf/types/known/durationpb"
	_ "google.golang.org/protobuf/types/known/wrapperspb"
)

// The schema of the messages the rewrite reads: envoy.config.core.v3's
// TypedExtensionConfig and the Wasm filter (HTTP and network have the same
// fields) down to its leaves, written here as a descriptor instead of linking
// go-control-plane's generated types (+2.4 MB PSS, +3.8 MB binary per pod:
// docs/services.md). It serves two things: a config is checked by decoding it
// with the schema before any of its bytes are rewritten, so the rewrite accepts
// exactly what Envoy's types accept (strings UTF-8, nested messages well
// formed); and a Wasm filter in a udpa TypedStruct is converted from JSON with
// protojson's own rules. TestSchemaMatchesEnvoysTypes compares every field
// with the generated types. Names are the relay's own; the fields are Envoy's.
const schemaPackage = "meshagent.xdsrelay.wasm"

// fd is one field: kind, and the message or enum it refers to ("" otherwise).
type fd struct {
	name  string
	num   int32
	kind  descriptorpb.FieldDescriptorProto_Type
	ref   string
	rep   bool
	oneof string // the oneof it is a member of
}

const (
	tString = descriptorpb.FieldDescriptorProto_TYPE_STRING
	tBytes  = descriptorpb.FieldDescriptorProto_TYPE_BYTES
	tBool   = descriptorpb.FieldDescriptorProto_TYPE_BOOL
	tInt64  = descriptorpb.FieldDescriptorProto_TYPE_INT64
	tEnum   = descriptorpb.FieldDescriptorProto_TYPE_ENUM
	tMsg    = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
	tMap    = descriptorpb.FieldDescriptorProto_TYPE_GROUP // marks a map<string, ref>; ref "" is map<string, string>
)

// schemaMessages are the messages, by their Envoy names' last element.
var schemaMessages = []struct {
	name   string
	fields []fd
}{
	{"TypedExtensionConfig", []fd{{"name", 1, tString, "", false, ""}, {"typed_config", 2, tMsg, ".google.protobuf.Any", false, ""}}},
	{"Wasm", []fd{{"config", 1, tMsg, "PluginConfig", false, ""}}},
	{"PluginConfig", []fd{
		{"name", 1, tString, "", false, ""}, {"root_id", 2, tString, "", false, ""},
		{"vm_config", 3, tMsg, "VmConfig", false, "vm"}, {"configuration", 4, tMsg, ".google.protobuf.Any", false, ""},
		{"fail_open", 5, tBool, "", false, ""}, {"capability_restriction_config", 6, tMsg, "CapabilityRestrictionConfig", false, ""},
		{"failure_policy", 7, tEnum, "FailurePolicy", false, ""}, {"reload_config", 8, tMsg, "ReloadConfig", false, ""},
		{"allow_on_headers_stop_iteration", 9, tMsg, ".google.protobuf.BoolValue", false, ""},
	}},
	{"VmConfig", []fd{
		{"vm_id", 1, tString, "", false, ""}, {"runtime", 2, tString, "", false, ""},
		{"code", 3, tMsg, "AsyncDataSource", false, ""}, {"configuration", 4, tMsg, ".google.protobuf.Any", false, ""},
		{"allow_precompiled", 5, tBool, "", false, ""}, {"nack_on_code_cache_miss", 6, tBool, "", false, ""},
		{"environment_variables", 7, tMsg, "EnvironmentVariables", false, ""},
		{"capability_restriction_config", 8, tMsg, "CapabilityRestrictionConfig", false, ""},
	}},
	{"EnvironmentVariables", []fd{{"host_env_keys", 1, tString, "", true, ""}, {"key_values", 2, tMap, "", true, ""}}},
	{"CapabilityRestrictionConfig", []fd{{"allowed_capabilities", 1, tMap, "SanitizationConfig", true, ""}}},
	{"SanitizationConfig", nil},
	{"ReloadConfig", []fd{{"backoff", 1, tMsg, "BackoffStrategy", false, ""}}},
	{"BackoffStrategy", []fd{{"base_interval", 1, tMsg, ".google.protobuf.Duration", false, ""}, {"max_interval", 2, tMsg, ".google.protobuf.Duration", false, ""}}},
	{"AsyncDataSource", []fd{{"local", 1, tMsg, "DataSource", false, "specifier"}, {"remote", 2, tMsg, "RemoteDataSource", false, "specifier"}}},
	{"DataSource", []fd{
		{"filename", 1, tString, "", false, "specifier"}, {"inline_bytes", 2, tBytes, "", false, "specifier"},
		{"inline_string", 3, tString, "", false, "specifier"}, {"environment_variable", 4, tString, "", false, "specifier"},
		{"watched_directory", 5, tMsg, "WatchedDirectory", false, ""},
	}},
	{"WatchedDirectory", []fd{{"path", 1, tString, "", false, ""}, {"watch_modify", 2, tBool, "", false, ""}}},
	{"RemoteDataSource", []fd{{"http_uri", 1, tMsg, "HttpUri", false, ""}, {"sha256", 2, tString, "", false, ""}, {"retry_policy", 3, tMsg, "RetryPolicy", false, ""}}},
	{"HttpUri", []fd{{"uri", 1, tString, "", false, ""}, {"cluster", 2, tString, "", false, "http_upstream_type"}, {"timeout", 3, tMsg, ".google.protobuf.Duration", false, ""}}},
	{"RetryPolicy", []fd{
		{"retry_back_off", 1, tMsg, "BackoffStrategy", false, ""}, {"num_retries", 2, tMsg, ".google.protobuf.UInt32Value", false, ""},
		{"retry_on", 3, tString, "", false, ""}, {"retry_priority", 4, tMsg, "RetryPriority", false, ""},
		{"retry_host_predicate", 5, tMsg, "RetryHostPredicate", true, ""}, {"host_selection_retry_max_attempts", 6, tInt64, "", false, ""},
	}},
	{"RetryPriority", []fd{{"name", 1, tString, "", false, ""}, {"typed_config", 2, tMsg, ".google.protobuf.Any", false, "config_type"}}},
	{"RetryHostPredicate", []fd{{"name", 1, tString, "", false, ""}, {"typed_config", 2, tMsg, ".google.protobuf.Any", false, "config_type"}}},
}

// failurePolicies is envoy.extensions.wasm.v3.FailurePolicy.
var failurePolicies = []string{"UNSPECIFIED", "FAIL_RELOAD", "FAIL_CLOSED", "FAIL_OPEN"}

// schema is the built descriptor of each message, by name: built at the first
// Wasm config, so that a relay that never sees one spends no heap on it.
var schema = sync.OnceValue(buildSchema)

func buildSchema() map[string]protoreflect.MessageDescriptor {
	file := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("meshagent/xdsrelay/wasm/schema.proto"),
		Package:    proto.String(schemaPackage),
		Syntax:     proto.String("proto3"),
		Dependency: []string{"google/protobuf/any.proto", "google/protobuf/duration.proto", "google/protobuf/wrappers.proto"},
	}
	enum := &descriptorpb.EnumDescriptorProto{Name: proto.String("FailurePolicy")}
	for i, v := range failurePolicies {
		enum.Value = append(enum.Value, &descriptorpb.EnumValueDescriptorProto{Name: proto.String(v), Number: proto.Int32(int32(i))})
	}
	file.EnumType = []*descriptorpb.EnumDescriptorProto{enum}
	for _, m := range schemaMessages {
		file.MessageType = append(file.MessageType, messageProto(m.name, m.fields))
	}
	f, err := protodesc.NewFile(file, protoregistry.GlobalFiles)
	if err != nil {
		panic(fmt.Sprintf("wasm: the Wasm schema does not build: %v", err)) // a bug in the table above, caught by every test
	}
	out := map[string]protoreflect.MessageDescriptor{}
	for i := 0; i < f.Messages().Len(); i++ {
		out[string(f.Messages().Get(i).Name())] = f.Messages().Get(i)
	}
	return out
}

// messageProto is the descriptor of message name with fields.
func messageProto(name string, fields []fd) *descriptorpb.DescriptorProto {
	m := &descriptorpb.DescriptorProto{Name: proto.String(name)}
	oneofs := map[string]int32{}
	for _, f := range fields {
		p := &descriptorpb.FieldDescriptorProto{Name: proto.String(f.name), Number: proto.Int32(f.num), Type: f.kind.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}
		if f.rep {
			p.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
		}
		if f.kind == tMap {
			entry := mapEntry(f)
			m.NestedType = append(m.NestedType, entry)
			p.Type, p.TypeName = tMsg.Enum(), proto.String(schemaRef(name+"."+entry.GetName()))
		} else if f.ref != "" {
			p.TypeName = proto.String(schemaRef(f.ref))
		}
		if f.oneof != "" {
			i, ok := oneofs[f.oneof]
			if !ok {
				i = int32(len(m.OneofDecl))
				oneofs[f.oneof] = i
				m.OneofDecl = append(m.OneofDecl, &descriptorpb.OneofDescriptorProto{Name: proto.String(f.oneof)})
			}
			p.OneofIndex = proto.Int32(i)
		}
		m.Field = append(m.Field, p)
	}
	return m
}

// mapEntry is the entry message of the map field f: string keys, values of f.ref
// (a string when "").
func mapEntry(f fd) *descriptorpb.DescriptorProto {
	value := &descriptorpb.FieldDescriptorProto{Name: proto.String("value"), Number: proto.Int32(2), Type: tString.Enum(),
		Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}
	if f.ref != "" {
		value.Type, value.TypeName = tMsg.Enum(), proto.String(schemaRef(f.ref))
	}
	return &descriptorpb.DescriptorProto{
		Name: proto.String(mapEntryName(f.name)),
		Field: []*descriptorpb.FieldDescriptorProto{{Name: proto.String("key"), Number: proto.Int32(1), Type: tString.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}, value},
		Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
	}
}

// mapEntryName is protoc's name for a map field's entry: key_values → KeyValuesEntry.
func mapEntryName(field string) string {
	out, up := []byte{}, true
	for i := 0; i < len(field); i++ {
		c := field[i]
		if c == '_' {
			up = true
			continue
		}
		if up && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		out, up = append(out, c), false
	}
	return string(out) + "Entry"
}

// schemaRef is the full name of a message or enum of the schema, or ref itself
// when it is already full (a well-known type).
func schemaRef(ref string) string {
	if ref[0] == '.' {
		return ref
	}
	return "." + schemaPackage + "." + ref
}

// check decodes b as the schema's message name, as Envoy's generated type would:
// an error is what proto.Unmarshal into that type would fail with.
func check(b []byte, name string) error {
	return proto.Unmarshal(b, dynamicpb.NewMessage(schema()[name]))
}
