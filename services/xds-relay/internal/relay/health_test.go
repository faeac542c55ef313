package relay_test

import (
	"context"
	"slices"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/testkit"
)

// istioHealthRequest is the request Istio's agent builds for a health event
// (pkg/istio-agent/xds_proxy.go, initXdsProxy), with Envoy's generated types.
func istioHealthRequest(healthy bool, msg string) *discoveryv3.DiscoveryRequest {
	req := &discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/istio.v1.HealthInformation"}
	if !healthy {
		req.ErrorDetail = &statuspb.Status{Code: int32(codes.Internal), Message: msg}
	}
	return req
}

// TestHealthRequestIsIstiosOnTheWire: the relay's health reports are, byte for
// byte, what Istio's agent sends for the same event (deterministic marshalling of
// the generated types), in both ADS modes.
func TestHealthRequestIsIstiosOnTheWire(t *testing.T) {
	for _, h := range []relay.Health{{Healthy: true}, {Healthy: false, Message: "status code was not from [200,400), bad code 503"}} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(istioHealthRequest(h.Healthy, h.Message))
		if err != nil {
			t.Fatal(err)
		}
		if got := relay.HealthRequest(h).AppendWire(nil); !slices.Equal(got, want) {
			t.Errorf("%+v: sotw %x, Istio's %x", h, got, want)
		}
		delta := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: relay.HealthInfoType}
		if !h.Healthy {
			delta.ErrorDetail = &statuspb.Status{Code: int32(codes.Internal), Message: h.Message}
		}
		want, err = proto.MarshalOptions{Deterministic: true}.Marshal(delta)
		if err != nil {
			t.Fatal(err)
		}
		if got := relay.DeltaHealthRequest(h).AppendWire(nil); !slices.Equal(got, want) {
			t.Errorf("%+v: delta %x, Istio's %x", h, got, want)
		}
	}
}

// healthSeen is the health reports the upstream got, in order.
func healthSeen(u *upstreamServer) []*discoveryv3.DiscoveryRequest {
	var out []*discoveryv3.DiscoveryRequest
	for _, r := range u.seen(func(r *discoveryv3.DiscoveryRequest) bool { return r.GetTypeUrl() == relay.HealthInfoType }) {
		// go-control-plane's server gives every request the stream's node
		// before recording it; the relay sent none.
		c := proto.Clone(r).(*discoveryv3.DiscoveryRequest)
		c.Node = nil
		out = append(out, c)
	}
	return out
}

// TestHealthReportsFollowEnvoysLDSRequest: a report made before Envoy connects
// waits for its stream's first LDS request (not its first request), then goes
// upstream as Istio's agent sends it; a change goes at once; a new stream (Envoy
// reconnected) gets the last report after its LDS request. Envoy sees none of it.
func TestHealthReportsFollowEnvoysLDSRequest(t *testing.T) {
	u := startUpstream(t)
	env := startRelay(t, upstream.Config{Address: u.addr}, nil)
	env.srv.ReportHealth(relay.Health{Healthy: false, Message: "app down"})

	ctx, cancel := context.WithCancel(context.Background())
	st := openCDS(t, ctx, env.socket, "sidecar~10.0.0.1~web-0.default~default.svc.cluster.local")
	// A later request of another type: requests go upstream in order, so once it
	// is there, a report queued with the first request would be there too.
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: unknownType}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the second request upstream", func() bool {
		return len(u.seen(func(r *discoveryv3.DiscoveryRequest) bool { return r.GetTypeUrl() == unknownType })) == 1
	})
	if got := healthSeen(u); len(got) != 0 {
		t.Fatalf("health went upstream before Envoy's LDS request: %v", got)
	}

	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the unhealthy report upstream", func() bool { return len(healthSeen(u)) == 1 })
	if got := healthSeen(u)[0]; !proto.Equal(got, istioHealthRequest(false, "app down")) {
		t.Fatalf("report %v, want Istio's %v", got, istioHealthRequest(false, "app down"))
	}
	// The report came right after the LDS request.
	all := u.seen(func(*discoveryv3.DiscoveryRequest) bool { return true })
	i := slices.IndexFunc(all, func(r *discoveryv3.DiscoveryRequest) bool { return r.GetTypeUrl() == relay.HealthInfoType })
	if i < 1 || all[i-1].GetTypeUrl() != resource.ListenerType {
		t.Fatalf("the report did not follow the LDS request: %v", all)
	}

	env.srv.ReportHealth(relay.Health{Healthy: true})
	testkit.Eventually(t, "the healthy report upstream", func() bool { return len(healthSeen(u)) == 2 })
	if got := healthSeen(u)[1]; !proto.Equal(got, istioHealthRequest(true, "")) {
		t.Fatalf("report %v, want Istio's %v", got, istioHealthRequest(true, ""))
	}
	// An LDS ACK is not a first LDS request: no report again.
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ListenerType, ResponseNonce: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: unknownType, ResponseNonce: "n2"}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the later requests upstream", func() bool {
		return len(u.seen(func(r *discoveryv3.DiscoveryRequest) bool { return r.GetResponseNonce() == "n2" })) == 1
	})
	if n := len(healthSeen(u)); n != 2 {
		t.Fatalf("%d reports after an LDS ACK, want 2", n)
	}
	cancel()

	// Envoy reconnects: its new upstream stream gets the last report after LDS.
	st2 := openCDS(t, context.Background(), env.socket, "sidecar~10.0.0.1~web-0.default~default.svc.cluster.local")
	if err := st2.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the last report again on the new stream", func() bool { return len(healthSeen(u)) == 3 })
	if got := healthSeen(u)[2]; !proto.Equal(got, istioHealthRequest(true, "")) {
		t.Fatalf("report %v, want the last (healthy)", got)
	}
}

// TestDeltaStreamGetsDeltaHealthReports: on an incremental stream the report is
// a DeltaDiscoveryRequest of the same form, after Envoy's LDS subscription.
func TestDeltaStreamGetsDeltaHealthReports(t *testing.T) {
	u := startUpstream(t)
	env := startRelay(t, upstream.Config{Address: u.addr}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := openDeltaCDS(t, ctx, env.socket, "sidecar~10.0.0.1~web-0.default~default.svc.cluster.local")
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	deltaHealth := func() []*discoveryv3.DeltaDiscoveryRequest {
		u.mu.Lock()
		defer u.mu.Unlock()
		var out []*discoveryv3.DeltaDiscoveryRequest
		for _, r := range u.deltas {
			if r.GetTypeUrl() == relay.HealthInfoType {
				out = append(out, r)
			}
		}
		return out
	}
	testkit.Eventually(t, "the LDS subscription upstream", func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		return slices.ContainsFunc(u.deltas, func(r *discoveryv3.DeltaDiscoveryRequest) bool { return r.GetTypeUrl() == resource.ListenerType })
	})
	env.srv.ReportHealth(relay.Health{Healthy: false, Message: "exit status 1"})
	testkit.Eventually(t, "the delta report upstream", func() bool { return len(deltaHealth()) == 1 })
	want := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: relay.HealthInfoType,
		ErrorDetail: &statuspb.Status{Code: int32(codes.Internal), Message: "exit status 1"}}
	if got := deltaHealth()[0]; !proto.Equal(got, want) {
		t.Fatalf("delta report %v, want %v", got, want)
	}
}
