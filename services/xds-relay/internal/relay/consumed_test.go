package relay_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/nds"
	"github.com/meshagent/meshagent/services/xds-relay/internal/dnsproxy"
	"github.com/meshagent/meshagent/services/xds-relay/internal/proxyconfig"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/miekg/dns"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// consumedType is one xDS type the relay consumes for the agent instead of
// forwarding it to Envoy: what the upstream serves of it, good and bad, and how
// to see that the good one took effect (and still holds after the bad one).
type consumedType struct {
	name    string
	typeURL string
	cache   func(*upstreamServer) *cache.LinearCache
	key     string
	good    types.Resource
	bad     types.Resource
	// start returns the handlers the relay needs beyond ProxyConfig's (always on)
	// and a check of the good resource's effect.
	start func(t *testing.T) ([]relay.Handler, func(env *relayEnv) bool)
}

func consumedTypes(t *testing.T) []consumedType {
	anchor := testkit.NewCA(t, "extra anchor", nil, time.Now(), time.Hour).PEM()
	return []consumedType{
		{
			name: "ProxyConfig's trust anchors go to sds-edge", typeURL: proxyconfig.TypeURL, key: "proxy",
			cache: func(u *upstreamServer) *cache.LinearCache { return u.pcs },
			good:  &meshv1alpha1.ProxyConfig{CaCertificatesPem: []string{anchor}},
			bad:   &meshv1alpha1.ProxyConfig{CaCertificatesPem: []string{"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"}},
			start: func(*testing.T) ([]relay.Handler, func(*relayEnv) bool) {
				return nil, func(env *relayEnv) bool {
					// Exactly one: the bad config must publish nothing.
					return len(bustest.Find(env.rec, func(e events.TrustAnchors) bool {
						return e.Pod == testPodRef && len(e.Roots) == 1 && e.Roots[0] == anchor
					})) == 1 && len(bustest.Find(env.rec, func(events.TrustAnchors) bool { return true })) == 1
				}
			},
		},
		{
			name: "NameTable goes to the DNS proxy", typeURL: nds.TypeURL,
			cache: func(u *upstreamServer) *cache.LinearCache { return u.nds },
			good: nds.Message(nds.Table{
				"reviews.default.svc.cluster.local": {IPs: []string{"10.96.0.20"}, Registry: "Kubernetes", Shortname: "reviews", Namespace: "default"},
			}),
			bad: nds.Message(nds.Table{"reviews.default.svc.cluster.local": {IPs: []string{"not-an-ip"}}}),
			start: func(t *testing.T) ([]relay.Handler, func(*relayEnv) bool) {
				rc := filepath.Join(t.TempDir(), "resolv.conf")
				if err := os.WriteFile(rc, []byte("nameserver 127.0.0.1:1\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				dp, err := dnsproxy.New(dnsproxy.Config{Addr: "127.0.0.1:0", ResolvConf: rc, Namespace: "default"}, nil, testLog(t))
				if err != nil {
					t.Fatal(err)
				}
				testkit.Background(t, dp.Run)
				<-dp.Bound()
				udp, _ := dp.Addrs()
				return []relay.Handler{dp.Handler()}, func(*relayEnv) bool {
					c := &dns.Client{Timeout: 5 * time.Second}
					r, _, err := c.Exchange(new(dns.Msg).SetQuestion("reviews.", dns.TypeA), udp.String())
					return err == nil && len(r.Answer) == 1 && r.Answer[0].(*dns.A).A.String() == "10.96.0.20"
				}
			},
		},
	}
}

// Each agent-consumed type: the relay asks for it after Envoy's first request,
// applies it and ACKs it upstream, NACKs a bad one and keeps the good one, counts
// both, and Envoy, on the same stream, never sees it.
func TestAgentTypesAreConsumedNotForwarded(t *testing.T) {
	for _, tc := range consumedTypes(t) {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t)
			up.setClusters("n1", "v1", "a")
			if err := tc.cache(up).UpdateResource(tc.key, tc.good); err != nil {
				t.Fatal(err)
			}
			handlers, applied := tc.start(t)
			env := startRelayWith(t, upstream.Config{Address: up.addr}, nil, handlers...)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			st := openCDS(t, ctx, env.socket, "n1")
			r1, err := st.Recv()
			if err != nil || r1.GetTypeUrl() != resource.ClusterType {
				t.Fatalf("first response: %v %v", r1.GetTypeUrl(), err)
			}
			testkit.Eventually(t, "the good resource applied", func() bool { return applied(env) })
			acked := func(r *discoveryv3.DiscoveryRequest) bool {
				return r.GetTypeUrl() == tc.typeURL && r.GetResponseNonce() != "" && r.GetErrorDetail() == nil
			}
			testkit.Eventually(t, "the relay acks it upstream", func() bool { return len(up.seen(acked)) == 1 })

			// A bad one is NACKed upstream and changes nothing.
			if err := tc.cache(up).UpdateResource(tc.key, tc.bad); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, "the relay nacks a bad one", func() bool {
				return len(up.seen(func(r *discoveryv3.DiscoveryRequest) bool {
					return r.GetTypeUrl() == tc.typeURL && r.GetErrorDetail().GetMessage() != ""
				})) == 1
			})
			if !applied(env) {
				t.Fatal("the bad resource undid the good one")
			}
			for result, want := range map[string]float64{"ack": 1, "nack": 1} {
				if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_consumed_total", map[string]string{"type": tc.typeURL, "result": result}); v != want {
					t.Fatalf("consumed %s = %v, want %v", result, v, want)
				}
			}

			// Envoy never saw it: its next response is the next cluster version.
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: r1.GetNonce()}); err != nil {
				t.Fatal(err)
			}
			up.setClusters("n1", "v2", "a", "b")
			r2, err := st.Recv()
			if err != nil || r2.GetTypeUrl() != resource.ClusterType || r2.GetVersionInfo() != "v2" {
				t.Fatalf("next response to envoy: type %q version %q err %v", r2.GetTypeUrl(), r2.GetVersionInfo(), err)
			}
		})
	}
}

// A type the relay has no handler for passes to Envoy byte for byte, and Envoy's
// ACK of it goes upstream.
func TestUnknownTypeForwardedUntouched(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	res := wrapperspb.String("opaque payload")
	if err := up.misc.UpdateResource("thing", res); err != nil {
		t.Fatal(err)
	}
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openCDS(t, ctx, env.socket, "n1")
	if r, err := st.Recv(); err != nil || r.GetTypeUrl() != resource.ClusterType {
		t.Fatalf("first response: %v %v", r.GetTypeUrl(), err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: unknownType, ResourceNames: []string{"thing"}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil || r.GetTypeUrl() != unknownType || len(r.GetResources()) != 1 {
		t.Fatalf("unknown type response: %v resources %d err %v", r.GetTypeUrl(), len(r.GetResources()), err)
	}
	want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(res)
	if a := r.GetResources()[0]; a.GetTypeUrl() != unknownType || string(a.GetValue()) != string(want) {
		t.Fatalf("resource changed on the way: %v %q", a.GetTypeUrl(), a.GetValue())
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: unknownType, ResourceNames: []string{"thing"},
		VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "envoy's ack reaches upstream", func() bool {
		return len(up.seen(func(q *discoveryv3.DiscoveryRequest) bool {
			return q.GetTypeUrl() == unknownType && q.GetResponseNonce() == r.GetNonce()
		})) == 1
	})
	if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_consumed_total", map[string]string{"type": unknownType}); v != 0 {
		t.Fatalf("the relay consumed the unknown type: %v", v)
	}
}
