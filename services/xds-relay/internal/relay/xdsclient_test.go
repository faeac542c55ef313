package relay_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// grpcSnapshot is the smallest configuration grpc-go's xDS client resolves: an
// API listener named as the target, an inline route to an EDS cluster, its endpoints.
func grpcSnapshot(t *testing.T, target, backend string) map[resource.Type][]types.Resource {
	t.Helper()
	router, _ := anypb.New(&routerv3.Router{})
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "route",
			VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "backend"}}},
			}}}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	host, portS, _ := net.SplitHostPort(backend)
	port, _ := strconv.Atoi(portS)
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "backend", Endpoints: []*endpointv3.LocalityLbEndpoints{{
		Locality:            &corev3.Locality{Zone: "z"},
		LoadBalancingWeight: wrapperspb.UInt32(1),
		LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}}}}}},
	}}}
	c := cluster("backend")
	c.ConnectTimeout = durationpb.New(time.Second)
	return map[resource.Type][]types.Resource{
		resource.ListenerType: {&listenerv3.Listener{Name: target, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}}},
		resource.ClusterType:  {c},
		resource.EndpointType: {cla},
	}
}

func TestGRPCXDSClientResolvesThroughRelay(t *testing.T) {
	// A real gRPC backend.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("demo", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(backend, hs)
	go func() { _ = backend.Serve(ln) }()
	t.Cleanup(backend.Stop)

	up := startUpstream(t)
	up.setSnapshot("grpc-client", "1", grpcSnapshot(t, "demo-svc", ln.Addr().String()))
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)

	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": "unix://%s", "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": "grpc-client", "cluster": "test"}
	}`, env.socket)
	rb, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///demo-svc", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "demo"}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("rpc through xds:///demo-svc: %v", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("status = %v", resp.GetStatus())
	}
	// The configuration came through the relay.
	testkit.Eventually(t, "grpc client connected via relay", func() bool {
		return len(bustest.Find(env.rec, func(e events.XDSConnected) bool { return e.Node == "grpc-client" })) >= 1
	})
	for _, typ := range []string{resource.ListenerType, resource.ClusterType, resource.EndpointType} {
		if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_responses_total", map[string]string{"type": typ}); v < 1 {
			t.Errorf("no %s response relayed", typ)
		}
	}
}
