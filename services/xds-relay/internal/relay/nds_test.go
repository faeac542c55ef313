package relay_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/nds"
	"github.com/meshagent/meshagent/pkg/obs/obstest"
	"github.com/meshagent/meshagent/pkg/testkit"
	"github.com/meshagent/meshagent/services/xds-relay/internal/dnsproxy"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/miekg/dns"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The relay asks for the name table itself, hands it to the DNS proxy and ACKs
// it; Envoy, on the same stream, sees only its own types.
func TestNameTableIsConsumedNotForwarded(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	if err := up.nds.UpdateResource("", nds.Message(nds.Table{
		"reviews.default.svc.cluster.local": {IPs: []string{"10.96.0.20"}, Registry: "Kubernetes", Shortname: "reviews", Namespace: "default"},
	})); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.1:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dp, err := dnsproxy.New(dnsproxy.Config{Addr: "127.0.0.1:0", ResolvConf: rc, Namespace: "default"}, nil, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	env := startRelayWith(t, upstream.Config{Address: up.addr}, nil, dp.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dp.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-dp.Bound()
	udp, _ := dp.Addrs()

	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	st := openCDS(t, sctx, env.socket, "n1")
	r1, err := st.Recv()
	if err != nil || r1.GetTypeUrl() != resource.ClusterType {
		t.Fatalf("first response: %v %v", r1.GetTypeUrl(), err)
	}
	acked := func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetTypeUrl() == nds.TypeURL && r.GetResponseNonce() != "" && r.GetErrorDetail() == nil
	}
	testkit.Eventually(t, "relay acks the name table upstream", func() bool { return len(up.seen(acked)) == 1 })
	ask := func(name string) *dns.Msg {
		c := &dns.Client{Timeout: 5 * time.Second}
		r, _, err := c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), udp.String())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := ask("reviews."); len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.96.0.20" {
		t.Fatalf("proxy answer %v", r.Answer)
	}

	// A bad table is NACKed upstream and the proxy keeps the good one.
	if err := up.nds.UpdateResource("", nds.Message(nds.Table{"reviews.default.svc.cluster.local": {IPs: []string{"not-an-ip"}}})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "relay nacks a bad name table", func() bool {
		return len(up.seen(func(r *discoveryv3.DiscoveryRequest) bool {
			return r.GetTypeUrl() == nds.TypeURL && r.GetErrorDetail().GetMessage() != ""
		})) == 1
	})
	if r := ask("reviews."); len(r.Answer) != 1 {
		t.Fatalf("after a bad table: %v", r.Answer)
	}
	if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_consumed_total", map[string]string{"type": nds.TypeURL, "result": "ack"}); v != 1 {
		t.Fatalf("consumed ack = %v", v)
	}

	// Envoy never saw the name table: its next response is the next cluster version.
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: r1.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	up.setClusters("n1", "v2", "a", "b")
	r2, err := st.Recv()
	if err != nil || r2.GetTypeUrl() != resource.ClusterType || r2.GetVersionInfo() != "v2" {
		t.Fatalf("next response to envoy: type %q version %q err %v", r2.GetTypeUrl(), r2.GetVersionInfo(), err)
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
