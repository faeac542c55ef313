package relay

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// unknown99 is an unknown field, for the envelopes to carry.
var unknown99 = protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5)

// replaceSecond runs the relay's resource replacement on b (a response), putting
// repl in place of the second resource, and decodes the result into out.
func replaceSecond(t *testing.T, sotw bool, b []byte, repl *anypb.Any, out proto.Message) {
	t.Helper()
	res, err := responseResources(sotw, b)
	if err != nil {
		t.Fatal(err)
	}
	before := append([]*anypb.Any(nil), res...)
	res[1] = repl
	nb, err := replaceResources(sotw, b, res, before)
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(nb, out); err != nil {
		t.Fatalf("rewritten response does not decode with Envoy's types: %v", err)
	}
}

// TestRewrittenResponsesMatchEnvoysTypes: a response re-encoded with one
// resource replaced is, decoded with go-control-plane's types, the response
// with that resource replaced: every other field (the ones the relay does not
// read, and unknown ones) is kept, in state-of-the-world and delta.
func TestRewrittenResponsesMatchEnvoysTypes(t *testing.T) {
	a := func(s string) *anypb.Any { x, _ := anypb.New(wrapperspb.String(s)); return x }
	repl := a("replaced")
	t.Run("sotw", func(t *testing.T) {
		in := &discoveryv3.DiscoveryResponse{VersionInfo: "7", Resources: []*anypb.Any{a("one"), a("two"), a("three")}, Canary: true,
			TypeUrl: "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig", Nonce: "n1",
			ControlPlane: &corev3.ControlPlane{Identifier: "istiod-1"},
			ResourceErrors: []*discoveryv3.ResourceError{{ResourceName: &discoveryv3.ResourceName{Name: "x"},
				ErrorDetail: &status.Status{Code: 3, Message: "bad"}}}}
		in.ProtoReflect().SetUnknown(unknown99)
		b, err := proto.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		got := &discoveryv3.DiscoveryResponse{}
		replaceSecond(t, true, b, repl, got)
		want := proto.Clone(in).(*discoveryv3.DiscoveryResponse)
		want.Resources[1] = repl
		if !proto.Equal(got, want) {
			t.Fatalf("rewritten %v\nwant %v", got, want)
		}
	})
	t.Run("delta", func(t *testing.T) {
		r := func(name string) *discoveryv3.Resource {
			x := &discoveryv3.Resource{Name: name, Version: "v-" + name, Resource: a(name), Aliases: []string{name + "-alias"},
				Ttl: durationpb.New(time.Minute), CacheControl: &discoveryv3.Resource_CacheControl{DoNotCache: true}}
			x.ProtoReflect().SetUnknown(unknown99)
			return x
		}
		in := &discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "7", Resources: []*discoveryv3.Resource{r("one"), r("two"), r("three")},
			TypeUrl: "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig", Nonce: "n1", RemovedResources: []string{"gone"},
			ControlPlane: &corev3.ControlPlane{Identifier: "istiod-1"}}
		in.ProtoReflect().SetUnknown(unknown99)
		b, err := proto.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		got := &discoveryv3.DeltaDiscoveryResponse{}
		replaceSecond(t, false, b, repl, got)
		want := proto.Clone(in).(*discoveryv3.DeltaDiscoveryResponse)
		want.Resources[1].Resource = repl
		if !proto.Equal(got, want) {
			t.Fatalf("rewritten %v\nwant %v", got, want)
		}
		// The control: had the replacement been lost, the comparison tells.
		if proto.Equal(got, in) {
			t.Fatal("the rewritten response equals the original: the check above proves nothing")
		}
	})
}

// TestResponseResourcesOfDeltaWithoutBody: a delta resource with no body is a
// nil resource for the rewriter, which rejects it (as the generated types'
// GetResource() gave it nil).
func TestResponseResourcesOfDeltaWithoutBody(t *testing.T) {
	b, err := proto.Marshal(&discoveryv3.DeltaDiscoveryResponse{Resources: []*discoveryv3.Resource{{Name: "a", Version: "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := responseResources(false, b)
	if err != nil || len(res) != 1 || res[0] != nil {
		t.Fatalf("resources %v, %v; want one nil", res, err)
	}
}
