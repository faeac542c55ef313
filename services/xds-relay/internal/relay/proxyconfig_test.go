package relay_test

import (
	"context"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/xds-relay/internal/proxyconfig"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

func TestProxyConfigOnDeltaStream(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	anchor := testkit.NewCA(t, "delta anchor", nil, time.Now(), time.Hour).PEM()
	if err := up.pcs.UpdateResource("proxy", &meshv1alpha1.ProxyConfig{CaCertificatesPem: []string{anchor}}); err != nil {
		t.Fatal(err)
	}
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openDeltaCDS(t, ctx, env.socket, "n1")
	if r, err := st.Recv(); err != nil || r.GetTypeUrl() != resource.ClusterType {
		t.Fatalf("first delta response: %v %v", r.GetTypeUrl(), err)
	}
	testkit.Eventually(t, "trust anchors published", func() bool {
		return len(bustest.Find(env.rec, func(e events.TrustAnchors) bool { return len(e.Roots) == 1 && e.Roots[0] == anchor })) == 1
	})
	testkit.Eventually(t, "delta ack of proxyconfig upstream", func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		for _, r := range up.deltas {
			if r.GetTypeUrl() == proxyconfig.TypeURL && r.GetResponseNonce() != "" && r.GetErrorDetail() == nil {
				return true
			}
		}
		return false
	})
}

// An upstream that knows nothing of ProxyConfig (like the demo control plane, or
// any plain go-control-plane server) still relays Envoy's types.
func TestUpstreamWithoutProxyConfig(t *testing.T) {
	up := &upstreamServer{t: t, addr: "127.0.0.1:0", plain: true,
		snap: cache.NewSnapshotCache(true, cache.IDHash{}, nil), pcs: cache.NewLinearCache(proxyconfig.TypeURL)}
	up.start()
	t.Cleanup(up.stop)
	up.setClusters("n1", "v1", "a")
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openCDS(t, ctx, env.socket, "n1")
	r1, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: r1.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	up.setClusters("n1", "v2", "a", "b")
	if r2, err := st.Recv(); err != nil || r2.GetVersionInfo() != "v2" {
		t.Fatalf("second response: %v %v", r2.GetVersionInfo(), err)
	}
}
