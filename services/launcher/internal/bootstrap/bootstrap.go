// Package bootstrap writes Envoy's bootstrap: an SDS cluster on sds-edge's socket and
// an ADS cluster on xds-relay's socket, both HTTP/2 over unix sockets, as Istio's
// agent writes envoy-rev.json.
package bootstrap

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	http2v3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Cluster names Envoy's bootstrap uses, as Istio names them.
const (
	SDSCluster = "sds-grpc"
	XDSCluster = "xds-grpc"
)

// Params says what goes into the bootstrap.
type Params struct {
	NodeID    string
	Cluster   string
	SDSSocket string
	XDSSocket string
	AdminAddr string // host:port
}

// Build returns the bootstrap.
func Build(p Params) (*bootstrapv3.Bootstrap, error) {
	host, portS, err := net.SplitHostPort(p.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("admin address %q: %w", p.AdminAddr, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return nil, fmt.Errorf("admin port %q: %w", portS, err)
	}
	sds, err := unixCluster(SDSCluster, p.SDSSocket)
	if err != nil {
		return nil, err
	}
	xds, err := unixCluster(XDSCluster, p.XDSSocket)
	if err != nil {
		return nil, err
	}
	adsSource := func() *corev3.ConfigSource {
		return &corev3.ConfigSource{
			ResourceApiVersion:    corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}
	}
	return &bootstrapv3.Bootstrap{
		Node: &corev3.Node{Id: p.NodeID, Cluster: p.Cluster},
		Admin: &bootstrapv3.Admin{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
		}}}},
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
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{sds, xds}},
	}, nil
}

func unixCluster(name, socket string) (*clusterv3.Cluster, error) {
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

// Write validates b and writes it as JSON to path atomically (temp file + rename).
func Write(path string, b *bootstrapv3.Bootstrap) error {
	if err := b.ValidateAll(); err != nil {
		return fmt.Errorf("bootstrap invalid: %w", err)
	}
	data, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(b)
	if err != nil {
		return fmt.Errorf("encode bootstrap: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write bootstrap: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write bootstrap: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write bootstrap: %w", err)
	}
	return nil
}
