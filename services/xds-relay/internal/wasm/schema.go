package wasm

import (
	"fmt"
	"unicode/utf8"

	"github.com/meshagent/meshagent/pkg/xdswire"
	"google.golang.org/protobuf/encoding/protowire"
)

// The schema of the messages the rewrite reads: envoy.config.core.v3's
// TypedExtensionConfig and the Wasm filter (HTTP and network have the same
// fields) down to its leaves, written here as a table instead of linking
// go-control-plane's generated types (+2.4 MB PSS, +3.8 MB binary per pod) or
// building descriptors at run time (protodesc and dynamicpb: +0.4 MB PSS;
// docs/services.md). It serves two things: a config is checked against it
// before any of its bytes are rewritten, so the rewrite accepts exactly what
// Envoy's types accept (check: strings UTF-8, nested messages well formed); and
// a Wasm filter in a udpa TypedStruct is converted from its JSON form by it
// (typedstruct.go). TestSchemaMatchesEnvoysTypes compares every field with the
// generated types.

// kind is a field's type, as far as the wire and JSON forms need it.
type kind uint8

const (
	tString kind = iota
	tBytes
	tBool
	tInt64
	tEnum // FailurePolicy, the one enum
	tMsg  // a message of the schema, ref
	tWKT  // google.protobuf.<ref>, converted by protojson with its own type
	tMap  // map<string, ref>; ref "" is map<string, string>
)

// fd is one field: kind, and the message it refers to ("" otherwise).
type fd struct {
	name  string
	num   protowire.Number
	kind  kind
	ref   string
	rep   bool
	oneof string // the oneof it is a member of
}

// schemaMessages are the messages, by their Envoy names' last element.
var schemaMessages = []struct {
	name   string
	fields []fd
}{
	{"TypedExtensionConfig", []fd{{"name", 1, tString, "", false, ""}, {"typed_config", 2, tWKT, "Any", false, ""}}},
	{"Wasm", []fd{{"config", 1, tMsg, "PluginConfig", false, ""}}},
	{"PluginConfig", []fd{
		{"name", 1, tString, "", false, ""}, {"root_id", 2, tString, "", false, ""},
		{"vm_config", 3, tMsg, "VmConfig", false, "vm"}, {"configuration", 4, tWKT, "Any", false, ""},
		{"fail_open", 5, tBool, "", false, ""}, {"capability_restriction_config", 6, tMsg, "CapabilityRestrictionConfig", false, ""},
		{"failure_policy", 7, tEnum, "FailurePolicy", false, ""}, {"reload_config", 8, tMsg, "ReloadConfig", false, ""},
		{"allow_on_headers_stop_iteration", 9, tWKT, "BoolValue", false, ""},
	}},
	{"VmConfig", []fd{
		{"vm_id", 1, tString, "", false, ""}, {"runtime", 2, tString, "", false, ""},
		{"code", 3, tMsg, "AsyncDataSource", false, ""}, {"configuration", 4, tWKT, "Any", false, ""},
		{"allow_precompiled", 5, tBool, "", false, ""}, {"nack_on_code_cache_miss", 6, tBool, "", false, ""},
		{"environment_variables", 7, tMsg, "EnvironmentVariables", false, ""},
		{"capability_restriction_config", 8, tMsg, "CapabilityRestrictionConfig", false, ""},
	}},
	{"EnvironmentVariables", []fd{{"host_env_keys", 1, tString, "", true, ""}, {"key_values", 2, tMap, "", true, ""}}},
	{"CapabilityRestrictionConfig", []fd{{"allowed_capabilities", 1, tMap, "SanitizationConfig", true, ""}}},
	{"SanitizationConfig", nil},
	{"ReloadConfig", []fd{{"backoff", 1, tMsg, "BackoffStrategy", false, ""}}},
	{"BackoffStrategy", []fd{{"base_interval", 1, tWKT, "Duration", false, ""}, {"max_interval", 2, tWKT, "Duration", false, ""}}},
	{"AsyncDataSource", []fd{{"local", 1, tMsg, "DataSource", false, "specifier"}, {"remote", 2, tMsg, "RemoteDataSource", false, "specifier"}}},
	{"DataSource", []fd{
		{"filename", 1, tString, "", false, "specifier"}, {"inline_bytes", 2, tBytes, "", false, "specifier"},
		{"inline_string", 3, tString, "", false, "specifier"}, {"environment_variable", 4, tString, "", false, "specifier"},
		{"watched_directory", 5, tMsg, "WatchedDirectory", false, ""},
	}},
	{"WatchedDirectory", []fd{{"path", 1, tString, "", false, ""}, {"watch_modify", 2, tBool, "", false, ""}}},
	{"RemoteDataSource", []fd{{"http_uri", 1, tMsg, "HttpUri", false, ""}, {"sha256", 2, tString, "", false, ""}, {"retry_policy", 3, tMsg, "RetryPolicy", false, ""}}},
	{"HttpUri", []fd{{"uri", 1, tString, "", false, ""}, {"cluster", 2, tString, "", false, "http_upstream_type"}, {"timeout", 3, tWKT, "Duration", false, ""}}},
	{"RetryPolicy", []fd{
		{"retry_back_off", 1, tMsg, "BackoffStrategy", false, ""}, {"num_retries", 2, tWKT, "UInt32Value", false, ""},
		{"retry_on", 3, tString, "", false, ""}, {"retry_priority", 4, tMsg, "RetryPriority", false, ""},
		{"retry_host_predicate", 5, tMsg, "RetryHostPredicate", true, ""}, {"host_selection_retry_max_attempts", 6, tInt64, "", false, ""},
	}},
	{"RetryPriority", []fd{{"name", 1, tString, "", false, ""}, {"typed_config", 2, tWKT, "Any", false, "config_type"}}},
	{"RetryHostPredicate", []fd{{"name", 1, tString, "", false, ""}, {"typed_config", 2, tWKT, "Any", false, "config_type"}}},
}

// failurePolicies is envoy.extensions.wasm.v3.FailurePolicy, by number.
var failurePolicies = []string{"UNSPECIFIED", "FAIL_RELOAD", "FAIL_CLOSED", "FAIL_OPEN"}

// schema is each message's fields, by message name and field number.
var schema = func() map[string]map[protowire.Number]fd {
	out := map[string]map[protowire.Number]fd{}
	for _, m := range schemaMessages {
		out[m.name] = map[protowire.Number]fd{}
		for _, f := range m.fields {
			out[m.name][f.num] = f
		}
	}
	return out
}()

// wireType is the wire type of f's values.
func (f fd) wireType() protowire.Type {
	switch f.kind {
	case tBool, tInt64, tEnum:
		return protowire.VarintType
	}
	return protowire.BytesType
}

// check decodes b as the schema's message name, as Envoy's generated type would:
// an error is what proto.Unmarshal into that type fails on (malformed wire
// data, a string that is not UTF-8). A field of an unknown number or of another
// wire type is unknown to protobuf too, and skipped.
func check(b []byte, name string) error {
	fields := schema[name]
	return xdswire.Fields(b, func(f xdswire.Field) error {
		d, ok := fields[f.Num]
		if !ok || f.Type != d.wireType() {
			return nil
		}
		var err error
		switch d.kind {
		case tString:
			err = checkUTF8(f.Bytes)
		case tMsg:
			err = check(f.Bytes, d.ref)
		case tWKT:
			err = checkWKT(f.Bytes, d.ref)
		case tMap:
			err = checkEntry(f.Bytes, d.ref)
		}
		if err != nil {
			return fmt.Errorf("%s.%s: %w", name, d.name, err)
		}
		return nil
	})
}

// checkEntry checks a map entry: a string key, a string value or message ref.
func checkEntry(b []byte, ref string) error {
	return xdswire.Fields(b, func(f xdswire.Field) error {
		switch {
		case f.Type != protowire.BytesType:
			return nil
		case f.Num == 1 || (f.Num == 2 && ref == ""):
			return checkUTF8(f.Bytes)
		case f.Num == 2:
			return check(f.Bytes, ref)
		}
		return nil
	})
}

// checkWKT checks the well-known type name: of those the schema holds, Any has
// a string (its type URL); the others are varints, well formed or not at all.
func checkWKT(b []byte, name string) error {
	return xdswire.Fields(b, func(f xdswire.Field) error {
		if name == "Any" && f.Is(1, protowire.BytesType) {
			return checkUTF8(f.Bytes)
		}
		return nil
	})
}

func checkUTF8(b []byte) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("string field contains invalid UTF-8")
	}
	return nil
}
