package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/meshagent/meshagent/services/xds-relay/internal/debugtap"
	"github.com/meshagent/meshagent/services/xds-relay/internal/relay"
	"github.com/meshagent/meshagent/services/xds-relay/internal/upstream"
	"github.com/meshagent/meshagent/tests/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// startTap serves the debug tap over srv on a free loopback port.
func startTap(t *testing.T, srv *relay.Server, httpTimeout, grpcTimeout time.Duration) string {
	t.Helper()
	tap, err := debugtap.New(debugtap.Config{Addr: "127.0.0.1:0", HTTPTimeout: httpTimeout, GRPCTimeout: grpcTimeout}, srv, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Background(t, tap.Run)
	testkit.Eventually(t, "the debug tap listening", func() bool { return tap.Ready() == nil })
	return tap.Addr().String()
}

// askTap asks the tap at addr over gRPC, as Istio's tap was asked: one
// state-of-the-world request on a fresh stream.
func askTap(t *testing.T, addr string, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
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
		return nil, err
	}
	if err := st.Send(req); err != nil {
		return nil, err
	}
	return st.Recv()
}

// envoyStream is one Envoy stream through the relay, either mode: recv returns
// the type URL and resource names of its next response.
type envoyStream struct {
	recv func() (string, []string, error)
}

func openEnvoy(t *testing.T, ctx context.Context, mode, socket, id string) envoyStream {
	if mode == "delta" {
		st := openDeltaCDS(t, ctx, socket, id)
		return envoyStream{recv: func() (string, []string, error) {
			r, err := st.Recv()
			if err != nil {
				return "", nil, err
			}
			var names []string
			for _, res := range r.GetResources() {
				names = append(names, res.GetName())
			}
			_ = st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})
			return r.GetTypeUrl(), names, nil
		}}
	}
	st := openCDS(t, ctx, socket, id)
	return envoyStream{recv: func() (string, []string, error) {
		r, err := st.Recv()
		if err != nil {
			return "", nil, err
		}
		var names []string
		for _, a := range r.GetResources() {
			var c clusterv3.Cluster
			if a.UnmarshalTo(&c) == nil {
				names = append(names, c.GetName())
			}
		}
		_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
		return r.GetTypeUrl(), names, nil
	}}
}

// TestDebugTapAsksOnEnvoysStream: the tap asks the real go-control-plane
// upstream on Envoy's own ADS stream (each mode) and returns its answer, over
// gRPC and HTTP; the answer never reaches Envoy; with no Envoy stream, or when the
// upstream does not answer, the tap says which.
func TestDebugTapAsksOnEnvoysStream(t *testing.T) {
	for _, mode := range []string{"sotw", "delta"} {
		t.Run(mode, func(t *testing.T) {
			const proxy = "web-0.default"
			u := startUpstream(t)
			env := startRelay(t, upstream.Config{Address: u.addr}, nil)
			u.setClusters(proxy, "1", "a")
			u.syncz.UpdateResource(proxy, &statusv3.ClientConfig{Node: &corev3.Node{Id: proxy}})
			tap := startTap(t, env.srv, 0, 0)
			// A second tap that waits little, for the question nobody answers.
			impatient := startTap(t, env.srv, 300*time.Millisecond, 300*time.Millisecond)

			// No Envoy stream yet: nothing to ask on.
			if code, body := testkit.HTTPGet("http://" + tap + "/debug/syncz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "Envoy is not connected") {
				t.Fatalf("before Envoy: %d %q, want 503 saying Envoy is not connected", code, body)
			}
			if _, err := askTap(t, tap, &discoveryv3.DiscoveryRequest{TypeUrl: debugSyncz}); status.Code(err) != codes.Unavailable {
				t.Fatalf("before Envoy over gRPC: %v, want Unavailable", err)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			envoy := openEnvoy(t, ctx, mode, env.socket, proxy)
			if typ, names, err := envoy.recv(); err != nil || typ != resource.ClusterType || !slices.Equal(names, []string{"a"}) {
				t.Fatalf("Envoy's first response: %s %v %v", typ, names, err)
			}

			resp, err := askTap(t, tap, &discoveryv3.DiscoveryRequest{TypeUrl: debugSyncz})
			if err != nil {
				t.Fatalf("asking over gRPC: %v", err)
			}
			// go-control-plane's linear cache labels each resource with the cache's
			// type URL (istiod: the message's), so the value is decoded as what it is.
			var cc statusv3.ClientConfig
			if resp.GetTypeUrl() != debugSyncz || len(resp.GetResources()) != 1 ||
				proto.Unmarshal(resp.GetResources()[0].GetValue(), &cc) != nil || cc.GetNode().GetId() != proxy {
				t.Fatalf("the tap's answer: %v, want the upstream's ClientConfig of %s", resp, proxy)
			}

			// The answer went to the tap alone: Envoy's next response is the next clusters.
			u.setClusters(proxy, "2", "b")
			if typ, names, err := envoy.recv(); err != nil || typ != resource.ClusterType || !slices.Equal(names, []string{"b"}) {
				t.Fatalf("Envoy's next response: %s %v %v, want clusters [b]", typ, names, err)
			}

			// A debug type the upstream does not serve: go-control-plane's snapshot
			// cache never answers it in state of the world (the tap says so), and
			// answers it with no resources in delta.
			code, body := testkit.HTTPGet("http://" + impatient + "/debug/unserved")
			if mode == "sotw" && (code != http.StatusGatewayTimeout || !strings.Contains(body, "did not answer istio.io/debug/unserved in time")) {
				t.Fatalf("unanswered: %d %q, want 504", code, body)
			}
			var empty struct {
				TypeURL   string            `json:"typeUrl"`
				Resources []json.RawMessage `json:"resources"`
			}
			if mode == "delta" && (code != http.StatusOK || json.Unmarshal([]byte(body), &empty) != nil ||
				empty.TypeURL != "istio.io/debug/unserved" || len(empty.Resources) != 0) {
				t.Fatalf("unserved in delta: %d %q, want an empty answer", code, body)
			}

			// Envoy reconnects: the newest stream is asked, over HTTP this time.
			envoy2 := openEnvoy(t, ctx, mode, env.socket, proxy)
			if _, _, err := envoy2.recv(); err != nil {
				t.Fatal(err)
			}
			// A resource type URL no message has: the plain JSON form, values in base64.
			code, body = testkit.HTTPGet("http://" + tap + "/debug/syncz")
			var plain struct {
				TypeURL   string `json:"typeUrl"`
				Resources []struct {
					TypeURL string `json:"typeUrl"`
					Value   []byte `json:"value"`
				} `json:"resources"`
			}
			if code != http.StatusOK || json.Unmarshal([]byte(body), &plain) != nil || plain.TypeURL != debugSyncz || len(plain.Resources) != 1 ||
				proto.Unmarshal(plain.Resources[0].Value, &cc) != nil || cc.GetNode().GetId() != proxy {
				t.Fatalf("over HTTP: %d %s", code, body)
			}

			// The upstream goes away, Envoy's streams end with it, and the tap says so.
			u.stop()
			testkit.Eventually(t, "the tap saying Envoy is not connected", func() bool {
				code, body := testkit.HTTPGet("http://" + tap + "/debug/syncz")
				return code == http.StatusServiceUnavailable && strings.Contains(body, "Envoy is not connected")
			})
		})
	}
}

// TestDebugTapRefusesWhatIsNotADebugQuestion: other type URLs, the bare
// istio.io/debug type (istiod ends the whole ADS stream when it refuses one), the
// delta form and other HTTP paths and methods get a clear error, and nothing of
// theirs reaches the upstream; a debug question after them does.
func TestDebugTapRefusesWhatIsNotADebugQuestion(t *testing.T) {
	const proxy = "web-0.default"
	u := startUpstream(t)
	env := startRelay(t, upstream.Config{Address: u.addr}, nil)
	u.setClusters(proxy, "1", "a")
	u.syncz.UpdateResource(proxy, &statusv3.ClientConfig{Node: &corev3.Node{Id: proxy}})
	tap := startTap(t, env.srv, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	envoy := openEnvoy(t, ctx, "sotw", env.socket, proxy)
	if _, _, err := envoy.recv(); err != nil {
		t.Fatal(err)
	}

	for _, typ := range []string{resource.ClusterType, "istio.io/debug", "istio.io/debug/", "syncz", ""} {
		_, err := askTap(t, tap, &discoveryv3.DiscoveryRequest{TypeUrl: typ})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "want istio.io/debug/<name>") {
			t.Errorf("type %q: %v, want InvalidArgument naming istio.io/debug/<name>", typ, err)
		}
	}
	cc, err := grpc.NewClient(tap, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	dst, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err == nil {
		_, err = dst.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("delta: %v, want Unimplemented", err)
	}
	for path, want := range map[string]int{"/debug": http.StatusBadRequest, "/debug/": http.StatusBadRequest,
		"/debug/a/b": http.StatusBadRequest, "/other": http.StatusNotFound} {
		if code, body := testkit.HTTPGet("http://" + tap + path); code != want {
			t.Errorf("GET %s: %d %q, want %d", path, code, body, want)
		}
	}
	resp, err := http.Post("http://"+tap+"/debug/syncz", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", resp.StatusCode)
	}

	if _, err := askTap(t, tap, &discoveryv3.DiscoveryRequest{TypeUrl: debugSyncz}); err != nil {
		t.Fatalf("a debug question after the refusals: %v", err)
	}
	got := u.seen(func(r *discoveryv3.DiscoveryRequest) bool {
		return strings.HasPrefix(r.GetTypeUrl(), "istio.io/debug") || r.GetTypeUrl() == "syncz"
	})
	if len(got) != 1 || got[0].GetTypeUrl() != debugSyncz {
		t.Fatalf("the upstream saw %v, want the one debug question", got)
	}
	// Envoy's two (its request and its ACK, which may still be on its way), and
	// none of the tap's.
	clusters := func() int {
		return len(u.seen(func(r *discoveryv3.DiscoveryRequest) bool { return r.GetTypeUrl() == resource.ClusterType }))
	}
	testkit.Eventually(t, "Envoy's cluster request and ACK upstream", func() bool { return clusters() >= 2 })
	if n := clusters(); n != 2 {
		t.Fatalf("the upstream saw %d cluster requests, want Envoy's two", n)
	}
}
