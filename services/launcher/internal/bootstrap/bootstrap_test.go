package bootstrap

import (
	"os"
	"path/filepath"
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
