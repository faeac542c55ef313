package wasm

import (
	"context"
	"fmt"
	"strings"
	"time"

	udpa "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// reference is the rewrite as it was written first, on go-control-plane's
// generated Envoy types (as Istio's agent writes it, pkg/wasm/convert.go): the
// oracle of the differential tests and the fuzz target. The relay's rewrite on
// the wire must accept, reject and produce what this does.
type reference struct{ modules Modules }

// filter is a Wasm filter's config, HTTP or network: the one field both hold.
type refFilter interface {
	proto.Message
	GetConfig() *wasmv3.PluginConfig
}

// convert returns the rewritten resource, nil when res is not a remote Wasm load.
func (r *reference) convert(ctx context.Context, res *anypb.Any) (*anypb.Any, error) {
	ec := &corev3.TypedExtensionConfig{}
	if err := res.UnmarshalTo(ec); err != nil {
		return nil, fmt.Errorf("failed to unmarshal extension config resource: %w", err)
	}
	f, network, err := refWasmFilter(ec)
	if f == nil || err != nil {
		return nil, err
	}
	code := f.GetConfig().GetVmConfig().GetCode()
	if code.GetRemote() == nil {
		if code.GetLocal() == nil {
			return nil, fmt.Errorf("no remote and local load found in Wasm filter %s", ec.GetName())
		}
		return nil, nil // a local module: Envoy loads it itself
	}
	if err := r.localize(ctx, ec.GetName(), f.GetConfig()); err != nil {
		allow := refFailOpen(f.GetConfig())
		return fallback(ec.GetName(), network, allow) // the hand-encoded one: TestFallbackMatchesEnvoysTypes checks it
	}
	tc, err := anypb.New(f)
	if err != nil {
		return nil, fmt.Errorf("failed to marshal new wasm filter: %w", err)
	}
	ec.TypedConfig = tc
	return anypb.New(ec)
}

// wasmFilter decodes ec's Wasm filter, given directly or in a udpa TypedStruct;
// nil when ec is not a Wasm filter.
func refWasmFilter(ec *corev3.TypedExtensionConfig) (refFilter, bool, error) {
	tc := ec.GetTypedConfig()
	if tc == nil {
		return nil, false, fmt.Errorf("typed extension config %s does not contain any typed config", ec.GetName())
	}
	var f refFilter
	var network bool
	switch tc.GetTypeUrl() {
	case httpWasmType:
		f = &httpwasm.Wasm{}
	case networkWasmType:
		f, network = &netwasm.Wasm{}, true
	case typedStructType:
		ts := &udpa.TypedStruct{}
		if err := tc.UnmarshalTo(ts); err != nil {
			return nil, false, fmt.Errorf("failed to unmarshal typed config for wasm filter: %w", err)
		}
		switch ts.GetTypeUrl() {
		case httpWasmType:
			f = &httpwasm.Wasm{}
		case networkWasmType:
			f, network = &netwasm.Wasm{}, true
		default:
			return nil, false, nil
		}
		js, err := protojson.Marshal(ts.GetValue())
		if err == nil {
			err = protojson.Unmarshal(js, f)
		}
		if err != nil {
			return nil, false, fmt.Errorf("failed to convert extension config struct %s to a Wasm filter: %w", ec.GetName(), err)
		}
		return f, network, nil
	default:
		return nil, false, nil
	}
	if err := tc.UnmarshalTo(f); err != nil {
		return nil, false, fmt.Errorf("failed to unmarshal extension config resource into Wasm filter: %w", err)
	}
	return f, network, nil
}

// localize fetches the module of pc's VM and points the VM at the local file,
// stripping istiod's ISTIO_META_* variables meant for the agent alone.
func (r *reference) localize(ctx context.Context, resource string, pc *wasmv3.PluginConfig) error {
	vm := pc.GetVmConfig()
	o := GetOptions{ResourceName: resource, Timeout: 5 * time.Second}
	if envs := vm.GetEnvironmentVariables(); envs != nil {
		if sec, ok := envs.KeyValues[envPullSecret]; ok && sec == "" {
			return fmt.Errorf("cannot fetch Wasm module %v: missing image pulling secret", pc.GetName())
		}
		o.PullPolicy = pullPolicy(envs.KeyValues[envPullPolicy])
		o.ResourceVersion = envs.KeyValues[envResourceVersion]
		for k := range envs.KeyValues {
			if strings.HasPrefix(k, istioMetaPrefix) {
				delete(envs.KeyValues, k)
			}
		}
		if len(envs.KeyValues) == 0 {
			if len(envs.HostEnvKeys) == 0 {
				vm.EnvironmentVariables = nil
			} else {
				envs.KeyValues = nil
			}
		}
	}
	remote := vm.GetCode().GetRemote()
	uri := remote.GetHttpUri()
	if uri == nil {
		return fmt.Errorf("wasm remote fetch does not have httpUri specified for config %s", pc.GetName())
	}
	o.Checksum = remote.GetSha256()
	if o.Checksum == "nil" { // istiod's "no checksum"
		o.Checksum = ""
	}
	if uri.GetTimeout() != nil {
		o.Timeout = uri.GetTimeout().AsDuration()
	}
	p, err := r.modules.Get(ctx, uri.GetUri(), o)
	if err != nil {
		return fmt.Errorf("cannot fetch Wasm module %v: %w", uri.GetUri(), err)
	}
	vm.Code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{
		Local: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: p}}}}
	return nil
}

// failOpen is the plugin's failure policy, or its deprecated fail_open when unset.
func refFailOpen(pc *wasmv3.PluginConfig) bool {
	if p := pc.GetFailurePolicy(); p != wasmv3.FailurePolicy_UNSPECIFIED {
		return p == wasmv3.FailurePolicy_FAIL_OPEN
	}
	//lint:ignore SA1019 deprecated, and still read by Istio's agent when failure_policy is unset
	return pc.GetFailOpen()
}
