package wasm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	udpa "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// modules is the differential tests' module source: the file a URL would be
// cached in, or an error for a URL with "unreachable" in it; it records what it
// was asked. (The cache itself is tested against real HTTP in cache_test.go;
// these tests are about the config.)
type modules struct {
	mu  sync.Mutex
	got []string
}

func (m *modules) Get(_ context.Context, url string, o GetOptions) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.got = append(m.got, fmt.Sprintf("%s %+v", url, o))
	if strings.Contains(url, "unreachable") {
		return "", errors.New("connection refused")
	}
	return "/var/lib/meshagent/wasm/" + fmt.Sprintf("%x", len(url)) + ".wasm", nil
}

// result is one rewrite's outcome.
type result struct {
	out     *anypb.Any
	err     error
	fetches []string
}

// rewriteBoth runs the relay's rewrite and the reference on res.
func rewriteBoth(res *anypb.Any) (got, want result) {
	gm, wm := &modules{}, &modules{}
	got.out, got.err = NewRewriter(gm, hclog.NewNullLogger()).convert(context.Background(), res)
	want.out, want.err = (&reference{modules: wm}).convert(context.Background(), res)
	got.fetches, want.fetches = gm.got, wm.got
	return got, want
}

// sameResult says how got differs from want, decoding both outputs with
// Envoy's generated types; "" when they are the same.
func sameResult(got, want result) string {
	if (got.err != nil) != (want.err != nil) {
		return fmt.Sprintf("error %v, the reference's %v", got.err, want.err)
	}
	if fmt.Sprint(got.fetches) != fmt.Sprint(want.fetches) {
		return fmt.Sprintf("fetched %v, the reference %v", got.fetches, want.fetches)
	}
	if (got.out == nil) != (want.out == nil) {
		return fmt.Sprintf("output %v, the reference's %v", got.out, want.out)
	}
	if got.out == nil {
		return ""
	}
	g, err := decodeOutput(got.out)
	if err != nil {
		return fmt.Sprintf("output does not decode with Envoy's types: %v", err)
	}
	w, err := decodeOutput(want.out)
	if err != nil {
		return fmt.Sprintf("the reference's output does not decode: %v", err)
	}
	if got.out.GetTypeUrl() != want.out.GetTypeUrl() || len(g) != len(w) {
		return fmt.Sprintf("output %v, the reference's %v", got.out, want.out)
	}
	for i := range g {
		if !proto.Equal(g[i], w[i]) {
			return fmt.Sprintf("output %v, the reference's %v", g[i], w[i])
		}
	}
	return ""
}

// decodeOutput decodes a rewritten resource with the generated types: the
// extension config without its typed config, and the typed config (the Wasm or
// RBAC filter, unknown fields included).
func decodeOutput(a *anypb.Any) ([]proto.Message, error) {
	ec := &corev3.TypedExtensionConfig{}
	if err := a.UnmarshalTo(ec); err != nil {
		return nil, err
	}
	tc, err := ec.GetTypedConfig().UnmarshalNew()
	if err != nil {
		return nil, err
	}
	ec.TypedConfig = &anypb.Any{TypeUrl: ec.GetTypedConfig().GetTypeUrl()}
	return []proto.Message{ec, tc}, nil
}

// remoteWasm is istiod's Wasm filter for a WasmPlugin with an http URL.
func remoteWasm(url string, envs map[string]string) *wasmv3.PluginConfig {
	cfg, _ := anypb.New(wrapperspb.String(`{"root":"r"}`))
	return &wasmv3.PluginConfig{Name: "ns.plugin", RootId: "r", Configuration: cfg, FailurePolicy: wasmv3.FailurePolicy_FAIL_CLOSED,
		Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{Runtime: "envoy.wasm.runtime.v8",
			Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
				HttpUri: &corev3.HttpUri{Uri: url, Timeout: durationpb.New(30 * time.Second),
					HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: "_"}},
				Sha256: "0f3c"}}},
			EnvironmentVariables: &wasmv3.EnvironmentVariables{KeyValues: envs}}}}
}

// resource wraps filter f as the ECDS resource named ns.plugin.
func resource(t testing.TB, f proto.Message) *anypb.Any {
	t.Helper()
	tc, err := anypb.New(f)
	if err != nil {
		t.Fatal(err)
	}
	res, err := anypb.New(&corev3.TypedExtensionConfig{Name: "ns.plugin", TypedConfig: tc})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// withUnknown is m with an unknown varint field 99 (and, when wrongType, its
// field 3 as a varint: a known number in the wrong wire type, which protobuf
// keeps as unknown too).
func withUnknown[M proto.Message](m M, wrongType bool) M {
	u := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7)
	if wrongType {
		u = protowire.AppendVarint(protowire.AppendTag(u, 3, protowire.VarintType), 1)
	}
	m.ProtoReflect().SetUnknown(u)
	return m
}

// concat is a resource whose TypedExtensionConfig is the encodings of parts
// one after the other: protobuf merges them.
func concat(t testing.TB, parts ...proto.Message) *anypb.Any {
	t.Helper()
	var b []byte
	for _, p := range parts {
		pb, err := proto.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, pb...)
	}
	return &anypb.Any{TypeUrl: TypeURL, Value: b}
}

// differentialCases are extension configs built with Envoy's generated types,
// each a path through the rewrite.
func differentialCases(t testing.TB) map[string]*anypb.Any {
	istio := map[string]string{"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1", "ISTIO_META_WASM_IMAGE_PULL_POLICY": "Always", "GREETING": "hello"}
	pc := func(mod func(*wasmv3.PluginConfig)) *wasmv3.PluginConfig {
		p := remoteWasm("https://example.com/plugin.wasm", map[string]string{"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1", "GREETING": "hello"})
		mod(p)
		return p
	}
	vm := func(p *wasmv3.PluginConfig) *wasmv3.VmConfig { return p.GetVmConfig() }
	remote := func(p *wasmv3.PluginConfig) *corev3.RemoteDataSource { return vm(p).GetCode().GetRemote() }
	local := &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
		Specifier: &corev3.DataSource_Filename{Filename: "/etc/plugin.wasm"}}}}
	st, err := structpb.NewStruct(map[string]any{"config": map[string]any{"name": "ns.plugin", "fail_open": true,
		"vmConfig": map[string]any{"runtime": "envoy.wasm.runtime.v8", "environment_variables": map[string]any{"keyValues": map[string]any{"ISTIO_META_X": "1"}},
			"code": map[string]any{"remote": map[string]any{"httpUri": map[string]any{"uri": "https://example.com/ts.wasm", "timeout": "2.5s"}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	badSt, _ := structpb.NewStruct(map[string]any{"config": map[string]any{"nmae": "typo"}})
	noURI := pc(func(p *wasmv3.PluginConfig) { remote(p).HttpUri = nil })
	noURI.FailurePolicy = wasmv3.FailurePolicy_FAIL_OPEN
	cases := map[string]*anypb.Any{
		"istiod's plugin": resource(t, &httpwasm.Wasm{Config: remoteWasm("https://example.com/plugin.wasm", istio)}),
		"network filter":  resource(t, &netwasm.Wasm{Config: pc(func(*wasmv3.PluginConfig) {})}),
		"only istio env":  resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) { delete(vm(p).EnvironmentVariables.KeyValues, "GREETING") })}),
		"istio env, host env": resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) {
			delete(vm(p).EnvironmentVariables.KeyValues, "GREETING")
			vm(p).EnvironmentVariables.HostEnvKeys = []string{"HOME"}
		})}),
		"empty env":           resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) { vm(p).EnvironmentVariables = &wasmv3.EnvironmentVariables{} })}),
		"no env":              resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) { vm(p).EnvironmentVariables = nil })}),
		"no checksum":         resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) { remote(p).Sha256 = "nil" })}),
		"no timeout":          resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) { remote(p).HttpUri.Timeout = nil })}),
		"empty pull secret":   resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) { vm(p).EnvironmentVariables.KeyValues[envPullSecret] = "" })}),
		"no http uri, open":   resource(t, &httpwasm.Wasm{Config: noURI}),
		"unreachable, closed": resource(t, &httpwasm.Wasm{Config: remoteWasm("https://unreachable.example/p.wasm", istio)}),
		"unreachable, deprecated fail_open": resource(t, &netwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) {
			p.FailurePolicy, remote(p).HttpUri.Uri = wasmv3.FailurePolicy_UNSPECIFIED, "https://unreachable.example/p.wasm"
			//lint:ignore SA1019 deprecated, and still read when failure_policy is unset: the case tests that
			p.FailOpen = true
		})}),
		"local module":    resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) { vm(p).Code = local })}),
		"no code":         resource(t, &httpwasm.Wasm{Config: pc(func(p *wasmv3.PluginConfig) { vm(p).Code = nil })}),
		"no vm":           resource(t, &httpwasm.Wasm{Config: &wasmv3.PluginConfig{Name: "ns.plugin"}}),
		"not wasm":        resource(t, wrapperspb.String("a filter of another kind")),
		"no typed config": func() *anypb.Any { a, _ := anypb.New(&corev3.TypedExtensionConfig{Name: "ns.plugin"}); return a }(),
		"wrong resource type": func() *anypb.Any {
			a := resource(t, &httpwasm.Wasm{Config: pc(func(*wasmv3.PluginConfig) {})})
			a.TypeUrl = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
			return a
		}(),
		"resource type with another host": func() *anypb.Any {
			a := resource(t, &httpwasm.Wasm{Config: pc(func(*wasmv3.PluginConfig) {})})
			a.TypeUrl = "example.com/" + tecName
			return a
		}(),
		"typed struct":           resource(t, &udpa.TypedStruct{TypeUrl: httpWasmType, Value: st}),
		"typed struct, bad":      resource(t, &udpa.TypedStruct{TypeUrl: httpWasmType, Value: badSt}),
		"typed struct, none":     resource(t, &udpa.TypedStruct{TypeUrl: networkWasmType}),
		"typed struct, not wasm": resource(t, &udpa.TypedStruct{TypeUrl: "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC", Value: badSt}),
		"unknown fields everywhere": func() *anypb.Any {
			p := pc(func(p *wasmv3.PluginConfig) {
				withUnknown(vm(p), true)
				withUnknown(vm(p).EnvironmentVariables, false)
				withUnknown(remote(p), false)
			})
			tc, _ := anypb.New(withUnknown(&httpwasm.Wasm{Config: withUnknown(p, true)}, true))
			a, _ := anypb.New(withUnknown(&corev3.TypedExtensionConfig{Name: "ns.plugin", TypedConfig: tc}, false))
			return a
		}(),
		"bad utf-8 deep down": func() *anypb.Any { // the runtime's name, its last byte made invalid (Go will not encode it)
			a := resource(t, &httpwasm.Wasm{Config: pc(func(*wasmv3.PluginConfig) {})})
			a.Value = bytes.Replace(a.Value, []byte("envoy.wasm.runtime.v8"), []byte("envoy.wasm.runtime.v\xff"), 1)
			return a
		}(),
	}
	// Occurrences that protobuf merges: the code given in two halves, and a
	// oneof set to local, then to remote (remote wins), and the other way.
	half := func(c *corev3.AsyncDataSource) *corev3.TypedExtensionConfig {
		tc, _ := anypb.New(&httpwasm.Wasm{Config: &wasmv3.PluginConfig{Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{Code: c}}}})
		return &corev3.TypedExtensionConfig{TypedConfig: tc}
	}
	rem := func(r *corev3.RemoteDataSource) *corev3.AsyncDataSource {
		return &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: r}}
	}
	cases["code in two occurrences"] = concat(t, half(rem(&corev3.RemoteDataSource{HttpUri: &corev3.HttpUri{Uri: "https://example.com/a.wasm"}})),
		half(rem(&corev3.RemoteDataSource{Sha256: "beef"})))
	cases["local then remote"] = concat(t, half(local), half(rem(&corev3.RemoteDataSource{HttpUri: &corev3.HttpUri{Uri: "https://example.com/b.wasm"}})))
	cases["remote then local"] = concat(t, half(rem(&corev3.RemoteDataSource{HttpUri: &corev3.HttpUri{Uri: "https://example.com/b.wasm"}})), half(local))
	cases["remote, local, remote"] = concat(t, half(rem(&corev3.RemoteDataSource{Sha256: "dropped"})), half(local),
		half(rem(&corev3.RemoteDataSource{HttpUri: &corev3.HttpUri{Uri: "https://example.com/c.wasm"}})))
	return cases
}

// TestRewriteMatchesTheReference: for every path through the rewrite, the
// relay's rewrite on the wire rejects what the rewrite on Envoy's generated
// types rejects, fetches what it fetches, and gives what it gives, compared
// decoded with the generated types (unknown fields included).
func TestRewriteMatchesTheReference(t *testing.T) {
	for name, res := range differentialCases(t) {
		t.Run(name, func(t *testing.T) {
			got, want := rewriteBoth(res)
			if d := sameResult(got, want); d != "" {
				t.Fatal(d)
			}
			t.Logf("error %v, changed %t, fetched %v", got.err, got.out != nil, got.fetches)
		})
	}
}

// TestRewriteOfIstiodsPlugin spells out the main case: the module becomes the
// cached file, the agent's ISTIO_META_* variables go, the rest stays.
func TestRewriteOfIstiodsPlugin(t *testing.T) {
	envs := map[string]string{"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1", "GREETING": "hello"}
	in := withUnknown(remoteWasm("https://example.com/plugin.wasm", envs), true)
	got, want := rewriteBoth(resource(t, &httpwasm.Wasm{Config: in}))
	if d := sameResult(got, want); d != "" {
		t.Fatal(d)
	}
	if got.err != nil || got.out == nil {
		t.Fatalf("rewrite: %v, %v", got.out, got.err)
	}
	exp := proto.Clone(in).(*wasmv3.PluginConfig)
	exp.GetVmConfig().Code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
		Specifier: &corev3.DataSource_Filename{Filename: "/var/lib/meshagent/wasm/1f.wasm"}}}}
	exp.GetVmConfig().EnvironmentVariables.KeyValues = map[string]string{"GREETING": "hello"}
	dec, err := decodeOutput(got.out)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(dec[1], &httpwasm.Wasm{Config: exp}) {
		t.Fatalf("rewritten %v\nwant %v", dec[1], exp)
	}
	if len(exp.ProtoReflect().GetUnknown()) == 0 {
		t.Fatal("the unknown fields were not in the input: the check above proves nothing about them")
	}
	if want := `https://example.com/plugin.wasm {Checksum:0f3c ResourceName:ns.plugin ResourceVersion:1 PullPolicy:0 Timeout:30s}`; fmt.Sprint(got.fetches) != "["+want+"]" {
		t.Fatalf("fetched %v, want %s", got.fetches, want)
	}
}

// TestSameResultCatchesADifference is the positive control of the comparison:
// an output that lost an unknown field, or a variable, is told apart.
func TestSameResultCatchesADifference(t *testing.T) {
	cases := differentialCases(t)
	_, want := rewriteBoth(cases["unknown fields everywhere"])
	_, other := rewriteBoth(cases["istiod's plugin"])
	if d := sameResult(other, want); d == "" {
		t.Fatal("an output without the unknown fields compared the same")
	}
	if d := sameResult(result{err: errors.New("x")}, want); d == "" {
		t.Fatal("an error compared the same as an output")
	}
}

// FuzzWasmRewrite: on any extension config, the rewrite does not panic, an
// output it gives decodes with Envoy's generated types, and it does what the
// reference on the generated types does.
func FuzzWasmRewrite(f *testing.F) {
	for _, res := range differentialCases(f) {
		f.Add(res.GetTypeUrl() == TypeURL, res.GetValue())
	}
	for _, c := range typedStructCases {
		f.Add(true, typedStructResource(f, c.json).GetValue())
	}
	js, _ := protojson.Marshal(remoteWasm("https://example.com/p.wasm", map[string]string{"A": "b"}))
	f.Add(true, js) // not protobuf at all
	f.Fuzz(func(t *testing.T, canonical bool, b []byte) {
		res := &anypb.Any{TypeUrl: TypeURL, Value: b}
		if !canonical {
			res.TypeUrl = "example.com/" + tecName
		}
		got, want := rewriteBoth(res)
		if got.out != nil {
			if _, err := decodeOutput(got.out); err != nil {
				t.Fatalf("output does not decode with Envoy's types: %v", err)
			}
		}
		if d := sameResult(got, want); d != "" {
			t.Fatal(d)
		}
	})
}

// typedStructCase is a TypedStruct Wasm filter given as JSON, and whether the
// conversion accepts it.
type typedStructCase struct {
	name, json string
	ok         bool
}

// typedStructCases go through protojson's rules one by one: names, nulls,
// oneofs, scalar forms, well-known types, maps and lists.
var typedStructCases = []typedStructCase{
	{"every field", `{"config": {"name": "p", "root_id": "", "failurePolicy": "FAIL_OPEN", "fail_open": false,
		"configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": "cfg"},
		"capability_restriction_config": {"allowed_capabilities": {"proxy_log": {}}}, "reloadConfig": {"backoff": {}},
		"allow_on_headers_stop_iteration": true,
		"vmConfig": {"vmId": "v", "runtime": "envoy.wasm.runtime.v8", "allow_precompiled": true, "nackOnCodeCacheMiss": false,
			"configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": "vm"},
			"environmentVariables": {"host_env_keys": ["A", ""], "keyValues": {"ISTIO_META_X": "1", "K": ""}},
			"capabilityRestrictionConfig": {"allowedCapabilities": {}},
			"code": {"remote": {"sha256": "ab", "httpUri": {"uri": "https://example.com/x.wasm", "cluster": "", "timeout": "1.5s"},
				"retryPolicy": {"retry_back_off": {"baseInterval": "1s", "max_interval": "2.000s"}, "numRetries": "4", "retry_on": "x",
					"retryPriority": {"name": "rp", "typedConfig": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": "p"}},
					"retry_host_predicate": [{"name": "a"}, {"name": "b"}], "hostSelectionRetryMaxAttempts": "5"}}}}}}`, true},
	{"enum by number", `{"config": {"failure_policy": 2, "vm_config": {"code": {"remote": {"http_uri": {"uri": "https://e/x"}}}}}}`, true},
	{"enum, unknown name", `{"config": {"failure_policy": "NOPE"}}`, false},
	{"enum as a numeric string", `{"config": {"failure_policy": "2"}}`, false},
	{"enum, fraction", `{"config": {"failure_policy": 2.5}}`, false},
	{"enum, negative", `{"config": {"failure_policy": -3, "vm_config": {"code": {"local": {"filename": "/x"}}}}}`, true},
	{"both names of a field", `{"config": {"vmConfig": {}, "vm_config": {}}}`, false},
	{"two members of a oneof", `{"config": {"vm_config": {"code": {"local": {"filename": ""}, "remote": {}}}}}`, false},
	{"a null member of a oneof", `{"config": {"vm_config": {"code": {"local": null, "remote": {"http_uri": {"uri": "https://e/x"}}}}}}`, true},
	{"local, empty file name", `{"config": {"vm_config": {"code": {"local": {"filename": ""}}}}}`, true},
	{"local, unpadded base64", `{"config": {"vm_config": {"code": {"local": {"inline_bytes": "aGVsbG8"}}}}}`, true},
	{"local, url base64", `{"config": {"vm_config": {"code": {"local": {"inlineBytes": "-_-_"}}}}}`, true},
	{"local, bad base64", `{"config": {"vm_config": {"code": {"local": {"inline_bytes": "!!!"}}}}}`, false},
	{"int64, fraction", `{"config": {"vm_config": {"code": {"remote": {"retry_policy": {"host_selection_retry_max_attempts": 1.5}}}}}}`, false},
	{"int64, exponent", `{"config": {"vm_config": {"code": {"remote": {"http_uri": {"uri": "u"}, "retry_policy": {"host_selection_retry_max_attempts": 1e3}}}}}}`, true},
	{"int64, too big", `{"config": {"vm_config": {"code": {"remote": {"retry_policy": {"host_selection_retry_max_attempts": 1e30}}}}}}`, false},
	{"null map value", `{"config": {"vm_config": {"environment_variables": {"key_values": {"A": null}}}}}`, false},
	{"number map value", `{"config": {"vm_config": {"environment_variables": {"key_values": {"A": 1}}}}}`, false},
	{"null list element", `{"config": {"vm_config": {"environment_variables": {"host_env_keys": [null]}}}}`, false},
	{"string for a list", `{"config": {"vm_config": {"environment_variables": {"host_env_keys": "A"}}}}`, false},
	{"null list", `{"config": {"vm_config": {"environment_variables": {"host_env_keys": null}, "code": {"local": {}}}}}`, true},
	{"@type in a plain message", `{"config": {"@type": "x"}}`, false},
	{"bad duration", `{"config": {"vm_config": {"code": {"remote": {"http_uri": {"timeout": "abc"}}}}}}`, false},
	{"duration as a number", `{"config": {"vm_config": {"code": {"remote": {"http_uri": {"timeout": 5}}}}}}`, false},
	{"null message map value", `{"config": {"capability_restriction_config": {"allowed_capabilities": {"x": null}}}}`, false},
	{"unknown field in a map value", `{"config": {"capability_restriction_config": {"allowed_capabilities": {"x": {"y": 1}}}}}`, false},
	{"uint32 wrapper, negative", `{"config": {"vm_config": {"code": {"remote": {"retry_policy": {"num_retries": -1}}}}}}`, false},
	{"bool as a string", `{"config": {"vm_config": {"allow_precompiled": "true"}}}`, false},
	{"bool wrapper as a string", `{"config": {"allow_on_headers_stop_iteration": "true"}}`, false},
	{"null config", `{"config": null}`, false},
	{"list for a message", `{"config": {"vm_config": []}}`, false},
	{"number for a string", `{"config": {"vm_config": {"code": {"remote": {"http_uri": {"cluster": 5}}}}}}`, false},
	{"unregistered Any type", `{"config": {"configuration": {"@type": "type.googleapis.com/no.such.Type"}}}`, false},
	{"list of messages, bad element", `{"config": {"vm_config": {"code": {"remote": {"retry_policy": {"retry_host_predicate": [{"name": 1}]}}}}}}`, false},
}

// TestTypedStructMatchesProtojson: a Wasm filter in a TypedStruct converts as
// protojson converts it into Envoy's generated type (the reference), rejected
// or accepted alike and, when accepted, to the same filter.
func TestTypedStructMatchesProtojson(t *testing.T) {
	for _, c := range typedStructCases {
		t.Run(c.name, func(t *testing.T) {
			res := typedStructResource(t, c.json)
			got, want := rewriteBoth(res)
			if d := sameResult(got, want); d != "" {
				t.Fatal(d)
			}
			if (got.err == nil) != c.ok {
				t.Fatalf("error %v, want ok=%t: the case does not test what it says", got.err, c.ok)
			}
		})
	}
}

// typedStructResource is the ECDS resource of a TypedStruct HTTP Wasm filter
// whose JSON form is js.
func typedStructResource(t testing.TB, js string) *anypb.Any {
	t.Helper()
	st := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(js), st); err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return resource(t, &udpa.TypedStruct{TypeUrl: httpWasmType, Value: st})
}
