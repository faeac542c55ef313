// Package wasm is the relay's Wasm remote load, as Istio's agent does it
// (pkg/wasm, ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION): an ECDS response
// whose extension config is a Wasm filter loading its module from an http(s)
// URL is rewritten, before Envoy sees it, to load the module from a local file
// the relay downloaded, checked against the config's sha256 and cached. A
// module that cannot be had (unreachable, wrong checksum, not Wasm) turns the
// filter into an RBAC filter that allows everything when the plugin fails open
// and denies everything otherwise; a config that cannot be read is NACKed.
package wasm

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
)

// Type URLs the rewrite reads.
const (
	TypeURL            = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
	httpWasmType       = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
	networkWasmType    = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm"
	typedStructType    = "type.googleapis.com/udpa.type.v1.TypedStruct"
	envPullSecret      = "ISTIO_META_WASM_IMAGE_PULL_SECRET"
	envPullPolicy      = "ISTIO_META_WASM_IMAGE_PULL_POLICY"
	envResourceVersion = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"
	istioMetaPrefix    = "ISTIO_META_"
)

// Stat prefixes of the fallback RBAC filters, Istio's.
const (
	AllowStatPrefix = "wasm-default-allow"
	DenyStatPrefix  = "wasm-default-deny"
)

// Modules is where the rewrite gets modules (*Cache implements it).
type Modules interface {
	Get(ctx context.Context, url string, o GetOptions) (string, error)
}

// Rewriter is the relay.Rewriter for ECDS.
type Rewriter struct {
	modules Modules
	log     hclog.Logger
}

var _ Modules = (*Cache)(nil)

// NewRewriter returns the ECDS rewriter over modules.
func NewRewriter(modules Modules, log hclog.Logger) *Rewriter {
	return &Rewriter{modules: modules, log: log}
}

// TypeURL implements relay.Rewriter.
func (*Rewriter) TypeURL() string { return TypeURL }

// Rewrite replaces, in place, every resource that loads a remote Wasm module
// with one that loads the cached file, or with the fail-open/closed RBAC filter
// when the module cannot be had. Other resources are left as they are. An error
// (a resource that cannot be read) rejects the whole response: nothing is
// replaced, and the caller NACKs it.
func (r *Rewriter) Rewrite(ctx context.Context, resources []*anypb.Any) error {
	out := make([]*anypb.Any, len(resources))
	var errs []error
	for i, res := range resources {
		n, err := r.convert(ctx, res)
		if err != nil {
			errs = append(errs, fmt.Errorf("resource %d: %w", i, err))
			continue
		}
		out[i] = n
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, n := range out {
		if n != nil {
			resources[i] = n
		}
	}
	return nil
}

// filter is a Wasm filter's config, HTTP or network: the one field both hold.
type filter interface {
	proto.Message
	GetConfig() *wasmv3.PluginConfig
}

// convert returns the rewritten resource, nil when res is not a remote Wasm load.
func (r *Rewriter) convert(ctx context.Context, res *anypb.Any) (*anypb.Any, error) {
	ec := &corev3.TypedExtensionConfig{}
	if err := res.UnmarshalTo(ec); err != nil {
		return nil, fmt.Errorf("failed to unmarshal extension config resource: %w", err)
	}
	f, network, err := wasmFilter(ec)
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
		allow := failOpen(f.GetConfig())
		r.log.Error("wasm module not loaded; applying the plugin's failure policy", "resource", ec.GetName(), "error", err,
			"rbac", map[bool]string{true: "allow", false: "deny"}[allow])
		return fallback(ec.GetName(), network, allow)
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
func wasmFilter(ec *corev3.TypedExtensionConfig) (filter, bool, error) {
	tc := ec.GetTypedConfig()
	if tc == nil {
		return nil, false, fmt.Errorf("typed extension config %s does not contain any typed config", ec.GetName())
	}
	var f filter
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
func (r *Rewriter) localize(ctx context.Context, resource string, pc *wasmv3.PluginConfig) error {
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
func failOpen(pc *wasmv3.PluginConfig) bool {
	if p := pc.GetFailurePolicy(); p != wasmv3.FailurePolicy_UNSPECIFIED {
		return p == wasmv3.FailurePolicy_FAIL_OPEN
	}
	//lint:ignore SA1019 deprecated, and still read by Istio's agent when failure_policy is unset
	return pc.GetFailOpen()
}

// Type URLs of the fallback filters.
const (
	httpRBACType    = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
	networkRBACType = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC"
)

// fallback is Istio's stand-in for a filter whose module could not be had: RBAC
// with no rules (allow all) when it fails open, with empty rules (deny all) else.
// The two RBAC messages are encoded here, field by field, rather than linked:
// Envoy's generated RBAC types bring its route packages, 3.7 MB more binary
// (docs/services.md);
// TestFallbackMatchesEnvoysTypes checks the bytes against the generated types.
func fallback(name string, network, allow bool) (*anypb.Any, error) {
	var b []byte
	if !allow {
		b = protowire.AppendTag(b, 1, protowire.BytesType) // rules: present and empty
		b = protowire.AppendVarint(b, 0)
	}
	tc := &anypb.Any{TypeUrl: httpRBACType}
	prefixField := protowire.Number(6) // rules_stat_prefix
	if network {
		tc.TypeUrl, prefixField = networkRBACType, 3 // stat_prefix
	}
	prefix := DenyStatPrefix
	if allow {
		prefix = AllowStatPrefix
	}
	b = protowire.AppendTag(b, prefixField, protowire.BytesType)
	tc.Value = protowire.AppendString(b, prefix)
	out, err := anypb.New(&corev3.TypedExtensionConfig{Name: name, TypedConfig: tc})
	if err != nil {
		return nil, fmt.Errorf("failed to create the fallback filter of Wasm module %s: %w", name, err)
	}
	return out, nil
}
