// Package bootstrap writes Envoy's bootstrap as Istio's agent writes envoy-rev.json:
// the node (id and metadata), an SDS cluster on sds-edge's socket and an ADS cluster
// on xds-relay's socket (both HTTP/2 over unix sockets), the admin listener on
// loopback, and a Prometheus stats listener; or the user's own bootstrap, or a
// template rendered with the same parameters, instead.
//
// The bootstrap is written as JSON in Envoy's v3 form (snake_case, as Istio's
// template), from plain maps: linking go-control-plane's generated bootstrap
// types would cost the launcher ~5 MB of code pages and ~2 MB of heap at init
// (docs/benchmarks.md, "Per-pod memory"). The tests parse what it writes with
// those types, compare it with the same bootstrap built from them, and run
// Envoy's validation on it. A user's bootstrap or template result is checked to
// be a JSON object whose top-level fields are Bootstrap's; Envoy checks the rest
// when it starts, as it does under Istio's agent.
package bootstrap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
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
	// Meta is the pod's ISTIO_META_* by name without the prefix: node metadata
	// as strings, as Istio's agent passes them on, under the keys set from the
	// fields above (which come from flags and env alike), except WORKLOAD_NAME,
	// which otherwise is only guessed from the app label.
	Meta map[string]string
	// ProxyConfig is Istio's PROXY_CONFIG as a JSON object, the PROXY_CONFIG
	// node metadata (nil: none). istiod reads the proxy's ProxyConfig there, and
	// its xDS debug answers (istio.io/debug/syncz) list only proxies that have one.
	ProxyConfig json.RawMessage
}

// ID is Istio's node id: type~ip~pod.namespace~domain.
func (n Node) ID() string {
	ip := ""
	if len(n.IPs) > 0 {
		ip = n.IPs[0]
	}
	return n.Type + "~" + ip + "~" + n.Pod + "." + n.Namespace + "~" + n.DNSDomain
}

// ServiceCluster is Istio's node cluster for its default service cluster
// (pkg/bootstrap serviceClusterOrDefault): the app label (app, then
// app.kubernetes.io/name, then service.istio.io/canonical-name) dot namespace,
// else the workload name (ISTIO_META_WORKLOAD_NAME) dot namespace, else
// istio-proxy dot namespace.
func (n Node) ServiceCluster() string {
	name := ""
	for _, k := range []string{"app", "app.kubernetes.io/name", "service.istio.io/canonical-name"} {
		if v, ok := n.Labels[k]; ok {
			name = v
			break
		}
	}
	if name == "" {
		name = n.Meta["WORKLOAD_NAME"]
	}
	if name == "" {
		name = "istio-proxy"
	}
	if n.Namespace == "" {
		return name
	}
	return name + "." + n.Namespace
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
	if app := n.Labels["app"]; app != "" && n.Meta["WORKLOAD_NAME"] == "" {
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
	var pc map[string]any
	if json.Unmarshal(n.ProxyConfig, &pc) == nil && pc != nil {
		m["PROXY_CONFIG"] = pc
	}
	for k, v := range n.Meta {
		if _, set := m[k]; !set {
			m[k] = v
		}
	}
	if v, _ := m["ISTIO_VERSION"].(string); v == "" {
		m["ISTIO_VERSION"] = IstioVersion
	}
	return m
}

// IstioVersion is the node metadata ISTIO_VERSION when ISTIO_META_ISTIO_VERSION
// does not set one: the Istio release whose agent the pod roles follow, the
// istio.io/api version meshagent builds against (a test keeps them in step).
// pilot-agent sends its own Istio version there, and istiod shapes the
// configuration it generates by it (features gated on a proxy's version) and
// shows it (/debug/syncz, istioctl proxy-status); with none, istiod logs that
// the version is missing and takes the proxy for the newest release. meshagent's
// own version is not an Istio version and would be read as one.
const IstioVersion = "1.31.1"

// Bootstrap is an Envoy v3 bootstrap as JSON values.
type Bootstrap map[string]any

// object is a JSON object of the bootstrap.
type object = map[string]any

// NodeID is the bootstrap's node id, "" when it has none.
func (b Bootstrap) NodeID() string {
	node, _ := b["node"].(map[string]any)
	id, _ := node["id"].(string)
	return id
}

// Build returns the bootstrap.
func Build(p Params) (Bootstrap, error) {
	host, portS, err := net.SplitHostPort(p.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("admin address %q: %w", p.AdminAddr, err)
	}
	port, err := strconv.ParseUint(portS, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("admin port %q: %w", portS, err)
	}
	if host == "" {
		return nil, fmt.Errorf("admin address %q: no host", p.AdminAddr)
	}
	for name, socket := range map[string]string{SDSCluster: p.SDSSocket, XDSCluster: p.XDSSocket} {
		if socket == "" {
			return nil, fmt.Errorf("cluster %s: no socket path", name)
		}
	}
	clusters := []any{unixCluster(SDSCluster, p.SDSSocket), unixCluster(XDSCluster, p.XDSSocket)}
	if p.CredentialSocket != "" {
		clusters = append(clusters, unixCluster(CredentialCluster, p.CredentialSocket))
	}
	static := object{"clusters": clusters}
	if p.StatsAddr != "" {
		l, c, err := statsListener(p.StatsAddr, host, port)
		if err != nil {
			return nil, err
		}
		static["listeners"] = []any{l}
		static["clusters"] = append(clusters, c)
	}
	node := object{"id": p.NodeID, "metadata": object{}}
	if p.Cluster != "" {
		node["cluster"] = p.Cluster
	}
	if p.Metadata != nil {
		node["metadata"] = p.Metadata
	}
	ads := func() object { return object{"ads": object{}, "resource_api_version": "V3"} }
	return Bootstrap{
		"node":  node,
		"admin": object{"address": socketAddress(host, port)},
		"dynamic_resources": object{
			"ads_config": object{"api_type": "GRPC", "transport_api_version": "V3",
				"grpc_services": []any{object{"envoy_grpc": object{"cluster_name": XDSCluster}}}},
			"lds_config": ads(),
			"cds_config": ads(),
		},
		"static_resources": static,
	}, nil
}

func socketAddress(host string, port uint64) object {
	return object{"socket_address": object{"address": host, "port_value": port}}
}

// staticCluster is a STATIC cluster of one endpoint at address.
func staticCluster(name, timeout string, address object) object {
	return object{"name": name, "type": "STATIC", "connect_timeout": timeout,
		"load_assignment": object{"cluster_name": name, "endpoints": []any{
			object{"lb_endpoints": []any{object{"endpoint": object{"address": address}}}}}}}
}

// unixCluster is a cluster of HTTP/2 (gRPC) over the unix socket at path.
func unixCluster(name, path string) object {
	c := staticCluster(name, "1s", object{"pipe": object{"path": path}})
	c["typed_extension_protocol_options"] = object{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": object{
		"@type":                "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
		"explicit_http_config": object{"http2_protocol_options": object{}}}}
	return c
}

// statsListener is Istio's 15090 listener: GET /stats/prometheus forwarded to the
// admin's /stats/prometheus, nothing else of the admin API exposed.
func statsListener(addr, adminHost string, adminPort uint64) (listener, cluster object, err error) {
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
	route := object{
		"match": object{"prefix": "/stats/prometheus",
			"headers": []any{object{"name": ":method", "string_match": object{"exact": "GET"}}}},
		"route": object{"cluster": StatsCluster},
	}
	hcm := object{
		"@type":       "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"stat_prefix": "stats",
		"route_config": object{"virtual_hosts": []any{
			object{"name": "backend", "domains": []any{"*"}, "routes": []any{route}}}},
		"http_filters": []any{object{"name": "envoy.filters.http.router",
			"typed_config": object{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}},
	}
	listener = object{
		"name":    ListenerName(host, uint32(port)),
		"address": socketAddress(host, port),
		"filter_chains": []any{object{"filters": []any{
			object{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}}}},
	}
	return listener, staticCluster(StatsCluster, "0.250s", socketAddress(adminHost, adminPort)), nil
}

// ListenerName is the name the stats listener gets, and so the name Envoy's stats
// give it (listener.0.0.0.0_15090.*): the launcher leaves it out when counting
// the app's connections.
func ListenerName(host string, port uint32) string {
	return host + "_" + strconv.FormatUint(uint64(port), 10)
}

// Load reads a bootstrap the user wrote (CUSTOM_BOOTSTRAP), JSON in Envoy's v3 form.
func Load(path string) (Bootstrap, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("custom bootstrap: %w", err)
	}
	b, err := readBootstrap(data)
	if err != nil {
		return nil, fmt.Errorf("custom bootstrap %s: not a v3 bootstrap: %w", path, err)
	}
	return b, nil
}

// Render executes the Go template at path with p (ISTIO_BOOTSTRAP; template.go
// says how) and parses the result as a v3 bootstrap. The template sees .NodeID, .Cluster, .Metadata,
// .SDSSocket, .XDSSocket, .AdminAddr and .StatsAddr, and the functions host and
// port, which split a host:port ({{port .AdminAddr}}).
func Render(path string, p Params) (Bootstrap, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template: %w", err)
	}
	out, err := renderTemplate(filepath.Base(path), string(text), p)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template %s: %w", path, err)
	}
	b, err := readBootstrap(out)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template %s: result is not a v3 bootstrap: %w", path, err)
	}
	return b, nil
}

// readBootstrap reads a bootstrap: one JSON object whose fields are all Bootstrap's.
func readBootstrap(data []byte) (Bootstrap, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber() // numbers are written back as they came
	var b Bootstrap
	if err := d.Decode(&b); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("more than one JSON value")
	}
	if b == nil {
		return nil, errors.New("not a JSON object")
	}
	var unknown []string
	for k := range b {
		if !bootstrapFields[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("unknown field %s", strings.Join(unknown, ", "))
	}
	return b, nil
}

// bootstrapFields are the fields of envoy.config.bootstrap.v3.Bootstrap, as
// protobuf's JSON mapping accepts them (the proto name and its lowerCamelCase).
// A test checks them against the generated type.
var bootstrapFields = func() map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Fields(`node node_context_params static_resources dynamic_resources cluster_manager
		hds_config flags_path stats_sinks deferred_stat_options stats_config stats_flush_interval stats_flush_on_admin
		watchdog watchdogs tracing layered_runtime admin overload_manager enable_dispatcher_stats header_prefix
		stats_server_version_override use_tcp_for_dns_lookups dns_resolution_config typed_dns_resolver_config
		bootstrap_extensions fatal_actions config_sources default_config_source default_socket_interface
		certificate_provider_instances inline_headers perf_tracing_file_path default_regex_engine
		xds_delegate_extension xds_config_tracker_extension listener_manager application_log_config
		grpc_async_client_manager_config memory_allocator_manager stats_eviction_interval enable_worker_cpu_affinity`) {
		m[f] = true
		m[camel(f)] = true
	}
	return m
}()

// camel is protobuf's JSON name of a snake_case field name.
func camel(s string) string {
	parts := strings.Split(s, "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

// Write writes b as JSON to path atomically (temp file + rename).
func Write(path string, b Bootstrap) error {
	data, err := json.MarshalIndent(b, "", "  ")
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
