//go:build istio

package main

// The pod's debug tap (xds-relay, Istio's PROXY_XDS_DEBUG_VIA_AGENT on 15004)
// against Istio's real istiod: run from TestIstiodAsTheDiscoveryServer, whose pod
// it asks.

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/meshagent/meshagent/tests/istiotest"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
)

// tapSyncz asks the tap at addr for istio.io/debug/syncz over gRPC, as
// istioctl asked Istio's tap: one request on a fresh stream.
func tapSyncz(t *testing.T, addr string) *discoveryv3.DiscoveryResponse {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatalf("debug tap: %v", err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "istio.io/debug/syncz"}); err != nil {
		t.Fatalf("debug tap: %v", err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("debug tap: istio.io/debug/syncz: %v", err)
	}
	return resp
}

// tapJSON reads the tap's HTTP answer: protojson's field names, each resource
// in protojson or, when the relay does not link its type (or one inside it), as
// its type URL and base64 bytes.
func tapJSON(t *testing.T, body string) *discoveryv3.DiscoveryResponse {
	t.Helper()
	var in struct {
		VersionInfo string            `json:"versionInfo"`
		Resources   []json.RawMessage `json:"resources"`
		TypeURL     string            `json:"typeUrl"`
		Nonce       string            `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(body), &in); err != nil {
		t.Fatalf("debug tap answer: %v\n%.2000s", err, body)
	}
	out := &discoveryv3.DiscoveryResponse{VersionInfo: in.VersionInfo, TypeUrl: in.TypeURL, Nonce: in.Nonce}
	for _, raw := range in.Resources {
		var a anypb.Any
		if protojson.Unmarshal(raw, &a) != nil {
			var plain struct {
				TypeURL string `json:"typeUrl"`
				Value   []byte `json:"value"`
			}
			if err := json.Unmarshal(raw, &plain); err != nil || plain.TypeURL == "" {
				t.Fatalf("debug tap answer: a resource neither protojson nor plain: %.500s", raw)
			}
			a = anypb.Any{TypeUrl: plain.TypeURL, Value: plain.Value}
		}
		out.Resources = append(out.Resources, &a)
	}
	return out
}

// configStatus is the ClientConfig's status of one type URL ("" when absent).
func configStatus(c *statusv3.ClientConfig, typeURL string) string {
	for _, x := range c.GetGenericXdsConfigs() {
		if x.GetTypeUrl() == typeURL {
			return x.GetConfigStatus().String()
		}
	}
	return ""
}

// checkDebugTap asks the pod's debug tap, which asks istiod on the pod's own ADS
// stream, and compares with istiod's own debug port (proxy: istiod's id of the
// pod, pod.namespace):
//   - istio.io/debug/config_dump?resourceName=<proxy> over HTTP: istiod finds the
//     pod's connection and dumps its clusters, the Service's (webCluster) among
//     them, as its own /debug/config_dump?proxyID=<proxy> does;
//   - istio.io/debug/syncz over gRPC and again over HTTP (istiod answers every
//     debug question; go-control-plane ignores a repeat): istiod's answer, scoped
//     by the pod's identity to proxies of the pod's namespace, each one istiod's
//     /debug/syncz lists. It names this pod, in istiod's cluster, with its
//     clusters and listeners SYNCED as istiod's /debug/syncz has them
//     acknowledged: istiod lists there only proxies whose node metadata holds a
//     PROXY_CONFIG (pilot/pkg/xds/statusgen.go, isProxy), which the launcher puts
//     there as pilot-agent does.
func checkDebugTap(t *testing.T, d *istiotest.Istiod, tapAddr, proxy, ns, webCluster string) {
	t.Helper()
	code, body := testkit.HTTPGetWithin("http://"+tapAddr+"/debug/config_dump?resourceName="+proxy, 30*time.Second)
	if code != http.StatusOK {
		t.Fatalf("debug tap /debug/config_dump: %d %s", code, body)
	}
	dump := tapJSON(t, body)
	var clusters []string
	for _, a := range dump.GetResources() {
		var cd adminv3.ClustersConfigDump
		if a.UnmarshalTo(&cd) != nil {
			continue
		}
		for _, c := range cd.GetDynamicActiveClusters() {
			var cl clusterv3.Cluster
			if c.GetCluster().UnmarshalTo(&cl) == nil {
				clusters = append(clusters, cl.GetName())
			}
		}
	}
	ownCode, ownBody := testkit.HTTPGetWithin("http://"+d.HTTPAddr+"/debug/config_dump?proxyID="+proxy, 10*time.Second)
	if ownCode != http.StatusOK || !strings.Contains(ownBody, webCluster) {
		t.Fatalf("istiod's /debug/config_dump?proxyID=%s: %d, without %s", proxy, ownCode, webCluster)
	}
	if !slices.Contains(clusters, webCluster) {
		t.Fatalf("the tap's config_dump of %s (%d resources, %d dynamic clusters) lacks %s, which istiod's own /debug/config_dump has",
			proxy, len(dump.GetResources()), len(clusters), webCluster)
	}
	t.Logf("debug tap istio.io/debug/config_dump: %d resources, %d dynamic clusters, %s among them as in istiod's own",
		len(dump.GetResources()), len(clusters), webCluster)

	own := map[string]string{} // istiod's /debug/syncz: proxy id -> its namespace
	var mineOwn istiotest.SyncStatus
	for _, s := range d.Syncz(t) {
		own[s.ProxyID] = s.ProxyID[strings.LastIndexByte(s.ProxyID, '.')+1:]
		if s.ProxyID == proxy {
			mineOwn = s
		}
	}
	if !mineOwn.InSync() {
		t.Fatalf("istiod's /debug/syncz: %s not in sync", mineOwn)
	}
	overHTTP := func() *discoveryv3.DiscoveryResponse {
		code, body := testkit.HTTPGetWithin("http://"+tapAddr+"/debug/syncz", 30*time.Second)
		if code != http.StatusOK {
			t.Fatalf("debug tap /debug/syncz: %d %.2000s", code, body)
		}
		return tapJSON(t, body)
	}
	for form, resp := range map[string]*discoveryv3.DiscoveryResponse{"grpc": tapSyncz(t, tapAddr), "http": overHTTP()} {
		if resp.GetTypeUrl() != "istio.io/debug/syncz" || resp.GetVersionInfo() == "" || resp.GetNonce() == "" {
			t.Fatalf("debug tap syncz over %s: %v, want istiod's answer (its push version and nonce)", form, resp)
		}
		var mine *statusv3.ClientConfig
		for _, a := range resp.GetResources() {
			var c statusv3.ClientConfig
			if err := a.UnmarshalTo(&c); err != nil || c.GetNode().GetMetadata().GetFields()["NAMESPACE"].GetStringValue() != ns || own[c.GetNode().GetId()] != ns {
				t.Errorf("debug tap syncz over %s holds %s (namespace %q), not a proxy of %s istiod's /debug/syncz lists (%v)",
					form, c.GetNode().GetId(), c.GetNode().GetMetadata().GetFields()["NAMESPACE"].GetStringValue(), ns, err)
			}
			if c.GetNode().GetId() == proxy {
				mine = &c
			}
		}
		if mine == nil {
			t.Fatalf("debug tap syncz over %s does not name %s, which istiod's /debug/syncz shows in sync: %v", form, proxy, resp)
		}
		cds := configStatus(mine, "type.googleapis.com/envoy.config.cluster.v3.Cluster")
		lds := configStatus(mine, "type.googleapis.com/envoy.config.listener.v3.Listener")
		if cds != "SYNCED" || lds != "SYNCED" || mine.GetNode().GetMetadata().GetFields()["CLUSTER_ID"].GetStringValue() != mineOwn.ClusterID {
			t.Errorf("debug tap syncz over %s: %s clusters %s, listeners %s, cluster %q; istiod's /debug/syncz: %s (cluster %q)",
				form, proxy, cds, lds, mine.GetNode().GetMetadata().GetFields()["CLUSTER_ID"].GetStringValue(), mineOwn, mineOwn.ClusterID)
		}
		t.Logf("debug tap istio.io/debug/syncz over %s: istiod version %s, %d proxies (istiod's /debug/syncz: %d)",
			form, resp.GetVersionInfo(), len(resp.GetResources()), len(own))
	}
}
