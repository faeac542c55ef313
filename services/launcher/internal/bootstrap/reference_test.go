package bootstrap

import (
	"fmt"
	"net"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	http2v3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// reference is the bootstrap Build must write, built with the generated types
// (the launcher's builder before it wrote JSON from maps).
func reference(p Params) (*bootstrapv3.Bootstrap, error) {
	host, portS, err := net.SplitHostPort(p.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("admin address %q: %w", p.AdminAddr, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return nil, fmt.Errorf("admin port %q: %w", portS, err)
	}
	sds, err := referenceUnix(SDSCluster, p.SDSSocket)
	if err != nil {
		return nil, err
	}
	xds, err := referenceUnix(XDSCluster, p.XDSSocket)
	if err != nil {
		return nil, err
	}
	adsSource := func() *corev3.ConfigSource {
		return &corev3.ConfigSource{
			ResourceApiVersion:    corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}
	}
	meta, err := structpb.NewStruct(p.Metadata)
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	static := &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{sds, xds}}
	if p.CredentialSocket != "" {
		cred, err := referenceUnix(CredentialCluster, p.CredentialSocket)
		if err != nil {
			return nil, err
		}
		static.Clusters = append(static.Clusters, cred)
	}
	if p.StatsAddr != "" {
		l, c, err := referenceStats(p.StatsAddr, host, uint32(port))
		if err != nil {
			return nil, err
		}
		static.Listeners = append(static.Listeners, l)
		static.Clusters = append(static.Clusters, c)
	}
	return &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: p.NodeID, Cluster: p.Cluster, Metadata: meta},
		Admin: &bootstrapv3.Admin{Address: referenceAddress(host, uint32(port))},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			AdsConfig: &corev3.ApiConfigSource{
				ApiType:             corev3.ApiConfigSource_GRPC,
				TransportApiVersion: corev3.ApiVersion_V3,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: XDSCluster}}}},
			},
			LdsConfig: adsSource(),
			CdsConfig: adsSource(),
		},
		StaticResources: static,
	}, nil
}

func referenceAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

// statsListener is Istio's 15090 listener: GET /stats/prometheus forwarded to the
// admin's /stats/prometheus, nothing else of the admin API exposed.
func referenceStats(addr, adminHost string, adminPort uint32) (*listenerv3.Listener, *clusterv3.Cluster, error) {
	host, portS, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("stats address %q: %w", addr, err)
	}
	port, err := strconv.ParseUint(portS, 10, 16)
	if err != nil {
		return nil, nil, fmt.Errorf("stats port %q: %w", portS, err)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	router, err := anypb.New(&routerv3.Router{})
	if err != nil {
		return nil, nil, err
	}
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: "stats",
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			VirtualHosts: []*routev3.VirtualHost{{
				Name: "backend", Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match: &routev3.RouteMatch{
						PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/stats/prometheus"},
						Headers: []*routev3.HeaderMatcher{{Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
							StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "GET"}}}}},
					},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: StatsCluster}}},
				}},
			}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		return nil, nil, err
	}
	l := &listenerv3.Listener{
		Name:    ListenerName(host, uint32(port)),
		Address: referenceAddress(host, uint32(port)),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}},
	}
	c := &clusterv3.Cluster{
		Name:                 StatsCluster,
		ConnectTimeout:       durationpb.New(250 * time.Millisecond),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: StatsCluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: referenceAddress(adminHost, adminPort)}}}}}}},
	}
	return l, c, nil
}

func referenceUnix(name, socket string) (*clusterv3.Cluster, error) {
	opts, err := anypb.New(&http2v3.HttpProtocolOptions{
		UpstreamProtocolOptions: &http2v3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &http2v3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &http2v3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", name, err)
	}
	return &clusterv3.Cluster{
		Name:                          name,
		ConnectTimeout:                durationpb.New(time.Second),
		ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: socket}}},
				}},
			}}}},
		},
	}, nil
}
