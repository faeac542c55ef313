// Package bootstrap writes Envoy's bootstrap as Istio's agent writes envoy-rev.json:
// the node (id and metadata), an SDS cluster on sds-edge's socket and an ADS cluster
// on xds-relay's socket (both HTTP/2 over unix sockets), the admin listener on
// loopback, and a Prometheus stats listener; or the user's own bootstrap, or a
// template rendered with the same parameters, instead.
package bootstrap

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"text/template"
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
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Cluster names Envoy's bootstrap uses, as Istio names them.
const (
	SDSCluster = "sds-grpc"
	XDSCluster = "xds-grpc"
	// CredentialCluster is a router's gateway credential SDS server, named as
	// Istio names the cluster of its credential socket.
	CredentialCluster = "sds-external"
)

// StatsCluster is the static cluster the Prometheus listener forwards to: Envoy's
// own admin, as Istio's prometheus_stats.
const StatsCluster = "prometheus_stats"

// Params says what goes into the bootstrap. A template sees them as its data.
type Params struct {
	NodeID    string
	Cluster   string
	Metadata  map[string]any // node metadata (Istio's NAME, NAMESPACE, CLUSTER_ID, LABELS, ...)
	SDSSocket string
	XDSSocket string
	// CredentialSocket, when set (a router), gets the static cluster
	// CredentialCluster: the gateway credential SDS server.
	CredentialSocket string
	AdminAddr        string // host:port
	StatsAddr        string // host:port of the Prometheus listener; "" for none
}

// Node is the pod as Istio's agent describes it to Envoy and the control plane.
type Node struct {
	Type           string // sidecar or router
	IPs            []string
	Pod, Namespace string
	DNSDomain      string
	ServiceAccount string
	ClusterID      string
	MeshID         string
	Labels         map[string]string
	RouterMode     string // a router's ROUTER_MODE (standard, sni-dnat)
}

// ID is Istio's node id: type~ip~pod.namespace~domain.
func (n Node) ID() string {
	ip := ""
	if len(n.IPs) > 0 {
		ip = n.IPs[0]
	}
	return n.Type + "~" + ip + "~" + n.Pod + "." + n.Namespace + "~" + n.DNSDomain
}

// ServiceCluster is Istio's node cluster: the app (or app.kubernetes.io/name)
// label, dot namespace; istio-proxy when the pod has neither.
func (n Node) ServiceCluster() string {
	for _, k := range []string{"app.kubernetes.io/name", "app"} {
		if v := n.Labels[k]; v != "" {
			return v + "." + n.Namespace
		}
	}
	return "istio-proxy"
}

// Metadata is the node metadata, with Istio's key names.
func (n Node) Metadata() map[string]any {
	labels := map[string]any{}
	for k, v := range n.Labels {
		labels[k] = v
	}
	ips := ""
	for i, ip := range n.IPs {
		if i > 0 {
			ips += ","
		}
		ips += ip
	}
	m := map[string]any{
		"NAME": n.Pod, "POD_NAME": n.Pod, "NAMESPACE": n.Namespace, "CLUSTER_ID": n.ClusterID,
		"INSTANCE_IPS": ips, "SERVICE_ACCOUNT": n.ServiceAccount, "LABELS": labels,
	}
	if n.MeshID != "" {
		m["MESH_ID"] = n.MeshID
	}
	if app := n.Labels["app"]; app != "" {
		m["WORKLOAD_NAME"] = app
	}
	if n.Type == "router" {
		// A gateway: how it routes (Istio's ISTIO_META_ROUTER_MODE), and that its
		// credentials come from the gateway credential server, not the workload's.
		mode := n.RouterMode
		if mode == "" {
			mode = "standard"
		}
		m["ROUTER_MODE"] = mode
	}
	return m
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
	meta, err := structpb.NewStruct(p.Metadata)
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	static := &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{sds, xds}}
	if p.CredentialSocket != "" {
		cred, err := unixCluster(CredentialCluster, p.CredentialSocket)
		if err != nil {
			return nil, err
		}
		static.Clusters = append(static.Clusters, cred)
	}
	if p.StatsAddr != "" {
		l, c, err := statsListener(p.StatsAddr, host, uint32(port))
		if err != nil {
			return nil, err
		}
		static.Listeners = append(static.Listeners, l)
		static.Clusters = append(static.Clusters, c)
	}
	return &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: p.NodeID, Cluster: p.Cluster, Metadata: meta},
		Admin: &bootstrapv3.Admin{Address: socketAddress(host, uint32(port))},
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

func socketAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

// statsListener is Istio's 15090 listener: GET /stats/prometheus forwarded to the
// admin's /stats/prometheus, nothing else of the admin API exposed.
func statsListener(addr, adminHost string, adminPort uint32) (*listenerv3.Listener, *clusterv3.Cluster, error) {
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
		Address: socketAddress(host, uint32(port)),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}},
	}
	c := &clusterv3.Cluster{
		Name:                 StatsCluster,
		ConnectTimeout:       durationpb.New(250 * time.Millisecond),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: StatsCluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress(adminHost, adminPort)}}}}}}},
	}
	return l, c, nil
}

// ListenerName is the name the stats listener gets, and so the name Envoy's stats
// give it (listener.0.0.0.0_15090.*): the launcher leaves it out when counting
// the app's connections.
func ListenerName(host string, port uint32) string {
	return host + "_" + strconv.FormatUint(uint64(port), 10)
}

// Load reads a bootstrap the user wrote (CUSTOM_BOOTSTRAP), JSON in Envoy's v3 form.
func Load(path string) (*bootstrapv3.Bootstrap, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("custom bootstrap: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("custom bootstrap %s: not a v3 bootstrap: %w", path, err)
	}
	return &b, nil
}

// Render executes the Go text/template at path with p (ISTIO_BOOTSTRAP) and parses
// the result as a v3 bootstrap. The template sees .NodeID, .Cluster, .Metadata,
// .SDSSocket, .XDSSocket, .AdminAddr and .StatsAddr, and the functions host and
// port, which split a host:port ({{port .AdminAddr}}).
func Render(path string, p Params) (*bootstrapv3.Bootstrap, error) {
	t, err := template.New(filepath.Base(path)).Funcs(template.FuncMap{
		"host": func(a string) string { h, _, _ := net.SplitHostPort(a); return h },
		"port": func(a string) string { _, port, _ := net.SplitHostPort(a); return port },
	}).ParseFiles(path)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template: %w", err)
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, p); err != nil {
		return nil, fmt.Errorf("bootstrap template %s: %w", path, err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(buf.Bytes(), &b); err != nil {
		return nil, fmt.Errorf("bootstrap template %s: result is not a v3 bootstrap: %w", path, err)
	}
	return &b, nil
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
