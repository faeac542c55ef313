package democp

import (
	"fmt"
	"net"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/nds"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Names of the demo resources.
const (
	// BackendHost is the demo backend's name in the name table: a Kubernetes
	// service demo-backend in namespace default, so a demo pod (in default)
	// resolves it by its short name through its DNS proxy.
	BackendHost      = "demo-backend.default.svc.cluster.local"
	BackendShortName = "demo-backend"
	ListenerName     = "demo-http"
	RouteName        = "demo-route"
	ClusterName      = "demo-backend"
)

func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
}

func socketAddr(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

// Snapshot builds the demo configuration: listener demo-http on 127.0.0.1:port
// routing everything (RDS demo-route) to cluster demo-backend (EDS, one endpoint
// at backend). It is consistent: every reference resolves.
func Snapshot(version string, port uint32, backend string) (*cache.Snapshot, error) {
	host, ps, err := net.SplitHostPort(backend)
	if err != nil {
		return nil, fmt.Errorf("demo backend %q: %w", backend, err)
	}
	bport, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("demo backend port %q: %w", ps, err)
	}
	router, err := anypb.New(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix:     "demo",
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: RouteName, ConfigSource: ads()}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		return nil, err
	}
	listener := &listenerv3.Listener{
		Name:    ListenerName,
		Address: socketAddr("127.0.0.1", port),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}},
	}
	route := &routev3.RouteConfiguration{Name: RouteName, VirtualHosts: []*routev3.VirtualHost{{
		Name: "demo", Domains: []string{"*"}, Routes: []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterName}}},
		}}}}}
	cluster := &clusterv3.Cluster{
		Name:                 ClusterName,
		ConnectTimeout:       durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads()},
	}
	endpoints := &endpointv3.ClusterLoadAssignment{ClusterName: ClusterName, Endpoints: []*endpointv3.LocalityLbEndpoints{{
		Locality:            &corev3.Locality{Region: "demo", Zone: "demo"},
		LoadBalancingWeight: wrapperspb.UInt32(1),
		LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{
			Endpoint: &endpointv3.Endpoint{Address: socketAddr(host, uint32(bport))}}}},
	}}}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{
		resource.ListenerType: {listener},
		resource.RouteType:    {route},
		resource.ClusterType:  {cluster},
		resource.EndpointType: {endpoints},
	})
	if err != nil {
		return nil, fmt.Errorf("demo snapshot: %w", err)
	}
	if err := snap.Consistent(); err != nil {
		return nil, fmt.Errorf("demo snapshot: %w", err)
	}
	return snap, nil
}

// NameTable is the demo's name table (Istio's NDS): BackendHost at the backend's
// address, as istiod lists a Kubernetes service.
func NameTable(backend string) (nds.Table, error) {
	host, _, err := net.SplitHostPort(backend)
	if err != nil {
		return nil, fmt.Errorf("demo backend %q: %w", backend, err)
	}
	if net.ParseIP(host) == nil {
		return nil, fmt.Errorf("demo backend %q: want an IP address", backend)
	}
	return nds.Table{BackendHost: {IPs: []string{host}, Registry: "Kubernetes", Shortname: BackendShortName, Namespace: "default"}}, nil
}
