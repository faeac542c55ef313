package relay_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/pkg/nds"
	"github.com/meshagent/meshagent/pkg/outbox"
	"github.com/meshagent/meshagent/services/xds-relay/internal/proxyconfig"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/bustest"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

const testPod = "web-0"

// testPodRef is the test pod on the bus, in namespace default.
var testPodRef = events.PodRef{Namespace: "default", Name: testPod}

func testLog(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: os.Stderr})
}

// upstreamServer is a real go-control-plane ADS server: a snapshot cache for
// Envoy's types and a linear cache for Istio's ProxyConfig.
type upstreamServer struct {
	t    testing.TB
	addr string
	snap cache.SnapshotCache
	pcs  *cache.LinearCache
	nds  *cache.LinearCache // Istio's name table
	misc *cache.LinearCache // a type nobody in the relay knows (unknownType)
	// syncz answers istio.io/debug/syncz as istiod does: one ClientConfig per proxy.
	syncz *cache.LinearCache
	opts  []grpc.ServerOption
	// onOpen, if set, sees the context of every stream the upstream opens.
	onOpen func(context.Context)
	// plain serves the snapshot cache alone, with no ProxyConfig support.
	plain bool
	// noRecord stops keeping requests (benchmarks: the history would grow the heap).
	noRecord atomic.Bool

	mu       sync.Mutex
	gs       *grpc.Server
	requests []*discoveryv3.DiscoveryRequest
	deltas   []*discoveryv3.DeltaDiscoveryRequest
	md       []metadata.MD
}

func startUpstream(t testing.TB, opts ...grpc.ServerOption) *upstreamServer {
	u := newUpstream(t, "127.0.0.1:0", opts...)
	u.start()
	t.Cleanup(u.stop)
	return u
}

// newUpstream is an upstream server for addr that start starts (a late one).
func newUpstream(t testing.TB, addr string, opts ...grpc.ServerOption) *upstreamServer {
	return &upstreamServer{t: t, addr: addr, opts: opts,
		snap: cache.NewSnapshotCache(true, cache.IDHash{}, nil),
		pcs:  cache.NewLinearCache(proxyconfig.TypeURL),
		nds:  cache.NewLinearCache(nds.TypeURL), misc: cache.NewLinearCache(unknownType),
		syncz: cache.NewLinearCache(debugSyncz)}
}

func (u *upstreamServer) start() {
	u.t.Helper()
	ln, err := net.Listen("tcp", u.addr)
	if err != nil {
		u.t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return classify(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return classify(r.GetTypeUrl()) },
		Caches:        map[string]cache.Cache{"snap": u.snap, "pc": u.pcs, "nds": u.nds, "misc": u.misc, "syncz": u.syncz},
	}
	cb := xdsserver.CallbackFuncs{
		StreamOpenFunc:      func(ctx context.Context, _ int64, _ string) error { u.recordMD(ctx); return nil },
		DeltaStreamOpenFunc: func(ctx context.Context, _ int64, _ string) error { u.recordMD(ctx); return nil },
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			if u.noRecord.Load() {
				return nil
			}
			u.mu.Lock()
			u.requests = append(u.requests, r)
			u.mu.Unlock()
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			if u.noRecord.Load() {
				return nil
			}
			// A copy: go-control-plane's delta server sets the stream's node on the
			// request after this callback.
			c := proto.Clone(r).(*discoveryv3.DeltaDiscoveryRequest)
			u.mu.Lock()
			u.deltas = append(u.deltas, c)
			u.mu.Unlock()
			return nil
		},
	}
	var c cache.Cache = mux
	if u.plain {
		c = u.snap
	}
	srv := xdsserver.NewServer(context.Background(), c, cb)
	gs := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxSendMsgSize(64 << 20)}, u.opts...)...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	u.mu.Lock()
	u.gs = gs
	u.mu.Unlock()
	go func() { _ = gs.Serve(ln) }()
}

// debugSyncz is istiod's debug type for its proxies' sync status.
const debugSyncz = "istio.io/debug/syncz"

// unknownType is a type URL the relay has no handler for.
const unknownType = "type.googleapis.com/example.v1.Unknown"

func classify(typeURL string) string {
	switch typeURL {
	case proxyconfig.TypeURL:
		return "pc"
	case nds.TypeURL:
		return "nds"
	case unknownType:
		return "misc"
	case debugSyncz:
		return "syncz"
	}
	return "snap"
}

func (u *upstreamServer) recordMD(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	u.mu.Lock()
	u.md = append(u.md, md)
	onOpen := u.onOpen
	u.mu.Unlock()
	if onOpen != nil {
		onOpen(ctx)
	}
}

func (u *upstreamServer) stop() {
	u.mu.Lock()
	gs := u.gs
	u.mu.Unlock()
	gs.Stop()
}

func (u *upstreamServer) restart() { u.stop(); u.start() }

func (u *upstreamServer) setClusters(node, version string, names ...string) {
	u.t.Helper()
	var rs []types.Resource
	for _, n := range names {
		rs = append(rs, cluster(n))
	}
	u.setSnapshot(node, version, map[resource.Type][]types.Resource{resource.ClusterType: rs})
}

func (u *upstreamServer) setSnapshot(node, version string, rs map[resource.Type][]types.Resource) {
	u.t.Helper()
	s, err := cache.NewSnapshot(version, rs)
	if err != nil {
		u.t.Fatal(err)
	}
	if err := u.snap.SetSnapshot(context.Background(), node, s); err != nil {
		u.t.Fatal(err)
	}
}

// seen returns the SotW requests the upstream got that match f.
func (u *upstreamServer) seen(f func(*discoveryv3.DiscoveryRequest) bool) []*discoveryv3.DiscoveryRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []*discoveryv3.DiscoveryRequest
	for _, r := range u.requests {
		if f(r) {
			out = append(out, r)
		}
	}
	return out
}

func (u *upstreamServer) metadata() []metadata.MD {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]metadata.MD(nil), u.md...)
}

func cluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, ConnectTimeout: durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}}}
}

// relayEnv is a running relay on a real unix socket with a real embedded bus.
type relayEnv struct {
	srv    *relay.Server
	socket string
	reg    *prometheus.Registry
	dialer *upstream.Dialer
	nc     *nats.Conn
	rec    *bustest.Recorder
}

func startRelay(t testing.TB, ucfg upstream.Config, mat upstream.Material) *relayEnv {
	t.Helper()
	return startRelayWith(t, ucfg, mat)
}

// startRelayWith is startRelay with more agent-consumed handlers than ProxyConfig's.
func startRelayWith(t testing.TB, ucfg upstream.Config, mat upstream.Material, more ...relay.Handler) *relayEnv {
	t.Helper()
	ns := bustest.Server(t)
	nc := bustest.Conn(t, ns)
	js := bustest.JetStream(t, nc)
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := bus.EnsureEventStream(ctx, js, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	rec := bustest.Record(t, nc, events.EventsWildcard, events.Prefix+".pod.*.*.anchors")
	if ucfg.Mode == "" {
		ucfg.Mode = upstream.Plaintext
	}
	if ucfg.MaxMsgSize == 0 {
		ucfg.MaxMsgSize = 64 << 20
	}
	if ucfg.ConnectTimeout == 0 {
		ucfg.ConnectTimeout = 2 * time.Second
	}
	log := testLog(t)
	d, err := upstream.New(ucfg, mat, log)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pub, err := outbox.New(js, outbox.Options{Source: "xds-relay/" + testPod, Metric: relay.EventsDropped, Registry: reg, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := proxyconfig.New(testPodRef, nc, d, log)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(testkit.ShortDir(t), "XDS")
	srv, err := relay.New(relay.Config{Pod: testPodRef, Socket: socket, MaxMsgSize: 64 << 20}, d, append([]relay.Handler{pc}, more...), pub, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { _ = pub.Run(ctx); done <- struct{}{} }()
	go func() {
		if err := srv.Run(ctx); err != nil {
			t.Errorf("relay run: %v", err)
		}
		done <- struct{}{}
	}()
	t.Cleanup(func() { cancel(); <-done; <-done; d.Close() })
	select {
	case <-srv.Bound():
	case <-time.After(5 * time.Second):
		t.Fatal("relay did not bind")
	}
	return &relayEnv{srv: srv, socket: socket, reg: reg, dialer: d, nc: nc, rec: rec}
}

func dialUnix(t testing.TB, socket string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func ads(t testing.TB, socket string) discoveryv3.AggregatedDiscoveryServiceClient {
	return discoveryv3.NewAggregatedDiscoveryServiceClient(dialUnix(t, socket))
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// openCDS opens a state-of-the-world ADS stream through the relay at socket and
// sends the first request, for clusters, as node id.
func openCDS(t testing.TB, ctx context.Context, socket, id string) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	st, err := ads(t, socket).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(id), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	return st
}

// openDeltaCDS is openCDS for an incremental (delta) ADS stream.
func openDeltaCDS(t testing.TB, ctx context.Context, socket, id string) discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	t.Helper()
	st, err := ads(t, socket).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(id), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	return st
}
