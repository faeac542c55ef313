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
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/xdswire"
	"google.golang.org/protobuf/encoding/protowire"
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

// convert returns the rewritten resource, nil when res is not a remote Wasm load.
// It reads the config on the wire (wire.go): the fields it changes are rebuilt,
// every other field is copied byte for byte.
func (r *Rewriter) convert(ctx context.Context, res *anypb.Any) (*anypb.Any, error) {
	ec, err := decodeExtensionConfig(res)
	if err != nil {
		return nil, fmt.Errorf("failed to unmarshal extension config resource: %w", err)
	}
	f, err := wasmFilter(ec)
	if f == nil || err != nil {
		return nil, err
	}
	code := f.vm.code
	if !code.remote {
		if !code.local {
			return nil, fmt.Errorf("no remote and local load found in Wasm filter %s", ec.name)
		}
		return nil, nil // a local module: Envoy loads it itself
	}
	if err := r.localize(ctx, ec.name, f); err != nil {
		allow := f.failOpen()
		r.log.Error("wasm module not loaded; applying the plugin's failure policy", "resource", ec.name, "error", err,
			"rbac", map[bool]string{true: "allow", false: "deny"}[allow])
		return fallback(ec.name, f.network, allow)
	}
	return &anypb.Any{TypeUrl: TypeURL, Value: ec.encode(f.encode())}, nil
}

// localize fetches the module of f's VM and points the VM at the local file,
// stripping istiod's ISTIO_META_* variables meant for the agent alone.
func (r *Rewriter) localize(ctx context.Context, resource string, f *wasmConfig) error {
	vm := &f.vm
	o := GetOptions{ResourceName: resource, Timeout: 5 * time.Second}
	if envs := vm.env; envs != nil {
		if sec, ok := envs.keyValues[envPullSecret]; ok && sec == "" {
			return fmt.Errorf("cannot fetch Wasm module %v: missing image pulling secret", f.name)
		}
		o.PullPolicy = pullPolicy(envs.keyValues[envPullPolicy])
		o.ResourceVersion = envs.keyValues[envResourceVersion]
		envs.dropPrefix(istioMetaPrefix)
		if len(envs.keyValues) == 0 && !envs.hostEnvKeys {
			vm.env = nil
		}
	}
	remote := vm.code
	if !remote.hasURI {
		return fmt.Errorf("wasm remote fetch does not have httpUri specified for config %s", f.name)
	}
	o.Checksum = remote.sha256
	if o.Checksum == "nil" { // istiod's "no checksum"
		o.Checksum = ""
	}
	if remote.timeout != nil {
		o.Timeout = *remote.timeout
	}
	p, err := r.modules.Get(ctx, remote.uri, o)
	if err != nil {
		return fmt.Errorf("cannot fetch Wasm module %v: %w", remote.uri, err)
	}
	vm.localFile = p
	return nil
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
	tc := xdswire.Any{TypeURL: httpRBACType}
	prefixField := protowire.Number(6) // rules_stat_prefix
	if network {
		tc.TypeURL, prefixField = networkRBACType, 3 // stat_prefix
	}
	prefix := DenyStatPrefix
	if allow {
		prefix = AllowStatPrefix
	}
	b = protowire.AppendTag(b, prefixField, protowire.BytesType)
	tc.Value = protowire.AppendString(b, prefix)
	ec := extensionConfig{rest: xdswire.AppendString(nil, 1, name)}
	return &anypb.Any{TypeUrl: TypeURL, Value: ec.encode(tc)}, nil
}
