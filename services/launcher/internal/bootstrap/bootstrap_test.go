package bootstrap

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// envoy is b as Envoy reads it: parsed with the generated types, unknown fields
// refused, and checked with Envoy's own validation.
func envoy(t *testing.T, b Bootstrap) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var out bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(data, &out); err != nil {
		t.Fatalf("not a v3 bootstrap: %v\n%s", err, data)
	}
	if err := out.ValidateAll(); err != nil {
		t.Fatalf("envoy's validation: %v", err)
	}
	return &out
}

// What Build writes is, field for field, the bootstrap the generated types build.
func TestBuildIsTheGeneratedBootstrap(t *testing.T) {
	n := Node{Type: "sidecar", IPs: []string{"10.0.0.7"}, Pod: "web-0", Namespace: "shop", DNSDomain: "shop.svc.cluster.local",
		ServiceAccount: "web", ClusterID: "Kubernetes", Labels: map[string]string{"app": "web"},
		ProxyConfig: json.RawMessage(`{"discoveryAddress":"istiod.istio-system.svc:15012","proxyMetadata":{"A":"b"}}`)}
	gw := Node{Type: "router", IPs: []string{"10.0.0.9"}, Pod: "gw-0", Namespace: "istio-system", DNSDomain: "istio-system.svc.cluster.local"}
	for name, p := range map[string]Params{
		"sidecar": {NodeID: n.ID(), Cluster: n.ServiceCluster(), Metadata: n.Metadata(), SDSSocket: "/p/sds", XDSSocket: "/p/XDS",
			AdminAddr: "127.0.0.1:15000", StatsAddr: "0.0.0.0:15090"},
		"router": {NodeID: gw.ID(), Cluster: gw.ServiceCluster(), Metadata: gw.Metadata(), SDSSocket: "/p/sds", XDSSocket: "/p/XDS",
			CredentialSocket: "/p/credential-socket", AdminAddr: "[::1]:15000", StatsAddr: ":15090"},
		"bare": {NodeID: "n", SDSSocket: "/s", XDSSocket: "/x", AdminAddr: "127.0.0.1:1"},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := Build(p)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "envoy.json")
			if err := Write(path, b); err != nil {
				t.Fatal(err)
			}
			back, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			want, err := reference(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := envoy(t, back); !proto.Equal(got, want) {
				t.Fatalf("wrote\n%v\nthe generated types build\n%v", got, want)
			}
			if back.NodeID() != p.NodeID {
				t.Fatalf("node id %q", back.NodeID())
			}
			// PROXY_CONFIG is node metadata as pilot-agent puts it: an object.
			md := envoy(t, back).GetNode().GetMetadata().GetFields()
			if addr := md["PROXY_CONFIG"].GetStructValue().GetFields()["discoveryAddress"].GetStringValue(); (name == "sidecar") != (addr == "istiod.istio-system.svc:15012") {
				t.Fatalf("PROXY_CONFIG metadata: %v", md["PROXY_CONFIG"])
			}
		})
	}
}

// Bad parameters are refused, as Envoy's validation refused them.
func TestBuildRejectsWhatEnvoyRejects(t *testing.T) {
	good := Params{NodeID: "n", SDSSocket: "/s", XDSSocket: "/x", AdminAddr: "127.0.0.1:15000", StatsAddr: "0.0.0.0:15090"}
	for name, change := range map[string]func(*Params){
		"no sds socket":  func(p *Params) { p.SDSSocket = "" },
		"no xds socket":  func(p *Params) { p.XDSSocket = "" },
		"admin port":     func(p *Params) { p.AdminAddr = "127.0.0.1:70000" },
		"admin host":     func(p *Params) { p.AdminAddr = ":15000" },
		"stats port":     func(p *Params) { p.StatsAddr = "0.0.0.0:http" },
		"admin not addr": func(p *Params) { p.AdminAddr = "nope" },
	} {
		p := good
		change(&p)
		if _, err := Build(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if b, err := reference(p); err == nil && b.ValidateAll() == nil {
			t.Errorf("%s: the generated types and Envoy's validation accept it", name)
		}
	}
}

// The fields a user's bootstrap may have are exactly Bootstrap's.
func TestBootstrapFieldsAreTheGeneratedOnes(t *testing.T) {
	fs := (&bootstrapv3.Bootstrap{}).ProtoReflect().Descriptor().Fields()
	want := map[string]bool{}
	for i := 0; i < fs.Len(); i++ {
		want[string(fs.Get(i).Name())], want[fs.Get(i).JSONName()] = true, true
	}
	var missing, extra []string
	for k := range want {
		if !bootstrapFields[k] {
			missing = append(missing, k)
		}
	}
	for k := range bootstrapFields {
		if !want[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing)+len(extra) > 0 {
		t.Fatalf("bootstrapFields lacks %v and has %v, which Bootstrap does not", missing, extra)
	}
}

func TestBuildWritesValidBootstrapPointingAtSockets(t *testing.T) {
	b, err := Build(Params{NodeID: "sidecar~web-0", Cluster: "web", SDSSocket: "/p/sds.sock", XDSSocket: "/p/XDS", AdminAddr: "127.0.0.1:15000"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "etc", "envoy.json")
	if err := Write(path, b); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(data, &back); err != nil || back.ValidateAll() != nil {
		t.Fatal(err, back.ValidateAll())
	}
	pipes := map[string]string{}
	for _, c := range back.GetStaticResources().GetClusters() {
		ep := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint()
		pipes[c.GetName()] = ep.GetAddress().GetPipe().GetPath()
	}
	if pipes[SDSCluster] != "/p/sds.sock" || pipes[XDSCluster] != "/p/XDS" {
		t.Fatalf("clusters point at %v", pipes)
	}
	if back.GetDynamicResources().GetAdsConfig().GetApiType() != corev3.ApiConfigSource_GRPC {
		t.Fatal("ADS is not gRPC")
	}
}

func TestBuildRejectsBadAdmin(t *testing.T) {
	if _, err := Build(Params{NodeID: "n", AdminAddr: "nope"}); err == nil {
		t.Fatal("bad admin address accepted")
	}
}

// The node is described as Istio's agent describes it, and a Prometheus listener
// forwards /stats/prometheus to the admin.
func TestNodeAndStatsListener(t *testing.T) {
	n := Node{Type: "sidecar", IPs: []string{"10.0.0.7", "fd00::7"}, Pod: "web-0", Namespace: "shop", DNSDomain: "shop.svc.cluster.local",
		ServiceAccount: "web", ClusterID: "Kubernetes", MeshID: "mesh1", Labels: map[string]string{"app": "web", "version": "v1"}}
	if n.ID() != "sidecar~10.0.0.7~web-0.shop~shop.svc.cluster.local" || n.ServiceCluster() != "web.shop" {
		t.Fatalf("id %s cluster %s", n.ID(), n.ServiceCluster())
	}
	built, err := Build(Params{NodeID: n.ID(), Cluster: n.ServiceCluster(), Metadata: n.Metadata(), SDSSocket: "/p/sds", XDSSocket: "/p/XDS",
		AdminAddr: "127.0.0.1:15000", StatsAddr: "0.0.0.0:15090"})
	if err != nil {
		t.Fatal(err)
	}
	b := envoy(t, built)
	md := b.GetNode().GetMetadata().GetFields()
	if md["NAMESPACE"].GetStringValue() != "shop" || md["INSTANCE_IPS"].GetStringValue() != "10.0.0.7,fd00::7" ||
		md["CLUSTER_ID"].GetStringValue() != "Kubernetes" || md["MESH_ID"].GetStringValue() != "mesh1" ||
		md["LABELS"].GetStructValue().GetFields()["version"].GetStringValue() != "v1" || md["SERVICE_ACCOUNT"].GetStringValue() != "web" {
		t.Fatalf("metadata %v", md)
	}
	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 || ls[0].GetName() != "0.0.0.0_15090" || ls[0].GetAddress().GetSocketAddress().GetPortValue() != 15090 {
		t.Fatalf("listeners %v", ls)
	}
	var stats bool
	for _, c := range b.GetStaticResources().GetClusters() {
		stats = stats || c.GetName() == StatsCluster
	}
	if !stats {
		t.Fatal("no prometheus_stats cluster")
	}
}

// TestServiceClusterAsPilotAgent: the node's cluster as pilot-agent names it for
// its default service cluster, checked against a real pilot-agent (istio/istio
// 86c9f01fd73): app label dot namespace ("web.shop"), else the workload name,
// else istio-proxy dot namespace.
func TestServiceClusterAsPilotAgent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		meta   map[string]string
		want   string
	}{
		{"app first", map[string]string{"app": "web", "app.kubernetes.io/name": "k8s"}, nil, "web.shop"},
		{"then app.kubernetes.io/name", map[string]string{"app.kubernetes.io/name": "k8s", "service.istio.io/canonical-name": "c"}, nil, "k8s.shop"},
		{"then the canonical name", map[string]string{"service.istio.io/canonical-name": "c"}, nil, "c.shop"},
		{"then the workload name", map[string]string{"version": "v1"}, map[string]string{"WORKLOAD_NAME": "wl"}, "wl.shop"},
		{"else istio-proxy", nil, nil, "istio-proxy.shop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := Node{Type: "sidecar", Pod: "web-0", Namespace: "shop", Labels: tc.labels, Meta: tc.meta}
			if got := n.ServiceCluster(); got != tc.want {
				t.Fatalf("cluster %q, pilot-agent's %q", got, tc.want)
			}
		})
	}
}

// The user's own bootstrap is used as is; a template is rendered with the params;
// anything not a v3 bootstrap is refused with the file named.
func TestCustomBootstrapAndTemplate(t *testing.T) {
	dir := t.TempDir()
	custom := filepath.Join(dir, "custom.json")
	if err := os.WriteFile(custom, []byte(`{"node": {"id": "mine"}, "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9901}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := Load(custom)
	if err != nil || b.NodeID() != "mine" {
		t.Fatalf("Load = %v, %v", b, err)
	}
	tmpl := filepath.Join(dir, "b.tmpl")
	if err := os.WriteFile(tmpl, []byte(`{"node": {"id": "{{.NodeID}}"}, "admin": {"address": {"socket_address": {"address": "{{host .AdminAddr}}", "port_value": {{port .AdminAddr}}}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err = Render(tmpl, Params{NodeID: "sidecar~x", AdminAddr: "127.0.0.1:15000"})
	if err != nil || b.NodeID() != "sidecar~x" || envoy(t, b).GetAdmin().GetAddress().GetSocketAddress().GetPortValue() != 15000 {
		t.Fatalf("Render = %v, %v", b, err)
	}
	// Written back, a user's bootstrap is what the user wrote (numbers included).
	out := filepath.Join(dir, "out.json")
	if err := Write(out, b); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(out); !strings.Contains(string(data), `"port_value": 15000`) {
		t.Fatalf("written as %s", data)
	}
	for content, want := range map[string]string{
		`{"nodes": 1}`:                      "unknown field nodes",
		`{"node": {"id": "a"}} {"node": 1}`: "more than one JSON value",
		`[1]`:                               "cannot unmarshal array",
		`null`:                              "not a JSON object",
		`{"node": `:                         "unexpected EOF",
	} {
		bad := filepath.Join(dir, "bad.json")
		if err := os.WriteFile(bad, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), want) {
			t.Errorf("bootstrap %s: %v, want %q", content, err, want)
		}
		var ref bootstrapv3.Bootstrap
		if protojson.Unmarshal([]byte(content), &ref) == nil {
			t.Errorf("bootstrap %s: the generated types accept it", content)
		}
	}
}

// A router's bootstrap: Istio's router node id, ROUTER_MODE metadata, and a static
// cluster on the gateway credential socket; a sidecar's has neither.
func TestRouterBootstrap(t *testing.T) {
	n := Node{Type: "router", IPs: []string{"10.0.0.9"}, Pod: "ingress-0", Namespace: "istio-system", DNSDomain: "istio-system.svc.cluster.local", RouterMode: "sni-dnat"}
	built, err := Build(Params{NodeID: n.ID(), Cluster: n.ServiceCluster(), Metadata: n.Metadata(), SDSSocket: "/p/sds.sock", XDSSocket: "/p/xds.sock",
		CredentialSocket: "/p/credential-socket", AdminAddr: "127.0.0.1:15000"})
	if err != nil {
		t.Fatal(err)
	}
	b := envoy(t, built)
	if id := b.GetNode().GetId(); id != "router~10.0.0.9~ingress-0.istio-system~istio-system.svc.cluster.local" {
		t.Fatalf("node id %q", id)
	}
	if m := b.GetNode().GetMetadata().GetFields()["ROUTER_MODE"].GetStringValue(); m != "sni-dnat" {
		t.Fatalf("ROUTER_MODE %q", m)
	}
	pipes := map[string]string{}
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, e := range c.GetLoadAssignment().GetEndpoints() {
			for _, lb := range e.GetLbEndpoints() {
				pipes[c.GetName()] = lb.GetEndpoint().GetAddress().GetPipe().GetPath()
			}
		}
	}
	if pipes[CredentialCluster] != "/p/credential-socket" || pipes[SDSCluster] != "/p/sds.sock" {
		t.Fatalf("clusters' sockets %v", pipes)
	}

	side := Node{Type: "sidecar", IPs: []string{"10.0.0.7"}, Pod: "web-0", Namespace: "shop", DNSDomain: "shop.svc.cluster.local"}
	if built, err = Build(Params{NodeID: side.ID(), Metadata: side.Metadata(), SDSSocket: "/p/sds.sock", XDSSocket: "/p/xds.sock", AdminAddr: "127.0.0.1:15000"}); err != nil {
		t.Fatal(err)
	}
	b = envoy(t, built)
	if _, ok := b.GetNode().GetMetadata().GetFields()["ROUTER_MODE"]; ok {
		t.Fatal("a sidecar has ROUTER_MODE")
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == CredentialCluster {
			t.Fatal("a sidecar has the gateway credential cluster")
		}
	}
}

// TestIstioVersionInTheNodeMetadata: without ISTIO_META_ISTIO_VERSION the node
// says IstioVersion, the istio.io/api release meshagent builds against (pkg's
// go.mod), in the form istiod parses (model.ParseIstioVersion: major.minor.patch);
// ISTIO_META_ISTIO_VERSION overrides it, as it does pilot-agent's own version.
func TestIstioVersionInTheNodeMetadata(t *testing.T) {
	n := Node{Type: "sidecar", IPs: []string{"10.0.0.7"}, Pod: "web-0", Namespace: "shop"}
	if got := n.Metadata()["ISTIO_VERSION"]; got != IstioVersion {
		t.Fatalf("ISTIO_VERSION %v, want %s", got, IstioVersion)
	}
	n.Meta = map[string]string{"ISTIO_VERSION": "1.30.2"}
	if got := n.Metadata()["ISTIO_VERSION"]; got != "1.30.2" {
		t.Fatalf("ISTIO_META_ISTIO_VERSION=1.30.2 gave %v", got)
	}
	if !regexp.MustCompile(`^[1-9]+\.[0-9]+\.[0-9]+$`).MatchString(IstioVersion) {
		t.Fatalf("%q is not an Istio release istiod parses", IstioVersion)
	}
	mod, err := os.ReadFile("../../../../pkg/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "\tistio.io/api v"+IstioVersion+"\n") {
		t.Fatalf("pkg/go.mod does not require istio.io/api v%s: bump IstioVersion with it", IstioVersion)
	}
}
