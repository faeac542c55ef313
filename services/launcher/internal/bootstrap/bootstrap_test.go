package bootstrap

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

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
	if err := protojson.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
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
	b, err := Build(Params{NodeID: n.ID(), Cluster: n.ServiceCluster(), Metadata: n.Metadata(), SDSSocket: "/p/sds", XDSSocket: "/p/XDS",
		AdminAddr: "127.0.0.1:15000", StatsAddr: "0.0.0.0:15090"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatal(err)
	}
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
	if n := (Node{Type: "router", IPs: []string{"1.2.3.4"}, Pod: "gw", Namespace: "x", DNSDomain: "x.svc"}); n.ServiceCluster() != "istio-proxy" {
		t.Fatal(n.ServiceCluster())
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
	if err != nil || b.GetNode().GetId() != "mine" {
		t.Fatalf("Load = %v, %v", b, err)
	}
	tmpl := filepath.Join(dir, "b.tmpl")
	if err := os.WriteFile(tmpl, []byte(`{"node": {"id": "{{.NodeID}}"}, "admin": {"address": {"socket_address": {"address": "{{host .AdminAddr}}", "port_value": {{port .AdminAddr}}}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err = Render(tmpl, Params{NodeID: "sidecar~x", AdminAddr: "127.0.0.1:15000"})
	if err != nil || b.GetNode().GetId() != "sidecar~x" || b.GetAdmin().GetAddress().GetSocketAddress().GetPortValue() != 15000 {
		t.Fatalf("Render = %v, %v", b, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"nodes": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("bad bootstrap: %v", err)
	}
}

// A router's bootstrap: Istio's router node id, ROUTER_MODE metadata, and a static
// cluster on the gateway credential socket; a sidecar's has neither.
func TestRouterBootstrap(t *testing.T) {
	n := Node{Type: "router", IPs: []string{"10.0.0.9"}, Pod: "ingress-0", Namespace: "istio-system", DNSDomain: "istio-system.svc.cluster.local", RouterMode: "sni-dnat"}
	b, err := Build(Params{NodeID: n.ID(), Cluster: n.ServiceCluster(), Metadata: n.Metadata(), SDSSocket: "/p/sds.sock", XDSSocket: "/p/xds.sock",
		CredentialSocket: "/p/credential-socket", AdminAddr: "127.0.0.1:15000"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatal(err)
	}
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
	b, err = Build(Params{NodeID: side.ID(), Metadata: side.Metadata(), SDSSocket: "/p/sds.sock", XDSSocket: "/p/xds.sock", AdminAddr: "127.0.0.1:15000"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.GetNode().GetMetadata().GetFields()["ROUTER_MODE"]; ok {
		t.Fatal("a sidecar has ROUTER_MODE")
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == CredentialCluster {
			t.Fatal("a sidecar has the gateway credential cluster")
		}
	}
}
