package relay_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/obstest"
	"github.com/meshagent/meshagent/tests/testkit"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func node(id string) *corev3.Node { return &corev3.Node{Id: id, Cluster: "test"} }

func clusterNames(t *testing.T, resp *discoveryv3.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range resp.GetResources() {
		var c clusterv3.Cluster
		if err := a.UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c.GetName())
	}
	return out
}

func TestSotWVersionsAndNonces(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openCDS(t, ctx, env.socket, "n1")
	r1, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r1.GetVersionInfo() != "v1" || r1.GetNonce() == "" || r1.GetTypeUrl() != resource.ClusterType {
		t.Fatalf("first response: version %q nonce %q type %q", r1.GetVersionInfo(), r1.GetNonce(), r1.GetTypeUrl())
	}
	if got := clusterNames(t, r1); len(got) != 1 || got[0] != "a" {
		t.Fatalf("clusters = %v", got)
	}
	// ACK, then a new version reaches Envoy with a new nonce.
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: r1.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	up.setClusters("n1", "v2", "a", "b")
	r2, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r2.GetVersionInfo() != "v2" || r2.GetNonce() == r1.GetNonce() || len(clusterNames(t, r2)) != 2 {
		t.Fatalf("second response: version %q nonce %q (first %q) clusters %v", r2.GetVersionInfo(), r2.GetNonce(), r1.GetNonce(), clusterNames(t, r2))
	}
	// The ACK reached the upstream unchanged.
	testkit.Eventually(t, "ack upstream", func() bool {
		return len(up.seen(func(r *discoveryv3.DiscoveryRequest) bool {
			return r.GetTypeUrl() == resource.ClusterType && r.GetVersionInfo() == "v1" && r.GetResponseNonce() == r1.GetNonce()
		})) == 1
	})
	testkit.Eventually(t, "connected event", func() bool {
		return len(bustest.Find(env.rec, func(e events.XDSConnected) bool {
			return e.Pod == testPodRef && e.Mode == "sotw" && e.Node == "n1" && e.Upstream == up.addr
		})) == 1
	})
	if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_responses_total", map[string]string{"type": resource.ClusterType}); v != 2 {
		t.Fatalf("responses metric = %v, want 2", v)
	}
	if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_streams", map[string]string{"mode": "sotw"}); v != 1 {
		t.Fatalf("streams gauge = %v, want 1", v)
	}
	cancel()
	testkit.Eventually(t, "disconnected event", func() bool {
		return len(bustest.Find(env.rec, func(e events.XDSDisconnected) bool { return e.Reason == "downstream closed" })) == 1
	})
	testkit.Eventually(t, "gauge back to 0", func() bool {
		return obstest.Metric(t, env.reg, "meshagent_xds_relay_streams", map[string]string{"mode": "sotw"}) == 0
	})
}

func TestDeltaVersionsAndNonces(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openDeltaCDS(t, ctx, env.socket, "n1")
	r1, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r1.GetNonce() == "" || len(r1.GetResources()) != 1 || r1.GetResources()[0].GetName() != "a" || r1.GetResources()[0].GetVersion() == "" {
		t.Fatalf("first delta response: %v", r1)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r1.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	up.setClusters("n1", "v2", "b")
	r2, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r2.GetNonce() == r1.GetNonce() || len(r2.GetResources()) != 1 || r2.GetResources()[0].GetName() != "b" ||
		len(r2.GetRemovedResources()) != 1 || r2.GetRemovedResources()[0] != "a" {
		t.Fatalf("second delta response: %v", r2)
	}
	testkit.Eventually(t, "delta connected event", func() bool {
		return len(bustest.Find(env.rec, func(e events.XDSConnected) bool { return e.Mode == "delta" && e.Node == "n1" })) == 1
	})
}

func TestNackIsReportedAndForwarded(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openCDS(t, ctx, env.socket, "n1")
	r1, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	nack := &discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r1.GetNonce(),
		ErrorDetail: &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "cluster a: bad thing"}}
	if err := st.Send(nack); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "nack event", func() bool {
		return len(bustest.Find(env.rec, func(e events.XDSNack) bool {
			return e.TypeURL == resource.ClusterType && e.Nonce == r1.GetNonce() && e.ErrorDetail == "cluster a: bad thing" && e.Pod == testPodRef
		})) == 1
	})
	testkit.Eventually(t, "nack upstream", func() bool {
		return len(up.seen(func(r *discoveryv3.DiscoveryRequest) bool {
			return r.GetErrorDetail().GetMessage() == "cluster a: bad thing" && r.GetResponseNonce() == r1.GetNonce()
		})) == 1
	})
	if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_nacks_total", map[string]string{"type": resource.ClusterType}); v != 1 {
		t.Fatalf("nacks metric = %v", v)
	}
}

func TestUpstreamRestartClosesDownstream(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	client := ads(t, env.socket)
	open := func() discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
		st, err := client.StreamAggregatedResources(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node("n1"), TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := open()
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	up.restart()
	_, err := st.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("after upstream restart: err = %v, want Unavailable", err)
	}
	testkit.Eventually(t, "disconnected with upstream reason", func() bool {
		return len(bustest.Find(env.rec, func(e events.XDSDisconnected) bool { return strings.HasPrefix(e.Reason, "upstream") })) == 1
	})
	if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_upstream_terminations_total", nil); v != 1 {
		t.Fatalf("terminations = %v", v)
	}
	// Envoy reconnects: a fresh stream gets the config again.
	st2 := open()
	r, err := st2.Recv()
	if err != nil || r.GetVersionInfo() != "v1" {
		t.Fatalf("after reconnect: %v %v", r, err)
	}
}

func TestUpstreamNeverAnswers(t *testing.T) {
	t.Run("never speaks http2", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
			}
		}()
		env := startRelay(t, upstream.Config{Address: ln.Addr().String(), ConnectTimeout: 300 * time.Millisecond}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		st, err := ads(t, env.socket).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&discoveryv3.DiscoveryRequest{Node: node("n1"), TypeUrl: resource.ClusterType})
		_, err = st.Recv()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("err = %v, want Unavailable", err)
		}
		if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_upstream_connect_failures_total", nil) +
			obstest.Metric(t, env.reg, "meshagent_xds_relay_upstream_terminations_total", nil); v != 1 {
			t.Fatalf("failures+terminations = %v, want 1", v)
		}
	})
	t.Run("never responds", func(t *testing.T) {
		// A real ADS server with no snapshot for the node: requests are accepted, nothing comes back.
		up := startUpstream(t)
		env := startRelay(t, upstream.Config{Address: up.addr}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		openCDS(t, ctx, env.socket, "nobody")
		testkit.Eventually(t, "request upstream", func() bool {
			return len(up.seen(func(r *discoveryv3.DiscoveryRequest) bool {
				return r.GetNode().GetId() == "nobody" && r.GetTypeUrl() == resource.ClusterType
			})) == 1
		})
		if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_streams", map[string]string{"mode": "sotw"}); v != 1 {
			t.Fatalf("streams = %v, want 1 while waiting", v)
		}
		cancel()
		testkit.Eventually(t, "stream released", func() bool {
			return obstest.Metric(t, env.reg, "meshagent_xds_relay_streams", map[string]string{"mode": "sotw"}) == 0
		})
	})
}

func TestConcurrentStreams(t *testing.T) {
	const n = 500
	up := startUpstream(t)
	for i := range 10 {
		up.setClusters(fmt.Sprintf("n%d", i), "v1", "a", "b")
	}
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	client := ads(t, env.socket)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, n)
	for i := range n {
		go func() {
			st, err := client.StreamAggregatedResources(ctx)
			if err != nil {
				errc <- err
				return
			}
			if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(fmt.Sprintf("n%d", i%10)), TypeUrl: resource.ClusterType}); err != nil {
				errc <- err
				return
			}
			r, err := st.Recv()
			if err == nil && (r.GetVersionInfo() != "v1" || len(r.GetResources()) != 2) {
				err = fmt.Errorf("stream %d: version %q, %d resources", i, r.GetVersionInfo(), len(r.GetResources()))
			}
			errc <- err
		}()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_streams", map[string]string{"mode": "sotw"}); v != n {
		t.Fatalf("live streams = %v, want %d", v, n)
	}
	cancel()
	testkit.Eventually(t, "all streams released", func() bool {
		return obstest.Metric(t, env.reg, "meshagent_xds_relay_streams", map[string]string{"mode": "sotw"}) == 0
	})
}

func TestLargeResponse(t *testing.T) {
	up := startUpstream(t)
	big := strings.Repeat("x", 1<<20)
	var names []string
	for i := range 10 {
		names = append(names, fmt.Sprintf("c%d-%s", i, big))
	}
	up.setClusters("n1", "v1", names...)
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := openCDS(t, ctx, env.socket, "n1")
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if size := proto.Size(r); size < 10<<20 || len(r.GetResources()) != 10 {
		t.Fatalf("got %d bytes, %d resources; want >= 10 MiB and 10", size, len(r.GetResources()))
	}
	// Forwarded from the buffers it arrived in (one per HTTP/2 frame), byte for byte.
	got := clusterNames(t, r)
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Fatalf("the clusters changed on the way (%d names)", len(got))
	}
	if v := obstest.Metric(t, env.reg, "meshagent_xds_relay_response_bytes_total", map[string]string{"type": resource.ClusterType}); v < 10<<20 {
		t.Fatalf("response bytes metric = %v", v)
	}
}

func TestTokenAndMetadataReachUpstream(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	tokenFile := testkit.ShortDir(t) + "/token"
	writeFile(t, tokenFile, "tok-1\n")
	env := startRelay(t, upstream.Config{Address: up.addr, TokenFile: tokenFile, ClusterID: "cluster-7",
		Headers: map[string]string{"foo": "bar"}}, nil)
	client := ads(t, env.socket)
	connect := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := client.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node("n1"), TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	connect()
	writeFile(t, tokenFile, "tok-2")
	connect()
	md := up.metadata()
	if len(md) != 2 {
		t.Fatalf("upstream saw %d streams, want 2", len(md))
	}
	for i, want := range []string{"Bearer tok-1", "Bearer tok-2"} {
		if got := md[i].Get("authorization"); len(got) != 1 || got[0] != want {
			t.Errorf("stream %d authorization = %v, want %q", i, got, want)
		}
		if got := md[i].Get("clusterid"); len(got) != 1 || got[0] != "cluster-7" {
			t.Errorf("stream %d clusterid = %v", i, got)
		}
		if got := md[i].Get("foo"); len(got) != 1 || got[0] != "bar" {
			t.Errorf("stream %d foo = %v", i, got)
		}
	}
	// A missing token file fails the stream, clearly, without reaching upstream.
	writeFile(t, tokenFile, "")
	st, err := client.StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: node("n1"), TypeUrl: resource.ClusterType})
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty token: err = %v", err)
	}
	if len(up.metadata()) != 2 {
		t.Fatal("a stream without a token reached the upstream")
	}
}

// TestAckIsReportedOncePerVersion: Envoy's ACK of a new version is on the bus
// (xds.acked, for meshctl proxy-status); its re-ACK of the same version is not;
// the next version's ACK is; a NACK is not an ACK.
func TestAckIsReportedOncePerVersion(t *testing.T) {
	up := startUpstream(t)
	up.setClusters("n1", "v1", "a")
	env := startRelay(t, upstream.Config{Address: up.addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := openCDS(t, ctx, env.socket, "n1")
	r1, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	ack := func(r *discoveryv3.DiscoveryResponse) {
		t.Helper()
		if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	acks := func(version string) int {
		return len(bustest.Find(env.rec, func(e events.XDSAcked) bool {
			return e.TypeURL == resource.ClusterType && e.Version == version && e.Pod == testPodRef && e.Stream != ""
		}))
	}
	ack(r1)
	ack(r1) // the same version again
	testkit.Eventually(t, "ack event", func() bool { return acks(r1.GetVersionInfo()) == 1 })
	up.setClusters("n1", "v2", "b")
	r2, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: r1.GetVersionInfo(), ResponseNonce: r2.GetNonce(),
		ErrorDetail: &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "no"}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "nack event", func() bool {
		return len(bustest.Find(env.rec, func(e events.XDSNack) bool { return e.Nonce == r2.GetNonce() })) == 1
	})
	ack(r2)
	testkit.Eventually(t, "the next version's ack", func() bool { return acks(r2.GetVersionInfo()) == 1 })
	if n := acks(r1.GetVersionInfo()); n != 1 {
		t.Fatalf("version %s acked %d times on the bus", r1.GetVersionInfo(), n)
	}
}
