package wasm

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	httprbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The hand-encoded fallback filters are, byte for byte, the ones Istio's agent
// builds from Envoy's generated types (pkg/wasm/convert.go).
func TestFallbackMatchesEnvoysTypes(t *testing.T) {
	tests := []struct {
		name           string
		network, allow bool
		want           proto.Message
	}{
		{"http allow", false, true, &httprbac.RBAC{RulesStatPrefix: AllowStatPrefix}},
		{"http deny", false, false, &httprbac.RBAC{Rules: &rbacv3.RBAC{}, RulesStatPrefix: DenyStatPrefix}},
		{"network allow", true, true, &netrbac.RBAC{StatPrefix: AllowStatPrefix}},
		{"network deny", true, false, &netrbac.RBAC{Rules: &rbacv3.RBAC{}, StatPrefix: DenyStatPrefix}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fallback("ns.plugin", tt.network, tt.allow)
			if err != nil {
				t.Fatal(err)
			}
			tc, err := anypb.New(tt.want)
			if err != nil {
				t.Fatal(err)
			}
			want, err := anypb.New(&corev3.TypedExtensionConfig{Name: "ns.plugin", TypedConfig: tc})
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("fallback %v, want %v", got, want)
			}
			ec := &corev3.TypedExtensionConfig{}
			if err := got.UnmarshalTo(ec); err != nil {
				t.Fatal(err)
			}
			if string(ec.GetTypedConfig().GetValue()) != string(tc.GetValue()) {
				t.Fatalf("RBAC bytes %x, want %x", ec.GetTypedConfig().GetValue(), tc.GetValue())
			}
		})
	}
}
